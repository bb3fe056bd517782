"""The run's end does not wait for Snakemake's rescheduling timer: the adapter cancels the timer that Snakemake's own
scheduler arms (JobScheduler._schedule_reevalutation, a non-daemon threading.Timer that Python waits for before the
process exits), and no other timer. The timer is armed here by Snakemake's own method: a rename there fails here."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from snakemake.scheduling.job_scheduler import JobScheduler

from snakemake_executor_plugin_multinode import cancel_rescheduling

HOUR = 3600
HANG_S = 60  # only stops a hang: a cancelled timer's thread ends at once


def test_the_schedulers_timer_is_cancelled_and_no_other():
    fake = SimpleNamespace(_open_jobs=threading.Semaphore(0))
    before = set(threading.enumerate())
    JobScheduler._schedule_reevalutation(fake, HOUR)  # type: ignore[arg-type]
    (armed,) = [t for t in set(threading.enumerate()) - before if isinstance(t, threading.Timer)]
    other = threading.Timer(HOUR, lambda: None)
    other.start()
    try:
        assert cancel_rescheduling() == 1
        armed.join(HANG_S)
        assert not armed.is_alive()  # Python's exit no longer waits an hour (a second, by Snakemake's default)
        assert other.is_alive()
        assert not fake._open_jobs.acquire(blocking=False)  # cancelled, not fired
    finally:
        other.cancel()
        armed.cancel()
