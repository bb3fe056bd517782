"""Snakemake adapter for snakemake_executor_multinode: `snakemake --executor multinode`.

Only translation lives here (Snakemake job -> facts.JobFacts -> plan.RuleJob -> the core's plan; outcomes ->
Snakemake reports); SLURM, the plan, the job script, the environment and the status logic are in the core package.
Importing this module stays cheap: Snakemake imports every installed executor plugin at every start.
"""

import glob
import os
import typing
import uuid
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface
from snakemake_interface_executor_plugins.settings import CommonSettings, ExecutorSettingsBase

from snakemake_executor_multinode.launching.nodelog import failing_rank_lines
from snakemake_executor_multinode.planning import environment, submit_check
from snakemake_executor_multinode.planning.plan import JobPlan, Planner, RuleJob, direct_command
from snakemake_executor_multinode.planning.request import JobRequest, RequestError, refuse_container_directive
from snakemake_executor_multinode.planning.settings import Settings, SettingsError
from snakemake_executor_multinode.protocol import STATE_DIR
from snakemake_executor_multinode.slurm.client import RetryPolicy, SlurmClient, SubmitError
from snakemake_executor_multinode.watching import reattach
from snakemake_executor_multinode.watching import report as efficiency
from snakemake_executor_multinode.watching.progress import ProgressLines, read_tail
from snakemake_executor_multinode.watching.registry import Registry, Submission
from snakemake_executor_multinode.watching.tracker import Tracker
from snakemake_executor_plugin_multinode.facts import JobFacts, job_facts, rerun_reason


def _executor_settings() -> type[ExecutorSettingsBase]:
    """Snakemake's `--multinode-*` options, made from the core's one declaration of the settings (settings.py)."""
    hints = typing.get_type_hints(Settings)
    spec = [
        (f.name, hints[f.name], field(default=f.default, metadata={**f.metadata, "env_var": True}))
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


class InputError(WorkflowError):
    """Bad input found before anything is submitted. Its message names rule, field, value and what is allowed;
    Snakemake prints it without a Python stack (which would only show the adapter's frames)."""

    @property  # type: ignore[override]
    def __traceback__(self) -> None:  # what Snakemake reads to print the stack; Python's own handling is untouched
        return None

    @__traceback__.setter
    def __traceback__(self, value: object) -> None:
        pass


@dataclass
class KnownJobs:
    """The jobs of a run that go to SLURM, as far as they can be planned before the first submission."""

    planned: list[tuple[JobExecutorInterface, submit_check.Planned]] = field(default_factory=list)
    later: list[tuple[str, str]] = field(default_factory=list)  # (rule, why it is planned only at submission)
    errors: list[str] = field(default_factory=list)  # plan errors, when collected rather than raised


class Executor(RemoteExecutor):
    def __post_init__(self) -> None:
        given = self.workflow.executor_settings or ExecutorSettings()
        self.settings = Settings(**{f.name: getattr(given, f.name) for f in fields(Settings)})
        self.run_id = uuid.uuid4().hex[:8]
        self.workdir = Path.cwd()
        try:
            self.planner = Planner(self.settings, self.workdir, self.run_id)
        except (environment.EnvProfileError, SettingsError) as err:
            raise WorkflowError(f"multinode settings: {err}") from err
        # Owner-only: job scripts carry profile values (tokens), logs carry what the training prints.
        for private in (self.workdir / STATE_DIR.parent, self.workdir / self.settings.logdir):
            private.mkdir(parents=True, exist_ok=True)
            private.chmod(0o700)
        self.state_dir = self.workdir / STATE_DIR
        self.state_dir.mkdir(exist_ok=True, mode=0o700)
        self.registry = Registry(self.workdir, self.run_id)
        self.client = SlurmClient(
            retry=RetryPolicy(total_seconds=self.settings.slurm_retry_seconds), notify=self.logger.warning
        )
        self.tracker = Tracker(self.state_dir, self.client, sweep_seconds=self.settings.sweep_seconds)
        self.progress = ProgressLines(self.settings.progress_seconds)  # training progress: a file read, no SLURM
        self.external_ids: dict[str, str] = {}  # output file -> SLURM job id (afterok for --immediate-submit)
        self.failed_nodes: dict[tuple[str, ...], tuple[str, ...]] = {}  # job outputs -> nodes its attempts failed on
        self._warned: set[str] = set()
        self._cancelled: set[str] = set()  # job ids this run has cancelled
        self._validate_planned_jobs()

    @property  # type: ignore[override]
    def next_seconds_between_status_checks(self) -> float:
        # Snakemake's status thread starts (and reads this) before __post_init__ runs: derive it from the settings,
        # never from state __post_init__ sets, or the first cycles wait Snakemake's 10 s default.
        return (self.workflow.executor_settings or ExecutorSettings()).status_seconds

    # --- plan ----------------------------------------------------------------------------------
    def plan_for(self, job: JobExecutorInterface, facts: JobFacts | None = None, command: str | None = None) -> JobPlan:
        """The job's plan (request, environment, script), exactly as `multinode preview`/`check` make it."""
        f = facts if facts is not None else job_facts(job)
        rule_job = RuleJob(
            f.name,
            f.resources,
            self.command_for(job, f) if command is None else command,
            threads=f.threads,
            wildcards=f.wildcards,
            attempt=f.attempt,
            declared_nodes=f.declared_nodes,
            key=f"{str(job.jobid)[:8]}.{f.attempt}",
            avoid_nodes=self.failed_nodes.get(f.outputs, ()) if f.attempt > 1 else (),
        )
        try:
            if f.container_image is not None:  # Snakemake's container: directive (request.py decides)
                refuse_container_directive(f.name, f.container_image, f.resources.get("nodes"), f.shellcmd)
            return self.planner.plan(rule_job)
        except RequestError as err:
            raise WorkflowError(str(err)) from err

    def _validate_planned_jobs(self) -> None:
        """Plan every job whose resources are known now and ask SLURM about all of them at once (the submission
        check: one
        `sbatch --test-only` per resource shape, the account), so bad input stops the run before the first sbatch."""
        known = self.plan_known_jobs()
        for _, planned in known.planned:
            self._warn(planned.plan.request)
        if not known.planned:
            return
        report = submit_check.check([planned for _, planned in known.planned], self.client)
        for warning in report.warnings:
            if warning not in self._warned:
                self._warned.add(warning)
                self.logger.warning(warning)
        if report.unreachable:
            self.logger.warning(f"SLURM could not be asked about the jobs before submitting: {report.unreachable}")
        if report.errors:
            raise InputError("\n".join(report.errors))

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
            # tmpdir is always <TBD> in the main process; others are when they depend on missing input
            if any(str(v) == "<TBD>" for k, v in facts.resources.items() if k != "tmpdir"):
                known.later.append((facts.name, "its resources depend on input that the run makes"))
                continue
            # The inner Snakemake command is formatted at submission: formatting it now would already deploy
            # wrapper and conda sources for jobs whose inputs do not exist yet.
            inner = "snakemake (inner, formatted at submission)" if not self.runs_directly(job, facts) else None
            try:
                plan = self.plan_for(job, facts, command=inner)
            except WorkflowError as err:
                if stop_at_error:
                    raise InputError(str(err)) from None
                known.errors.append(str(err))
                continue
            known.planned.append((job, submit_check.Planned(plan, frozenset(facts.resources))))
        return known

    def _warn(self, req: JobRequest) -> None:
        for warning in set(req.warnings) - self._warned:
            self._warned.add(warning)
            self.logger.warning(warning)

    # --- command -------------------------------------------------------------------------------
    def runs_directly(self, job: JobExecutorInterface, facts: JobFacts | None = None) -> bool:
        """A plain shell rule can run its formatted command without a Snakemake process inside the job."""
        if self.settings.inner_snakemake:
            return False
        f = facts if facts is not None else job_facts(job)
        return not f.needs_inner_snakemake

    def command_for(self, job: JobExecutorInterface, facts: JobFacts | None = None) -> str:
        f = facts if facts is not None else job_facts(job)
        if not self.runs_directly(job, f):
            return self.format_job_exec(job)
        assert f.shellcmd is not None  # job_facts gives a reason to run Snakemake inside for jobs without one
        return direct_command(f.shellcmd, f.outputs, f.logs)

    # --- submission ----------------------------------------------------------------------------
    def run_job(self, job: JobExecutorInterface) -> None:
        plan = self.plan_for(job)
        req = plan.request
        self._warn(req)
        outputs = tuple(str(f) for f in job.output)
        if (adopted := self._reattach(job, plan, outputs)) is not None:
            self._submitted(job, plan, adopted)
            return
        # Written before sbatch (under a name of its own, owner-only: profiles may hold tokens) so that a refused
        # script can be read; renamed after. Recorded before sbatch too: Ctrl-C during sbatch still finds the job.
        folder = plan.workdir / plan.log_dir
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        pending = folder / f"{plan.job_name}.sh"
        _write_private(pending, plan.script)
        sub = self.registry.record(
            Submission(
                self.run_id,
                req.rule,
                dict(req.wildcards),
                outputs,
                plan.job_name,
                req.attempt,
                str(pending),
                fingerprint=plan.fingerprint,
            )
        )
        try:
            jobid = self.client.submit(pending, cwd=self.workdir, extra=self._dependencies(job), name=plan.job_name)
        except SubmitError as err:
            raise WorkflowError(f"rule {req.rule!r}: sbatch refused the job: {err} (script kept at {pending})") from err
        pending.rename(plan.script_path(jobid))
        self._submitted(
            job, plan, self.registry.submitted(sub, jobid, str(plan.log_path(jobid)), str(plan.script_path(jobid)))
        )

    def _submitted(self, job: JobExecutorInterface, plan: JobPlan, sub: Submission) -> None:
        assert sub.jobid is not None
        req = plan.request
        for f in job.output:
            self.external_ids[str(f)] = sub.jobid
        if sub.adopted_from is None:
            self.logger.info(
                f"rule {req.rule}: SLURM job {sub.jobid} ({req.nodes} node(s) x {req.gpus} GPU(s)); log {sub.log}"
            )
        self.tracker.expect(sub.jobid, sub.job_name)
        aux = {"log": Path(sub.log), "script": Path(sub.script), "submission": sub}
        self.report_job_submission(SubmittedJobInfo(job, external_jobid=sub.jobid, aux=aux))

    def _reattach(self, job: JobExecutorInterface, plan: JobPlan, outputs: tuple[str, ...]) -> Submission | None:
        """An earlier run's job for the same outputs that this run adopts instead of submitting (reattach.py)."""
        verdict = reattach.decide(
            plan.request.rule,
            outputs,
            plan.fingerprint,
            rerun_reason(job),
            self.registry,
            self.tracker,
            self.workdir,
            enabled=not self.settings.no_reattach,
        )
        if verdict.message:
            (self.logger.warning if verdict.warning else self.logger.info)(verdict.message)
        return verdict.adopt

    def _dependencies(self, job: JobExecutorInterface) -> list[str]:
        if not self.workflow.remote_execution_settings.immediate_submit:
            return []
        upstream = set()
        for dep in self.workflow.dag.dependencies[job]:
            upstream |= {self.external_ids[str(f)] for f in dep.output if str(f) in self.external_ids}
        if not upstream:
            return []
        # A failed upstream job cancels this one instead of leaving it pending forever.
        return [f"--dependency=afterok:{':'.join(sorted(upstream, key=int))}", "--kill-on-invalid-dep=yes"]

    # --- status --------------------------------------------------------------------------------
    async def check_active_jobs(self, active_jobs: list[SubmittedJobInfo]) -> AsyncGenerator[SubmittedJobInfo, None]:
        if not active_jobs:
            return
        async with self.status_rate_limiter:
            outcomes = self.tracker.poll([j.external_jobid for j in active_jobs])
        running: list[SubmittedJobInfo] = []
        failed = False
        for info in active_jobs:
            outcome = outcomes[info.external_jobid]
            if outcome.note:
                self.logger.info(f"SLURM job {info.external_jobid} ({info.job.name}): {outcome.note}")
            if not outcome.finished:
                if line := self.progress.line(info.external_jobid, info.job.name, info.aux.get("log")):
                    self.logger.info(line)
                running.append(info)
                yield info
                continue
            self.tracker.forget(info.external_jobid)
            # Recorded before Snakemake hears of it: a reported end is never adopted by a later run (reattach.py)
            self.registry.ended(info.aux["submission"], "success" if outcome.success else "failed")
            if outcome.success:
                self.report_job_success(info)
            else:
                if outcome.failed_node:  # --retries: the next attempt avoids the node this one failed on
                    key = tuple(str(f) for f in info.job.output)
                    self.failed_nodes[key] = (*self.failed_nodes.get(key, ()), outcome.failed_node)
                log = info.aux.get("log")
                tail = _failure_lines(Path(log), outcome.failed_node) if log else ""
                self.report_job_error(
                    info,
                    msg=f"SLURM job {info.external_jobid} failed: {outcome.describe()}; log: {log}{tail} ",
                    aux_logs=[str(log)] if log else [],
                )
                failed = True
        if failed and not self.workflow.execution_settings.keep_going:
            # Snakemake itself would wait for every running job (days, for a training) and only then exit on the
            # error; nobody wants their results any more: end them now, and Snakemake exits once they are reported.
            with self.lock:  # jobs submitted since this cycle began
                newer = list(self.active_jobs)
            self._cancel({j.external_jobid for j in (*running, *newer)}, "a job failed and --keep-going is off")

    def shutdown(self) -> None:
        with self.lock:
            left = list(self.active_jobs)
        if left and not self.workflow.remote_execution_settings.immediate_submit:
            # Snakemake exits on an executor error (sbatch refused a job) with jobs still running: no one would
            # watch them (snakemake-executor-plugin-slurm #320). Nothing is left after a normal end.
            self._cancel({j.external_jobid for j in left}, "Snakemake is exiting on an error")
        super().shutdown()
        if self.settings.efficiency_report:  # after the last job: its sacct record is (nearly) final
            queued = self.workflow.remote_execution_settings.immediate_submit
            for line in efficiency.end_of_run(self.workdir, self.run_id, self.client, queued=queued):
                self.logger.info(line)

    def cancel_jobs(self, active_jobs: list[SubmittedJobInfo]) -> None:
        """Ctrl-C, or Snakemake ending on an error: cancel exactly this run's jobs. The registry also knows a job
        whose sbatch was still in flight (found by its unique name) and jobs Snakemake no longer tracks."""
        ids = {j.external_jobid for j in active_jobs}
        ids |= {sub.jobid for sub in self.registry.mine() if sub.jobid is not None}
        self._cancel(ids)

    def _cancel(self, ids: set[str], why: str = "") -> None:
        """scancel these jobs of this run, and any of its jobs whose sbatch reply has not come (by unique name);
        each job once per run."""
        names = [sub.job_name for sub in self.registry.mine() if sub.jobid is None]
        ids |= set(self.client.find_by_names(names)) if names else set()
        todo = sorted(ids - self._cancelled, key=int)
        if todo:
            self._cancelled |= set(todo)
            self.logger.info(f"cancelling SLURM jobs {' '.join(todo)}" + (f" ({why})" if why else ""))
            self.client.cancel(todo)


def _last_lines(log: Path, count: int = 12) -> str:
    """The end of the job's log (the failing rank's last words) for the error message, indented."""
    tail = read_tail(log, 16384)
    lines = tail.decode(errors="replace").splitlines()[-count:] if tail else []
    return "\nlast lines of the log:\n" + "\n".join(f"    {line}" for line in lines) if lines else ""


def _failure_lines(log: Path, node: str | None) -> str:
    """The last lines of the rank that failed first on the failing node (torchrun's root cause names it; its
    labelled lines are in the node's file beside the job log, of the newest run), then the end of the job log (the
    launcher's verdict); the job log's end alone when there is no node file."""
    ours = sorted(
        log.parent.glob(f"{glob.escape(log.name.removesuffix('.log'))}*.{glob.escape(node)}.out") if node else (),
        key=lambda p: p.stat().st_mtime,
    )
    if not ours or node is None:
        return _last_lines(log)
    tail = read_tail(ours[-1], 65536)
    if tail is None:
        return _last_lines(log)
    who, lines = failing_rank_lines(tail.decode(errors="replace"), node, 10)
    if not lines:
        return _last_lines(log)
    quoted = "\n".join(f"    {line}" for line in lines)
    return f"\nlast lines of {who} ({ours[-1]}):\n{quoted}" + _last_lines(log, 5)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
