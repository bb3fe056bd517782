"""Submissions are paced: a token bucket of `burst` sbatch calls, refilled at `rate` per second. A fan-out of hundreds
of jobs then reaches slurmctld as a steady stream instead of one burst (SLURM's own rate limiter, rl_enable, refuses
bursts: 30 RPCs, 2 per second by default; it is per user and counts squeue and sacct too). A refusal that still
comes is retried with backoff by the client, never duplicating a job (client.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Pace:
    def __init__(
        self,
        rate: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not rate > 0 or burst < 1:
            raise ValueError("rate must be above 0 and burst at least 1")
        self.rate, self.burst, self.clock, self.sleep = rate, burst, clock, sleep
        self.tokens = float(burst)
        self.at = clock()
        self.waited = 0.0  # seconds spent waiting for a token, for the run's summary
        self._lock = threading.Lock()

    def take(self) -> None:
        """One call's token; waits for it when the bucket is empty."""
        with self._lock:
            now = self.clock()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens < 1:
                wait = (1 - self.tokens) / self.rate
                self.sleep(wait)
                self.waited += wait
                self.tokens, self.at = 1.0, self.clock()
            self.tokens -= 1
