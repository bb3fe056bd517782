"""One run of a workflow, as the plugin lives it: plan, submit, watch, end. The Snakemake adapter's one door.

The adapter reads each Snakemake job once (its facts) and hands over plain values; everything the plugin decides
(the plan, reattach, the submission sequence, what a status cycle reports, the failure message, cancellation) is
reached from here, so that the adapter only translates. The adapter imports nothing else of the core: the values it
passes and gets back are named in `__all__` (tests/unit/test_architecture.py holds it to that). A plan is
planning/plan.py's `plan_job`, the submission sequence submitting.py's.
"""

from __future__ import annotations

import stat
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from snakemake_executor_multinode.contract import node_events, state_files
from snakemake_executor_multinode.contract.jobfiles import JobFiles, StateFolders
from snakemake_executor_multinode.contract.state_files import StateError
from snakemake_executor_multinode.planning import slurm_acceptance
from snakemake_executor_multinode.planning.environment import EnvProfileError
from snakemake_executor_multinode.planning.plan import JobPlan, Planner, RuleJob, direct_command, plan_job
from snakemake_executor_multinode.planning.request import JobRequest, RequestError
from snakemake_executor_multinode.planning.settings import PlanningSettings, SettingsError, help_text
from snakemake_executor_multinode.planning.slurm_acceptance import Planned, Report
from snakemake_executor_multinode.slurm import reasons
from snakemake_executor_multinode.slurm.client import QueryError, RetryPolicy, SlurmClient, job_order
from snakemake_executor_multinode.slurm.pacing import Pace
from snakemake_executor_multinode.slurm.settings import SubmitSettings
from snakemake_executor_multinode.submitting import NotSubmitted, SubmitRefused, Submitter
from snakemake_executor_multinode.util.private_files import StateWriteError, no_space, state_write_error
from snakemake_executor_multinode.watching import cancelling, provenance
from snakemake_executor_multinode.watching.failure import failure_message
from snakemake_executor_multinode.watching.job_status import JobStatus, Outcome
from snakemake_executor_multinode.watching.notify import Notices, Notifier, command
from snakemake_executor_multinode.watching.progress import ProgressLines, duration
from snakemake_executor_multinode.watching.reattach import RunReason
from snakemake_executor_multinode.watching.registry import Registry, Submission
from snakemake_executor_multinode.watching.settings import WatchSettings
from snakemake_executor_multinode.watching.wake import Wake

# What the adapter hands over and gets back, besides the Session itself.
__all__ = [
    "EnvProfileError", "Ended", "JobPlan", "JobRequest", "NotSubmitted", "Outcome", "Planned", "Report",
    "RequestError", "RuleJob", "RunReason", "Session", "Settings", "SettingsError", "StateError", "StateWriteError",
    "SubmitRefused", "Submission", "direct_command", "duration", "help_text",
]  # fmt: skip

Say = Callable[[str], None]


@dataclass(frozen=True)
class Settings(WatchSettings, SubmitSettings, PlanningSettings):
    """The plugin's settings: each stage's own declaration, composed (fields in planning's, submitting's, then
    watching's order: the order of `snakemake --help` and docs/settings.md's table). The Snakemake adapter builds its
    `--multinode-*` options from these fields."""


@dataclass(frozen=True)
class Ended:
    """A job this run saw end, as Snakemake is told of it."""

    submission: Submission
    success: bool
    message: str = ""  # the failure's description and the failing rank's last lines; "" on success


@dataclass
class Session:
    settings: Settings
    workdir: Path
    info: Say = print
    warning: Say = print
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def __post_init__(self) -> None:
        self.folders = StateFolders(self.workdir)
        rate, burst = self.settings.submit_rate, self.settings.submit_burst
        if not rate > 0:
            raise SettingsError(f"--multinode-submit-rate={rate}: more than 0 sbatch calls per second")
        if burst < 1:
            raise SettingsError(f"--multinode-submit-burst={burst}: 1 or more sbatch calls")
        state_files.report_to(self.warning)  # what a reader leaves out of damaged state is said in the run's log
        self._check_folders()  # StateError: stops before anything is planned or submitted
        self.planner = Planner(self.settings, self.workdir, self.run_id)  # EnvProfileError, SettingsError
        self.notices = Notices(self._notifier(), self.run_id, self.folders.state)  # SettingsError: no such command
        # Owner-only: job scripts carry profile values (tokens), logs carry what the training prints.
        try:
            for private in (self.folders.root, self.workdir / self.settings.logdir):
                private.mkdir(parents=True, exist_ok=True)
                private.chmod(0o700)
            self.folders.state.mkdir(exist_ok=True, mode=0o700)
            self.registry = Registry(self.workdir, self.run_id)
        except OSError as err:
            if not no_space(err) and not isinstance(err, StateWriteError):
                raise
            raise state_write_error(
                Path(err.filename or self.folders.root), err, 0, "a folder: no data, an inode"
            ) from err
        self.client = SlurmClient(
            retry=RetryPolicy(total_seconds=self.settings.slurm_retry_seconds), notify=self.warning,
            pace=Pace(rate, burst),
        )  # fmt: skip
        self.job_status = JobStatus(self.folders.state, self.client, self.settings.sweep_seconds)
        self.wake = Wake(self.folders.state)  # a job's end starts the next status cycle (wake.py)
        self.progress = ProgressLines(self.settings.progress_seconds)  # training progress: a file read, no SLURM
        self._said: set[str] = set()
        self._cancelled: set[str] = set()  # job ids this run has cancelled
        self._told: set[str] = set()  # pending jobs whose wait was explained
        self.slurm_version: str | None = None  # sbatch --version, asked before the first plan ("": no answer)
        self.submitter = Submitter(
            self.workdir, self.run_id, self.client, self.registry, self.job_status, self.planner.profiles,
            info=self.info, warning=self.warning, warn_once=self.warn_once, cancelled=self._cancelled,
            reattach=not self.settings.no_reattach, arrays=not self.settings.no_arrays,
        )  # fmt: skip

    def _notifier(self) -> Notifier | None:
        if self.settings.notify is None:
            return None
        if not self.settings.notify_timeout > 0:
            raise SettingsError(f"--multinode-notify-timeout={self.settings.notify_timeout}: more than 0 seconds")
        return Notifier(command(self.settings.notify), self.settings.notify_timeout, self.warning)

    def _check_folders(self) -> None:
        """Every state folder that exists is a folder of this user's: the run keeps its registry, markers and code
        there and must trust what it reads back."""
        f = self.folders
        for folder in (f.root, f.runs, f.index, f.state, f.logs, f.snapshots, f.objects, f.provenance, f.reports,
                       self.workdir / self.settings.logdir):  # fmt: skip
            try:
                st = folder.lstat()
            except FileNotFoundError:
                continue
            why = None if stat.S_ISDIR(st.st_mode) else "is no folder"
            why = why or (f"is {owner}" if (owner := state_files.foreign(st.st_uid)) else None)
            if why:
                raise StateError(
                    f"{folder} {why}: the plugin keeps its registry, markers and code snapshots under {f.root} and "
                    f"trusts only its own. Nothing was submitted. Move it away (or `chown -R` it to you) and run again"
                )

    # --- planning -------------------------------------------------------------------------------------------
    def plan(self, job: RuleJob) -> JobPlan:
        """The job's plan, exactly as `multinode preview`/`check` make it (plan.plan_job); RequestError on bad input,
        also for nodes or GPUs its command would leave idle. A retry avoids the nodes its earlier attempts failed on."""
        if self.slurm_version is None:  # once: slurm_extra is read with the options of the release found
            self.slurm_version = self.client.version() or ""
            self.planner.use_release(self.slurm_version)
        return plan_job(job, self.planner)

    def launch_preview(self, plan: JobPlan, shellcmd: str | None) -> str:
        """The srun step `multinode torchrun` would start for this plan ("" when its command does not run it)."""
        # Imported here: it reads the launcher's own modules, which every Snakemake start would load for nothing
        from snakemake_executor_multinode.planning import preview

        return preview.launch_preview(plan, self.planner.profiles, shellcmd)

    def warn_once(self, warnings: Iterable[str]) -> None:
        for warning in warnings:
            if warning not in self._said:
                self._said.add(warning)
                self.warning(warning)

    def ask_slurm(self, planned: Sequence[Planned]) -> Report:
        """Ask SLURM about every planned job (one `sbatch --test-only` per resource shape, the account), submitting
        nothing; the report's warnings begin with the plans' own, each once. `multinode check` prints it."""
        found = slurm_acceptance.ask_slurm(planned, self.client, version=self.slurm_version) if planned else Report()
        own = dict.fromkeys(w for p in planned for w in p.plan.request.warnings)
        return replace(found, warnings=[*own, *found.warnings])

    def validate(self, planned: Sequence[Planned]) -> list[str]:
        """ask_slurm before the first submission of a run: its warnings are said, its errors returned."""
        found = self.ask_slurm(planned)
        self.warn_once(found.warnings)
        if found.unreachable:
            self.warning(f"SLURM could not be asked about the jobs before submitting: {found.unreachable}")
        return found.errors

    # --- submission -----------------------------------------------------------------------------------------
    def submit(self, plan: JobPlan, outputs: Sequence[str], reason: RunReason, upstream: Iterable[str] = ()) \
            -> Submission:  # fmt: skip
        """Adopt an earlier run's job (reattach.py) or submit the plan; `upstream`: the outputs of the jobs this one
        waits for (--immediate-submit: afterok on their SLURM jobs). SubmitRefused when sbatch refuses."""
        return self.submitter.submit(plan, outputs, reason, upstream)

    def submit_many(self, jobs: Sequence[tuple[JobPlan, Sequence[str], RunReason]]) -> list[Submission]:
        """Jobs Snakemake hands over together, in their order (single-node jobs of one rule that ask SLURM for the
        same go as one job array: submitting.py)."""
        return self.submitter.submit_many(jobs)

    # --- watching -------------------------------------------------------------------------------------------
    async def wait_for_news(self, seconds: float) -> None:
        """The wait between two status cycles: `seconds`, or until a job's exit marker lands or the run ends."""
        await self.wake.wait(seconds)

    def stop_waiting(self) -> None:
        """The run is ending: the status cycle's wait ends now (Snakemake waits for that thread)."""
        self.wake.poke()

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
            self._explain_wait(sub, label, outcome)
            if not outcome.finished and (line := self.progress.line(sub.jobid, label, sub.log)):
                self.info(line)
        return outcomes

    def _explain_wait(self, sub: Submission, label: str, outcome: Outcome) -> None:
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
            self.planner.failed_on(sub.outputs, bad)
        said = failure_message(sub.jobid, outcome, Path(sub.log) if sub.log else None)
        return Ended(sub, False, f"{said}; {unread}" if unread else said)

    # --- the end --------------------------------------------------------------------------------------------
    def cancel(self, ids: Iterable[str], why: str = "") -> None:
        """scancel these jobs of this run, and any of its jobs whose sbatch reply has not come (by unique name);
        each job once per run."""
        ids = set(ids)
        names = [sub.job_name for sub in self.registry.mine() if sub.jobid is None]
        ids |= set(self.client.find_by_names(names)) if names else set()
        todo = sorted(ids - self._cancelled, key=job_order)
        if todo:
            self._cancelled |= set(todo)
            self.info(f"cancelling SLURM jobs {' '.join(todo)}" + (f" ({why})" if why else ""))
            self.client.cancel(todo)

    def cancel_all(self, ids: Iterable[str] = ()) -> None:
        """Ctrl-C: every job this run submitted (the registry knows those Snakemake no longer tracks). Running
        trainings are first asked to checkpoint and given cancel_checkpoint_seconds to end (watching/cancelling.py);
        a second Ctrl-C during that wait cancels them at once."""
        ids = {*ids, *(sub.jobid for sub in self.registry.mine() if sub.jobid is not None)}
        wait_s = self.settings.cancel_checkpoint_seconds
        trainings: set[str] = set()
        if wait_s > 0 and (todo := ids - self._cancelled):
            try:
                trainings = cancelling.training(self.client, todo)
            except QueryError as err:
                self.warning(f"SLURM did not say which jobs run a training ({err}): cancelling every job at once")
        self.cancel(ids - trainings)  # with the jobs whose sbatch reply has not come
        if not trainings:
            return
        self._cancelled |= trainings
        try:
            cancelling.checkpoint_then_cancel(
                self.client, self.folders.state, trainings, wait_s, self.info, "Snakemake's Ctrl-C",
                hint=" (Ctrl-C again: at once)",
            )  # fmt: skip
        except KeyboardInterrupt:
            pass  # the second Ctrl-C: what was left is cancelled
        except QueryError as err:
            self.warning(f"asking the trainings to checkpoint failed ({err}): cancelling them at once")
            self.client.cancel(sorted(trainings, key=job_order))

    def report(self, queued: bool) -> None:
        """The efficiency report, when the setting asks for it: after the last job (its sacct record is final)."""
        if self.settings.efficiency_report:
            from snakemake_executor_multinode.watching import report  # only then: sacct's parsing and the ledger

            for line in report.end_of_run(self.workdir, self.run_id, self.client, queued=queued):
                self.info(line)

    def close(self, why: str = "") -> None:
        """The run's end (after the status cycles have stopped): its notice (`why`: how it ended, when not as usual)."""
        self.wake.close()
        self.notices.run_end(why)


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
