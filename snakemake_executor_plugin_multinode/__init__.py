"""Snakemake adapter for snakemake_executor_multinode: `snakemake --executor multinode`.

Only translation lives here: a Snakemake job is read once (facts.JobFacts) and handed to the core's session
(session.py) as plain values; outcomes go back as Snakemake reports. What the plugin decides is in the core.
Importing this module stays cheap: Snakemake imports every installed executor plugin at every start.
"""

import asyncio
import threading
import typing
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface
from snakemake_interface_executor_plugins.settings import CommonSettings, ExecutorSettingsBase

from snakemake_executor_multinode.session import (
    EnvProfileError,
    JobPlan,
    NotSubmitted,
    Planned,
    RequestError,
    RuleJob,
    Session,
    Settings,
    SettingsError,
    StateError,
    StateWriteError,
    Submission,
    SubmitRefused,
    direct_command,
    help_text,
)
from snakemake_executor_plugin_multinode.facts import JobFacts, job_facts, rerun_reason


def _executor_settings() -> type[ExecutorSettingsBase]:
    """Snakemake's `--multinode-*` options, made from the core's one declaration of the settings (settings.py)."""
    hints = typing.get_type_hints(Settings)
    spec = [
        (
            f.name,
            hints[f.name],
            field(default=f.default, metadata={**f.metadata, "help": help_text(f), "env_var": True}),
        )
        for f in fields(Settings)
    ]
    return make_dataclass("ExecutorSettings", spec, bases=(ExecutorSettingsBase,))


ExecutorSettings = _executor_settings()


common_settings = CommonSettings(
    non_local_exec=True,
    implies_no_shared_fs=False,
    job_deploy_sources=False,
    pass_default_storage_provider_args=True,
    pass_default_resources_args=True,
    # Variables travel with sbatch --export=ALL, not as `export X=secret &&` on a visible command line.
    pass_envvar_declarations_to_cmd=False,
    auto_deploy_default_storage_provider=False,
    init_seconds_before_status_checks=0,
)


# Snakemake's scheduler arms a threading.Timer after every round that may start jobs (--max-jobs-per-timespan, one
# second by default), to look again once its rate limit allows; the timer is no daemon, so Python waits for the last
# one before the process can end, although the scheduler has returned (measured: benchmarks/chain_breakdown.py).
RESCHEDULING = "JobScheduler._schedule_reevalutation."  # the qualified name of the timer's function, up to <locals>


def cancel_rescheduling() -> int:
    """Cancel the scheduler's pending timers (only at the run's end: nothing is scheduled after it); how many.
    tests/unit/adapter/test_adapter_end.py arms one with Snakemake's own method, so a rename fails there."""
    timers = [t for t in threading.enumerate() if isinstance(t, threading.Timer)]
    # any callable may be a timer's function (a partial has no __qualname__): only Snakemake's own is looked at
    mine = [t for t in timers if getattr(t.function, "__qualname__", "").startswith(RESCHEDULING)]
    for timer in mine:
        timer.cancel()
    return len(mine)


class PlainError(WorkflowError):
    """An error whose message says it all: Snakemake prints it without a Python stack (which would only show the
    adapter's frames)."""

    @property  # type: ignore[override]
    def __traceback__(self) -> None:  # what Snakemake reads to print the stack; Python's own handling is untouched
        return None

    @__traceback__.setter
    def __traceback__(self, value: object) -> None:
        pass


class InputError(PlainError):
    """Bad input found before anything is submitted. Its message names rule, field, value and what is allowed."""


class StateFolderError(PlainError):
    """A file of the plugin's state (.snakemake/multinode) could not be written, a full disk above all: the message
    names the file, the bytes needed and the bytes free; nothing was submitted for the job (or it was cancelled)."""


def refused(err: SubmitRefused) -> WorkflowError:
    return StateFolderError(str(err)) if isinstance(err, NotSubmitted) else WorkflowError(str(err))


@dataclass
class KnownJobs:
    """The jobs of a run that go to SLURM, as far as they can be planned before the first submission."""

    planned: list[tuple[JobExecutorInterface, Planned]] = field(default_factory=list)
    later: list[tuple[str, str]] = field(default_factory=list)  # (rule, why it is planned only at submission)
    errors: list[str] = field(default_factory=list)  # plan errors, when collected rather than raised


class Executor(RemoteExecutor):
    # Snakemake's status thread starts before __post_init__: until the session exists, its waits are plain sleeps.
    _wait_for_news: Callable[[float], Awaitable[None]] | None = None

    def __post_init__(self) -> None:
        given = self.workflow.executor_settings or ExecutorSettings()
        self.settings = Settings(**{f.name: getattr(given, f.name) for f in fields(Settings)})
        self.workdir = Path.cwd()
        try:
            self.session = Session(self.settings, self.workdir, self.logger.info, self.logger.warning)
        except (EnvProfileError, SettingsError) as err:
            raise WorkflowError(f"multinode settings: {err}") from err
        except StateError as err:
            raise InputError(f"multinode: {err}") from None
        except StateWriteError as err:
            raise StateFolderError(f"multinode: {err}") from None
        self._wait_for_news = self.session.wait_for_news
        self._validate_planned_jobs()

    @property  # type: ignore[override]
    def next_seconds_between_status_checks(self) -> float:
        # Snakemake's status thread starts (and reads this) before __post_init__ runs: derive it from the settings,
        # never from state __post_init__ sets, or the first cycles wait Snakemake's 10 s default.
        return (self.workflow.executor_settings or ExecutorSettings()).status_seconds

    async def sleep(self) -> None:
        """Between two status cycles: the next starts as soon as a job's exit marker lands, or when the run ends,
        rather than only after --multinode-status-seconds (Snakemake's own sleep knows neither)."""
        seconds = self.next_seconds_between_status_checks
        if self._wait_for_news is None:
            await asyncio.sleep(seconds)
        else:
            await self._wait_for_news(seconds)

    # --- plan ----------------------------------------------------------------------------------
    def plan_for(self, job: JobExecutorInterface, facts: JobFacts, command: str | None = None) -> JobPlan:
        """The job's plan (request, environment, script), exactly as `multinode preview`/`check` make it."""
        rule_job = RuleJob(
            facts.name,
            facts.resources,
            self.command_for(job, facts) if command is None else command,
            threads=facts.threads,
            wildcards=facts.wildcards,
            attempt=facts.attempt,
            declared_nodes=facts.declared_nodes,
            key=f"{str(job.jobid)[:8]}.{facts.attempt}",
            keep=(*facts.outputs, *facts.logs),
            outputs=facts.outputs,
            shellcmd=facts.shellcmd,
            kind=facts.inner_snakemake_reason,
            container_image=facts.container_image,
        )
        try:
            return self.session.plan(rule_job)
        except RequestError as err:
            raise WorkflowError(str(err)) from err
        except StateWriteError as err:  # the code snapshot, frozen with the plan
            raise StateFolderError(f"rule {facts.name!r}: not submitted: {err}") from None

    def _validate_planned_jobs(self) -> None:
        """Plan every job whose resources are known now and ask SLURM about all of them at once, so that bad input
        stops the run before the first sbatch."""
        known = self.plan_known_jobs()
        if errors := self.session.validate([planned for _, planned in known.planned]):
            raise InputError("\n".join(errors))

    def slurm_jobs(self) -> Iterator[JobExecutorInterface]:
        """The jobs of this run that go to SLURM: needrun, not local, a group once as the group job."""
        dag, seen = self.workflow.dag, set()
        for level in dag.toposorted(jobs=set(dag.needrun_jobs())):  # upstream first: messages read in run order
            for job in sorted(level, key=lambda j: j.rule.name):
                unit = dag.get_job_group(job) or job
                if not job.is_local and unit not in seen:
                    seen.add(unit)
                    yield unit

    def plan_known_jobs(self, stop_at_error: bool = True) -> KnownJobs:
        """Plan each job that goes to SLURM whose resources are known now; a plan error stops (InputError) at once,
        or, with `stop_at_error` False (`multinode check`), is collected with the others."""
        from snakemake.exceptions import RuleException  # Snakemake is loaded by now; keep the import cheap

        known = KnownJobs()
        for job in self.slurm_jobs():
            try:
                facts = job_facts(job)
            except (WorkflowError, RuleException) as err:
                # A resource or params function that raises (InputFunctionException, a WorkflowError; one that only
                # needs input not made yet gives <TBD> instead) or an unknown shell placeholder (RuleException):
                # Snakemake evaluates the job again at submission and reports it there.
                known.later.append((f"group_{job.name}" if job.is_group() else job.name, str(err).strip()))
                continue
            if not facts.resources_known:
                known.later.append((facts.name, "its resources depend on input that the run makes"))
                continue
            # The inner Snakemake command is formatted at submission: formatting it now would already deploy
            # wrapper and conda sources for jobs whose inputs do not exist yet.
            inner = "snakemake (inner, formatted at submission)" if not self.runs_directly(facts) else None
            try:
                plan = self.plan_for(job, facts, command=inner)
            except WorkflowError as err:
                if stop_at_error:
                    raise InputError(str(err)) from None
                known.errors.append(str(err))
                continue
            known.planned.append((job, Planned(plan, frozenset(facts.resources))))
        return known

    # --- command -------------------------------------------------------------------------------
    def runs_directly(self, facts: JobFacts) -> bool:
        """A plain shell rule can run its formatted command without a Snakemake process inside the job."""
        return not self.settings.inner_snakemake and not facts.needs_inner_snakemake

    def command_for(self, job: JobExecutorInterface, facts: JobFacts) -> str:
        if not self.runs_directly(facts):
            return self.format_job_exec(job)
        assert facts.shellcmd is not None  # job_facts gives a reason to run Snakemake inside for jobs without one
        return direct_command(facts.shellcmd, facts.outputs, facts.logs)

    # --- submission ----------------------------------------------------------------------------
    def run_jobs(self, jobs: list[JobExecutorInterface]) -> None:
        """Jobs that are ready together: single-node jobs of one rule that ask for the same become one job array
        (session.submit_many). --immediate-submit chains each job by its own afterok: one at a time then."""
        if len(jobs) < 2 or self.workflow.remote_execution_settings.immediate_submit:
            super().run_jobs(jobs)
            return
        planned = []
        for job in jobs:
            self.run_job_pre(job)  # Snakemake's own lines about the job
            facts = job_facts(job)
            planned.append((self.plan_for(job, facts), facts.outputs, rerun_reason(job)))
        try:
            subs = self.session.submit_many(planned)
        except SubmitRefused as err:
            raise refused(err) from err
        except StateError as err:
            raise InputError(f"multinode: {err}") from None
        for job, sub in zip(jobs, subs, strict=True):
            self._submitted(job, sub)

    def run_job(self, job: JobExecutorInterface) -> None:
        facts = job_facts(job)
        plan = self.plan_for(job, facts)
        upstream = (
            [str(f) for dep in self.workflow.dag.dependencies[job] for f in dep.output]
            if self.workflow.remote_execution_settings.immediate_submit
            else []
        )
        try:
            sub = self.session.submit(plan, facts.outputs, rerun_reason(job), upstream)
        except SubmitRefused as err:
            raise refused(err) from err
        except StateError as err:
            raise InputError(f"multinode: {err}") from None
        self._submitted(job, sub)

    def _submitted(self, job: JobExecutorInterface, sub: Submission) -> None:
        aux = {"log": Path(sub.log), "script": Path(sub.script), "submission": sub}
        self.report_job_submission(SubmittedJobInfo(job, external_jobid=sub.jobid, aux=aux))

    # --- status --------------------------------------------------------------------------------
    async def check_active_jobs(self, active_jobs: list[SubmittedJobInfo]) -> AsyncGenerator[SubmittedJobInfo, None]:
        if not active_jobs:
            return
        if self.workflow.remote_execution_settings.immediate_submit:
            # Snakemake counted each job done at its submission: an outcome reported now hits a job it no longer
            # runs (a KeyError in its scheduler). SLURM's afterok chains them; `multinode status` watches them.
            return
        async with self.status_rate_limiter:
            outcomes = self.session.poll([(info.aux["submission"], info.job.name) for info in active_jobs])
        running, failed = [], False
        for info in active_jobs:
            outcome = outcomes[info.external_jobid]
            if not outcome.finished:
                running.append(info)
                yield info
                continue
            ended = self.session.end(info.aux["submission"], outcome)
            if ended.success:
                self.report_job_success(info)
            else:
                log = info.aux.get("log")
                self.report_job_error(info, msg=ended.message, aux_logs=[str(log)] if log else [])
                failed = True
        if failed and not self.workflow.execution_settings.keep_going:
            # Snakemake itself would wait for every running job (days, for a training) and only then exit on the
            # error; nobody wants their results any more: end them now, and Snakemake exits once they are reported.
            with self.lock:  # jobs submitted since this cycle began
                newer = list(self.active_jobs)
            ids = {j.external_jobid for j in (*running, *newer)}
            self.session.cancel(ids, "a job failed and --keep-going is off")

    def shutdown(self) -> None:
        with self.lock:
            left = list(self.active_jobs)
            self.wait = False  # as Snakemake's shutdown says it: then the status thread's wait is ended, not waited out
        self.session.stop_waiting()
        queued = self.workflow.remote_execution_settings.immediate_submit
        why = ""
        if left and not queued:
            # Snakemake exits on an executor error (sbatch refused a job) with jobs still running: no one would
            # watch them (snakemake-executor-plugin-slurm #320). Nothing is left after a normal end.
            why = "Snakemake is exiting on an error"
            self.session.cancel({j.external_jobid for j in left}, why)
        super().shutdown()
        cancel_rescheduling()  # the scheduler returns right after this call
        self.session.report(queued)
        self.session.close(why)

    def cancel_jobs(self, active_jobs: list[SubmittedJobInfo]) -> None:
        """Ctrl-C, or Snakemake ending on an error: cancel exactly this run's jobs (also one whose sbatch was still
        in flight, and jobs Snakemake no longer tracks)."""
        self.session.cancel_all(j.external_jobid for j in active_jobs)
