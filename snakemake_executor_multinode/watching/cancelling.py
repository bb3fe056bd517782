"""A cancel that checkpoints first: `multinode cancel --checkpoint`, and Snakemake's first Ctrl-C.

A running job whose `multinode torchrun` step runs (its step named spares.STEP_NAME, one squeue -s for all jobs) is
asked to checkpoint: its cancel marker is written (jobfiles.CANCEL_MARKER), then its steps get SIGTERM (scancel
--signal, which spares the batch shell). Each node's labeller, seeing the marker, passes the SIGTERM on as the
training's checkpoint signal (launching/nodelog.py), as it does SLURM's preemption; the training saves and exits 0,
and the job script, seeing the marker, ends the job with exit 85 instead of requeueing it: the next `snakemake`
resumes from that checkpoint. The canceller waits for those jobs to end, at most `wait_s`, then cancels whatever is
left; every other job (pending, or running no training) is cancelled at once, as a plain cancel does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from snakemake_executor_multinode.contract.jobfiles import CANCEL_MARKER, EXIT_MARKER, marker
from snakemake_executor_multinode.contract.protocol import EXIT_PREEMPTED
from snakemake_executor_multinode.launching.spares import STEP_NAME
from snakemake_executor_multinode.slurm.client import ACTIVE_STATES, QueryError, SlurmClient, job_order
from snakemake_executor_multinode.util.private_files import write_private

POLL_S = 1.0  # how often the canceller looks whether the checkpointing jobs have ended


@dataclass
class Cancelled:
    """What a cancel did: the jobs that ended after their checkpoint (exit 85), those that ended otherwise while
    asked to, and those cancelled (at once, or after the wait)."""

    checkpointed: list[str] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)


def training(client: SlurmClient, ids: Iterable[str]) -> set[str]:
    """The jobs among `ids` whose training step (`multinode torchrun`'s) runs now."""
    return {job for job, names in client.step_names(ids).items() if STEP_NAME in names}


def _exit_code(state_dir: Path, job: str) -> int | None:
    try:
        word = marker(state_dir, job, EXIT_MARKER).read_text().split()[:1]
    except OSError:
        return None
    return int(word[0]) if word and word[0].lstrip("-").isdigit() else None


def checkpoint_then_cancel(
    client: SlurmClient,
    state_dir: Path,
    trainings: Iterable[str],
    wait_s: float,
    say: Callable[[str], None],
    who: str,
    hint: str = "",
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Cancelled:
    """Ask these running trainings (`training`) to checkpoint and end, wait for them at most `wait_s` seconds, then
    cancel those still there. `who` goes into each cancel marker (the job log says who asked), `hint` after the
    line that says it waits. A KeyboardInterrupt during the wait (a second Ctrl-C) cancels what is left at once and
    is raised again."""
    asked = sorted(set(trainings), key=job_order)
    done = Cancelled()
    if not asked:
        return done
    written = _write_markers(state_dir, asked, f"{who}, {datetime.now().strftime('%H:%M:%S')}", say)
    if lost := [j for j in asked if j not in written]:
        client.cancel(lost)
        done.cancelled += lost
    if not written:
        return done
    client.signal_steps(written, "TERM")
    say(
        f"asked SLURM job(s) {' '.join(written)} to checkpoint; waiting up to {wait_s:.0f} s for them to end, then "
        f"cancelling what is left{hint}"
    )
    left = _wait_for_end(client, written, wait_s, say, clock, sleep)
    if left:
        say(f"SLURM job(s) {' '.join(left)} did not end within {wait_s:.0f} s: cancelled")
        client.cancel(left)
        done.cancelled += left
    ended = [j for j in written if j not in left]
    codes = _exit_codes(client, state_dir, ended)
    for job in ended:
        (done.checkpointed if codes.get(job) == EXIT_PREEMPTED else done.ended).append(job)
    return done


def _write_markers(state_dir: Path, asked: list[str], stamp: str, say: Callable[[str], None]) -> list[str]:
    """Each job's cancel marker, saying who asked and when; the jobs whose marker was written."""
    written = []
    for job in asked:
        try:
            write_private(marker(state_dir, job, CANCEL_MARKER), stamp + "\n")
            written.append(job)
        except OSError as err:  # no marker: the job would requeue itself after the checkpoint; cancel it now
            say(f"SLURM job {job}: {err}; cancelled without a checkpoint")
    return written


def _wait_for_end(
    client: SlurmClient,
    jobs: list[str],
    wait_s: float,
    say: Callable[[str], None],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> list[str]:
    """Waits at most `wait_s` seconds for the jobs to end; those still running. A KeyboardInterrupt cancels them at
    once and is raised again."""
    deadline = clock() + wait_s
    left = list(jobs)
    try:
        while left and clock() < deadline:
            sleep(POLL_S)
            left = _still_running(client, left)
    except KeyboardInterrupt:
        say(f"cancelling SLURM job(s) {' '.join(left)} at once (a second interrupt)")
        client.cancel(left)
        raise
    return left


def _exit_codes(client: SlurmClient, state_dir: Path, ended: list[str]) -> dict[str, int]:
    """The ended jobs' exit codes: from their exit markers, else from SLURM; a job neither knows is left out."""
    codes = {j: code for j in ended if (code := _exit_code(state_dir, j)) is not None}
    if missing := [j for j in ended if j not in codes]:  # a running Snakemake has seen the end and removed the marker
        try:
            found = client.query(missing)
            codes |= {j: int(s.exit_code.split(":")[0]) for j, s in found.items() if s.exit_code[:1].isdigit()}
        except QueryError:
            pass  # said as ended, without its exit code
    return codes


def _still_running(client: SlurmClient, jobs: list[str]) -> list[str]:
    try:
        states: Mapping[str, object] = {j: s.state for j, s in client.live(jobs).items()}
    except QueryError:
        return jobs  # asked again at the next look
    return [j for j in jobs if states.get(j) in ACTIVE_STATES]
