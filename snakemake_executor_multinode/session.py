"""One run of a workflow, as the plugin lives it: plan, submit, watch, end. The Snakemake adapter's one door.

The adapter reads each Snakemake job once (its facts) and hands over plain values; everything the plugin decides
(the plan, reattach, the submission sequence, what a status cycle reports, the failure message, cancellation) is
reached from here, so that the adapter only translates. The adapter imports nothing else of the core: the values it
passes and gets back are named in `__all__` (tests/unit/test_architecture.py holds it to that). A plan is
planning/plan.py's `plan_job`, the submission sequence submitting.py's, the watching to each job's end
watching/run_watch.py's.
"""

from __future__ import annotations

import stat
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from snakemake_executor_multinode.contract import state_files
from snakemake_executor_multinode.contract.jobfiles import StateFolders
from snakemake_executor_multinode.contract.state_files import StateError
from snakemake_executor_multinode.planning import slurm_acceptance
from snakemake_executor_multinode.planning.environment import EnvProfileError
from snakemake_executor_multinode.planning.plan import JobPlan, Planner, RuleJob, direct_command, plan_job
from snakemake_executor_multinode.planning.request import JobRequest, RequestError
from snakemake_executor_multinode.planning.settings import PlanningSettings, SettingsError, help_text
from snakemake_executor_multinode.planning.slurm_acceptance import Planned, Report
from snakemake_executor_multinode.slurm.client import RetryPolicy, SlurmClient
from snakemake_executor_multinode.slurm.pacing import Pace
from snakemake_executor_multinode.slurm.settings import SubmitSettings
from snakemake_executor_multinode.submitting import NotSubmitted, SubmitRefused, Submitter
from snakemake_executor_multinode.util.private_files import StateWriteError, no_space, state_write_error
from snakemake_executor_multinode.watching.job_status import JobStatus, Outcome
from snakemake_executor_multinode.watching.notify import Notices, Notifier, command
from snakemake_executor_multinode.watching.progress import duration
from snakemake_executor_multinode.watching.reattach import RunReason
from snakemake_executor_multinode.watching.registry import Registry, Submission
from snakemake_executor_multinode.watching.run_watch import Ended, RunWatch
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
        self.watch = RunWatch(
            self.settings, self.workdir, self.folders.state, self.client, self.registry, self.job_status,
            self.notices, self.planner.failed_on, info=self.info, warning=self.warning,
        )  # fmt: skip
        self._said: set[str] = set()
        self.slurm_version: str | None = None  # sbatch --version, asked before the first plan ("": no answer)
        self.submitter = Submitter(
            self.workdir, self.run_id, self.client, self.registry, self.job_status, self.planner.profiles,
            info=self.info, warning=self.warning, warn_once=self.warn_once, cancelled=self.watch.cancelled,
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
        """One status cycle (watching/run_watch.py)."""
        return self.watch.poll(jobs)

    def end(self, sub: Submission, outcome: Outcome) -> Ended:
        """A job's end, recorded, as Snakemake hears of it (watching/run_watch.py)."""
        return self.watch.end(sub, outcome)

    # --- the end --------------------------------------------------------------------------------------------
    def cancel(self, ids: Iterable[str], why: str = "") -> None:
        """scancel these jobs of this run (watching/run_watch.py)."""
        self.watch.cancel(ids, why)

    def cancel_all(self, ids: Iterable[str] = ()) -> None:
        """Ctrl-C: every job this run submitted, trainings asked to checkpoint first (watching/run_watch.py)."""
        self.watch.cancel_all(ids)

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
