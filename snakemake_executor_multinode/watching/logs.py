"""`multinode logs`: a job's log as the launcher labels it (node and rank: contract/logline.py), whole or one rank's
or one node's lines; with -f followed like `tail -f` until the job ends, across a requeue's new log.

A requeued job writes each run's log beside the first (JobFiles.restart_logs): every one
is read, oldest first, so a run's last lines come out before the next run's first. Only whole lines are printed
(a line being written waits for its newline, or for the job's end). Whether the job still runs is slurmctld's word
(one squeue every STATE_S seconds); a job it no longer knows has ended.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from snakemake_executor_multinode.contract import logline
from snakemake_executor_multinode.slurm.client import QueryError, SlurmClient
from snakemake_executor_multinode.watching.registry import Submission
from snakemake_executor_multinode.watching.status_view import restart_logs

POLL_S = 0.2  # how often the logs are read while following: the delay a line may see
STATE_S = 2.0  # how often slurmctld is asked whether the job still runs


class NoLog(LookupError):
    """The job has not written its log (yet); the message names the job and the path."""


def line_filter(rank: int | None = None, node: str | None = None) -> Callable[[bytes], bool]:
    """Which lines to print: all, a global rank's, or a node's (its workers' and its torchrun's)."""
    if rank is None and node is None:
        return lambda _line: True

    def keep(line: bytes) -> bool:
        m = logline.parse(line.decode(errors="replace"))
        if m is None:
            return False
        if rank is not None:
            return m.rank == rank
        return m.node == node

    return keep


def job_logs(sub: Submission) -> list[Path]:
    """The job's logs, its first run's first; those not written yet are left out."""
    first = Path(sub.log)
    return [p for p in (first, *restart_logs(sub.log)) if p.exists()] if sub.log else []


def describe(sub: Submission) -> str:
    return f"SLURM job {sub.jobid} (rule {sub.rule})"


class Reader:
    """Prints the new whole lines of every log of the job that pass the filter, each read from where it was left."""

    def __init__(self, sub: Submission, keep: Callable[[bytes], bool], out: BinaryIO) -> None:
        self.sub, self.keep, self.out = sub, keep, out
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, bytes] = {}

    def read(self, final: bool = False) -> bool:
        """New lines out; `final`: a last line without its newline too. False while the job has no log."""
        logs = job_logs(self.sub)
        for path in logs:
            try:
                with path.open("rb") as fh:
                    fh.seek(self.offsets.get(path, 0))
                    data = fh.read()
            except OSError:
                continue
            self.offsets[path] = self.offsets.get(path, 0) + len(data)
            lines = (self.partial.get(path, b"") + data).split(b"\n")
            rest = lines.pop()
            if final and rest:
                lines.append(rest)
                rest = b""
            self.partial[path] = rest
            chosen = b"".join(line + b"\n" for line in lines if self.keep(line))
            if chosen:
                self.out.write(chosen)
        self.out.flush()
        return bool(logs)


def show(sub: Submission, keep: Callable[[bytes], bool], out: BinaryIO) -> None:
    """The job's logs as they are now; NoLog when it has written none."""
    if not Reader(sub, keep, out).read(final=True):
        raise NoLog(f"no log yet: {describe(sub)} has not written {sub.log or 'a log'}")


def follow(
    sub: Submission,
    keep: Callable[[bytes], bool],
    out: BinaryIO,
    client: SlurmClient,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Print the job's lines as they come until slurmctld says the job has ended, then its last lines. A queued
    job's log is waited for; NoLog when the job ended without one."""
    reader = Reader(sub, keep, out)
    asked = -float("inf")
    while True:
        now = time.monotonic()
        if now - asked >= STATE_S:
            asked = now
            if not running(sub, client):
                if not reader.read(final=True):
                    raise NoLog(f"no log: {describe(sub)} ended without writing {sub.log or 'a log'}")
                return
        reader.read()
        sleep(POLL_S)


def running(sub: Submission, client: SlurmClient) -> bool:
    """Queued, running or requeued, as slurmctld says; a controller that does not answer is asked again later."""
    assert sub.jobid is not None
    try:
        state = client.live([sub.jobid]).get(sub.jobid)
    except QueryError:
        return True
    return state is not None and state.active
