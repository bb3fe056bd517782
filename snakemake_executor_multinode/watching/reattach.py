"""Reattach: when a rerun adopts a SLURM job an earlier run submitted, and when it must submit anew.

Reattach exists for one situation: Snakemake was killed (or its login node died) while its job was queued or
running, or after the job ended but before that Snakemake saw it end. Then, and only then, the rerun adopts the job
instead of running it a second time. Everything else Snakemake asks to run (a deleted or outdated output, `-F`, `-R`,
`--forcerun`, a changed input, parameter or code) runs anew. The rules, in order:

1. `--multinode-no-reattach`, or a job without outputs: submit anew.
2. No earlier submission for exactly these outputs: submit anew (nothing to say).
3. A run already saw that job end and reported it (its record says `ended`): never adopted again.
4. The user forced the job (`-F`/`--forceall`, `-R`/`--forcerun`, `-f` on its target) or Snakemake found something
   changed since its outputs were made (updated input, input set, parameters, code, software stack): submit anew;
   when the old job still runs, say so (it writes the same outputs).
5. The job script differs (another command, resources or environment): submit anew.
6. SLURM still holds the job under the name of that submission (pending, running, requeued): adopt it.
7. It ended unseen, succeeded (its exit marker), its outputs are all present, and Snakemake asks for exactly that job
   again: `--rerun-incomplete` with Snakemake's incomplete marker naming that SLURM job. Adopt its result.
8. Anything else (it failed, or was cancelled, or its outputs are gone): submit anew.

Every decision about an earlier submission is said in the log, adopted or not.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from snakemake_executor_multinode.slurm.client import QueryError
from snakemake_executor_multinode.watching.job_status import JobStatus
from snakemake_executor_multinode.watching.progress import duration
from snakemake_executor_multinode.watching.registry import Registry, Submission


@dataclass(frozen=True)
class RunReason:
    """Why Snakemake runs the job in this run, as the adapter reads it from Snakemake's DAG."""

    forced: bool = False  # the user forced it: -F/--forceall, -R/--forcerun, -f on its target
    changed: tuple[str, ...] = ()  # what Snakemake found changed since the outputs were made
    incomplete_jobids: tuple[str, ...] = ()  # --rerun-incomplete: the external job ids its incomplete marker names


@dataclass(frozen=True)
class Verdict:
    """The decision about one job: the earlier submission to adopt (None: submit anew) and why, for the log."""

    adopt: Submission | None
    message: str | None = None  # None: nothing earlier to speak of
    warning: bool = False  # the old job still runs and writes the same outputs


def decide(
    rule: str,
    outputs: tuple[str, ...],
    fingerprint: str,
    reason: RunReason,
    registry: Registry,
    job_status: JobStatus,
    workdir: Path,
    enabled: bool = True,
    now: Callable[[], float] = time.time,
) -> Verdict:
    """Apply the rules of this module to the newest earlier submission for exactly `outputs`."""
    if not enabled or not outputs:
        return Verdict(None)
    earlier = registry.latest_for(outputs)
    if earlier is None or earlier.jobid is None:
        return Verdict(None)
    job = f"SLURM job {earlier.jobid} of run {earlier.run_id}"
    if earlier.ended is not None:
        when = duration(now() - earlier.ended_at) + " ago" if earlier.ended_at else "earlier"
        return Verdict(None, f"rule {rule}: not reattaching to {job}: its end ({earlier.ended}) was reported {when}")
    why_anew = _asked_anew(reason)
    state = _slurm_view(earlier, job_status)
    if why_anew is not None or earlier.fingerprint != fingerprint:
        why = why_anew or "its job script differs (command, resources or environment changed)"
        if state.alive:
            return Verdict(
                None,
                f"rule {rule}: {job} writes the same outputs and is still {state.word}, but {why}: submitting anew "
                f"(scancel {earlier.jobid} if it should stop)",
                warning=True,
            )
        return Verdict(None, f"rule {rule}: not reattaching to {job}: {why}")
    age = duration(now() - earlier.submitted_at)
    if state.alive:
        return Verdict(
            registry.adopt(earlier),
            f"rule {rule}: reattached to SLURM job {earlier.jobid} ({state.word}, submitted {age} ago by run "
            f"{earlier.run_id}); log {earlier.log}",
        )
    if not state.finished:
        return Verdict(None, f"rule {rule}: not reattaching to {job}: SLURM no longer holds it ({state.word})")
    if not state.success:
        return Verdict(None, f"rule {rule}: not reattaching to {job}: it ended unseen without success ({state.word})")
    missing = [o for o in outputs if not (workdir / o).exists()]
    if missing:
        return Verdict(None, f"rule {rule}: not reattaching to {job}: it ended unseen, but {missing[0]} is missing")
    if earlier.jobid not in reason.incomplete_jobids:
        return Verdict(
            None,
            f"rule {rule}: not reattaching to {job}: it ended unseen, but Snakemake does not ask for its result "
            "(--rerun-incomplete with the outputs it marked incomplete does)",
        )
    return Verdict(
        registry.adopt(earlier),
        f"rule {rule}: reattached to SLURM job {earlier.jobid} (finished while Snakemake was away, submitted {age} "
        f"ago by run {earlier.run_id}); log {earlier.log}",
    )


def _asked_anew(reason: RunReason) -> str | None:
    if reason.forced:
        return "the job is forced (-F/--forceall, -R/--forcerun or -f)"
    if reason.changed:
        return "Snakemake found " + ", ".join(reason.changed)
    return None


@dataclass(frozen=True)
class _Earlier:
    alive: bool  # SLURM holds the job of that submission: pending, running, requeued
    finished: bool
    success: bool
    word: str  # its state in a word, for the log


def _slurm_view(earlier: Submission, job_status: JobStatus) -> _Earlier:
    """What SLURM and the job's own exit marker say of the earlier job. A job id that SLURM gives to another job
    (a rebuilt cluster counts from 1 again) is not that job: its name, unique to the submission, must match."""
    assert earlier.jobid is not None
    job_status.expect(earlier.jobid, earlier.job_name)
    outcome = job_status.poll([earlier.jobid], force_sweep=True)[earlier.jobid]
    if outcome.finished:
        word = outcome.state.state.lower() if outcome.state else f"exit {outcome.exit_code}"
        return _Earlier(False, True, outcome.success, word)
    if outcome.state is None:
        return _Earlier(False, False, False, "it knows no such job")
    slurm_name = earlier.array or earlier.job_name  # an array's element goes by the array's name
    try:
        name, state = job_status.client.named([earlier.jobid]).get(earlier.jobid, (slurm_name, outcome.state.state))
    except QueryError:
        name, state = slurm_name, outcome.state.state
    if name != slurm_name:
        return _Earlier(False, False, False, f"its id now belongs to job {name!r}")
    return _Earlier(True, False, False, state.lower())
