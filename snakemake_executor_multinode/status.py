"""Notice finished jobs within a second without loading slurmctld.

The job script writes its exit code into an exit marker (protocol.py) when it ends, so each status cycle is a few stat()
calls on the shared filesystem. A slow batched sweep (one sacct, or squeue when accounting is off) catches jobs that
die without writing a marker: cancelled, killed at the time limit, lost with their node, never started.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from .protocol import EXIT_MARKER, EXIT_PREEMPTED, FAILED_NODE_MARKER, MARKERS, marker
from .slurm import JobState, QueryError, SlurmClient


@dataclass(frozen=True)
class Outcome:
    jobid: str
    finished: bool
    success: bool = False
    exit_code: int | None = None
    state: JobState | None = None
    failed_node: str | None = None

    def describe(self) -> str:
        parts = []
        if self.state is not None:
            parts.append(f"SLURM state {self.state.state}")
            if self.state.reason and self.state.reason not in ("None", "(null)"):
                parts.append(f"reason {self.state.reason}")
            if self.state.exit_code:
                parts.append(f"exit code {self.state.exit_code}")
            if self.state.nodes and self.state.nodes not in ("None assigned", "(null)"):
                parts.append(f"nodes {self.state.nodes}")
        if self.exit_code is not None:
            parts.append(f"job script exit {self.exit_code}")
            if self.exit_code == EXIT_PREEMPTED:
                parts.append("(checkpointed before the time limit and not requeued: a rerun resumes)")
        if self.failed_node:
            parts.append(f"failing node {self.failed_node}")
        return ", ".join(parts) or "unknown"


class Tracker:
    def __init__(
        self,
        state_dir: Path,
        client: SlurmClient,
        sweep_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state_dir = state_dir
        self.client = client
        self.sweep_seconds = sweep_seconds
        self.clock = clock
        self._last_sweep = clock()
        self.query_failures = 0

    def marker(self, jobid: str) -> Path:
        return marker(self.state_dir, jobid, EXIT_MARKER)

    def _from_marker(self, jobid: str) -> Outcome | None:
        try:
            text = self.marker(jobid).read_text().strip()
        except FileNotFoundError:
            return None
        code = int(text) if text.lstrip("-").isdigit() else 1
        node = marker(self.state_dir, jobid, FAILED_NODE_MARKER)
        failed_node = node.read_text().strip() if node.exists() else None
        return Outcome(jobid, True, code == 0, code, failed_node=failed_node)

    def poll(self, jobids: Iterable[str], force_sweep: bool = False) -> dict[str, Outcome]:
        """Outcome of every job given; `finished=False` for those still pending or running."""
        ids = list(jobids)
        outcomes = {j: o for j in ids if (o := self._from_marker(j)) is not None}
        failed = [j for j, o in outcomes.items() if not o.success]
        unknown = [j for j in ids if j not in outcomes]
        due = force_sweep or self.clock() - self._last_sweep >= self.sweep_seconds
        ask = failed + (unknown if due else [])
        states: dict[str, JobState] = {}
        if ask:
            try:
                states = self.client.query(ask)
                self.query_failures = 0
                if due:
                    self._last_sweep = self.clock()
            except QueryError:
                # Asked again next cycle; a query failure never fails a job.
                self.query_failures += 1
        for jobid in failed:
            outcomes[jobid] = Outcome(
                jobid, True, False, outcomes[jobid].exit_code, states.get(jobid), outcomes[jobid].failed_node
            )
        for jobid in unknown:
            state = states.get(jobid)
            if state is None or state.active:
                outcomes[jobid] = Outcome(jobid, False, state=state)
            elif (late := self._from_marker(jobid)) is not None:  # ended between the stat and the query
                outcomes[jobid] = Outcome(jobid, True, late.success, late.exit_code, state, late.failed_node)
            else:
                outcomes[jobid] = Outcome(jobid, True, state.succeeded, None, state)
        return outcomes

    def forget(self, jobid: str) -> None:
        for suffix in MARKERS:
            marker(self.state_dir, jobid, suffix).unlink(missing_ok=True)
