"""This run's jobs, watched to their end: each status cycle's news, a job's end as Snakemake hears of it, and
cancellation (one job that can never start, or every job at Ctrl-C). session.py hands its calls here, as it hands
the submission sequence to submitting.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from snakemake_executor_multinode.contract import node_events
from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.slurm import reasons
from snakemake_executor_multinode.slurm.client import QueryError, SlurmClient, job_order
from snakemake_executor_multinode.watching import cancelling, provenance
from snakemake_executor_multinode.watching.failure import failure_message
from snakemake_executor_multinode.watching.job_status import JobStatus, Outcome
from snakemake_executor_multinode.watching.notify import Notices
from snakemake_executor_multinode.watching.progress import ProgressLines
from snakemake_executor_multinode.watching.registry import Registry, Submission
from snakemake_executor_multinode.watching.settings import WatchSettings

Say = Callable[[str], None]
FailedOn = Callable[[tuple[str, ...], Sequence[str]], None]  # (a job's outputs, the nodes a retry of them avoids)


@dataclass(frozen=True)
class Ended:
    """A job this run saw end, as Snakemake is told of it."""

    submission: Submission
    success: bool
    message: str = ""  # the failure's description and the failing rank's last lines; "" on success


@dataclass
class RunWatch:
    settings: WatchSettings
    workdir: Path
    state: Path  # the state folder: exit markers, checkpoint requests
    client: SlurmClient
    registry: Registry
    job_status: JobStatus
    notices: Notices
    failed_on: FailedOn  # the planner's: a retry of the same outputs avoids these nodes
    info: Say
    warning: Say
    cancelled: set[str] = field(default_factory=set)  # job ids this run has cancelled (the submitter adds its own)
    _told: set[str] = field(default_factory=set)  # pending jobs whose wait was explained

    def __post_init__(self) -> None:
        self.progress = ProgressLines(self.settings.progress_seconds)  # training progress: a file read, no SLURM

    def poll(self, jobs: Sequence[tuple[Submission, str]]) -> dict[str, Outcome]:
        """One status cycle over (submission, label) pairs: news of running jobs (requeues, progress) is said;
        returns every job's outcome by job id."""
        outcomes = self.job_status.poll([sub.jobid for sub, _ in jobs if sub.jobid is not None])
        self.notices.cycle([(sub, outcomes[sub.jobid]) for sub, _ in jobs if sub.jobid is not None])
        for sub, label in jobs:
            assert sub.jobid is not None
            outcome = outcomes[sub.jobid]
            if outcome.note and not outcome.finished:
                self.info(f"SLURM job {sub.jobid} ({label}): {outcome.note}")
            self.explain_wait(sub, label, outcome)
            if not outcome.finished and (line := self.progress.line(sub.jobid, label, sub.log)):
                self.info(line)
        return outcomes

    def explain_wait(self, sub: Submission, label: str, outcome: Outcome) -> None:
        """Once per job, when it has waited longer than --multinode-pending-notice-seconds: why, in plain words."""
        state = outcome.state
        if outcome.finished or state is None or state.state != "PENDING" or sub.jobid in self._told:
            return
        if state.reason in reasons.NO_REASON:
            return  # not evaluated by the scheduler yet: said once it has a reason
        if time.time() - sub.submitted_at >= self.settings.pending_notice_seconds:
            self._told.add(str(sub.jobid))
            self.info(f"SLURM job {sub.jobid} ({label}) is waiting: {reasons.say(state.reason, str(sub.jobid))}")

    def end(self, sub: Submission, outcome: Outcome) -> Ended:
        """A job's end, recorded (before Snakemake hears of it: a reported end is never adopted by a later run),
        with the failure's message; a retry of the same outputs avoids the node this attempt failed on."""
        assert sub.jobid is not None
        self.notices.end(sub, outcome)  # before forget(): it reads the job's stall marker
        self.job_status.forget(sub.jobid)
        try:
            self.registry.ended(sub, "success" if outcome.success else "failed")
        except OSError as err:  # a full state folder: said, and the job fails loudly (its end is not on record)
            ended = "succeeded" if outcome.success else f"failed ({outcome.describe()}; log: {sub.log})"
            return Ended(sub, False, f"SLURM job {sub.jobid} {ended}, but its end could not be recorded: {err}")
        if outcome.success:
            try:
                provenance.finish(
                    self.workdir, sub.job_name, JobFiles.from_log(sub.log).runs if sub.log else None,
                    {"state": "success", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
                )  # fmt: skip
            except provenance.ProvenanceError as err:  # the bookkeeping fails, loudly; the training did not
                return Ended(sub, False, f"SLURM job {sub.jobid} succeeded, but {err}")
            return Ended(sub, True)
        if outcome.state is not None and outcome.state.state == "PENDING":  # it can never start: not left queued
            self.cancel([sub.jobid], "it can never start")
        # the nodes a spare replaced are as bad as the one it failed on: a retry on them would meet the same fault
        bad, unread = replaced_nodes(sub.log)
        bad += [outcome.failed_node] if outcome.failed_node else []
        if bad:
            self.failed_on(sub.outputs, bad)
        said = failure_message(sub.jobid, outcome, Path(sub.log) if sub.log else None)
        return Ended(sub, False, f"{said}; {unread}" if unread else said)

    def cancel(self, ids: Iterable[str], why: str = "") -> None:
        """scancel these jobs of this run, and any of its jobs whose sbatch reply has not come (by unique name);
        each job once per run."""
        ids = set(ids)
        names = [sub.job_name for sub in self.registry.mine() if sub.jobid is None]
        ids |= set(self.client.find_by_names(names)) if names else set()
        todo = sorted(ids - self.cancelled, key=job_order)
        if todo:
            self.cancelled |= set(todo)
            self.info(f"cancelling SLURM jobs {' '.join(todo)}" + (f" ({why})" if why else ""))
            self.client.cancel(todo)

    def cancel_all(self, ids: Iterable[str] = ()) -> None:
        """Ctrl-C: every job this run submitted (the registry knows those Snakemake no longer tracks). Running
        trainings are first asked to checkpoint and given cancel_checkpoint_seconds to end (watching/cancelling.py);
        a second Ctrl-C during that wait cancels them at once."""
        ids = {*ids, *(sub.jobid for sub in self.registry.mine() if sub.jobid is not None)}
        wait_s = self.settings.cancel_checkpoint_seconds
        trainings: set[str] = set()
        if wait_s > 0 and (todo := ids - self.cancelled):
            try:
                trainings = cancelling.training(self.client, todo)
            except QueryError as err:
                self.warning(f"SLURM did not say which jobs run a training ({err}): cancelling every job at once")
        self.cancel(ids - trainings)  # with the jobs whose sbatch reply has not come
        if not trainings:
            return
        self.cancelled |= trainings
        try:
            cancelling.checkpoint_then_cancel(
                self.client, self.state, trainings, wait_s, self.info, "Snakemake's Ctrl-C",
                hint=" (Ctrl-C again: at once)",
            )  # fmt: skip
        except KeyboardInterrupt:
            pass  # the second Ctrl-C: what was left is cancelled
        except QueryError as err:
            self.warning(f"asking the trainings to checkpoint failed ({err}): cancelling them at once")
            self.client.cancel(sorted(trainings, key=job_order))


def replaced_nodes(log: str) -> tuple[list[str], str]:
    """The nodes the job dropped (node_events.py), for the retry to leave out, and what keeps the record from saying
    all of them ("": nothing): a record that cannot be read or is damaged is said, never read as "none"."""
    if not log:
        return [], ""
    path = JobFiles.from_log(log).replacements
    try:
        history = node_events.read(path)
    except node_events.NodeEventError as err:
        return [], f"the retry cannot leave out the nodes it dropped: {err.message}"
    nodes = [e.node for e in history.dropped]
    if history.damaged:
        lines = ", ".join(str(n) for n in history.damaged)
        return (
            nodes,
            f"the node events {path} are damaged (line {lines}): the retry leaves out only the nodes they name",
        )
    return nodes, ""
