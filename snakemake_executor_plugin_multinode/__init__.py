"""Snakemake adapter for snakemake_executor_multinode: `snakemake --executor multinode`.

Only translation lives here (Snakemake job -> JobRequest + command, outcomes -> Snakemake reports); SLURM, the job
script, the environment and the status logic are in the core package. Importing this module stays cheap: Snakemake
imports every installed executor plugin at every start.
"""

import os
import shlex
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface
from snakemake_interface_executor_plugins.settings import CommonSettings, ExecutorSettingsBase

from snakemake_executor_multinode import environment, jobscript
from snakemake_executor_multinode.request import Defaults, JobRequest, RequestError, build_request
from snakemake_executor_multinode.slurm import SlurmClient, SubmitError
from snakemake_executor_multinode.status import Tracker


@dataclass
class ExecutorSettings(ExecutorSettingsBase):
    account: Optional[str] = field(
        default=None, metadata={"help": "SLURM account for every job without slurm_account.", "env_var": True}
    )
    partition: Optional[str] = field(
        default=None, metadata={"help": "SLURM partition for every job without slurm_partition.", "env_var": True}
    )
    env_profiles: Optional[str] = field(
        default=None,
        metadata={
            "help": "YAML file of environment profiles (CUDA, conda/venv, modules, NCCL/InfiniBand, variables); "
            "adds to the built-in infiniband, ethernet and debug profiles.",
            "env_var": True,
        },
    )
    env_profile: Optional[str] = field(
        default=None,
        metadata={
            "help": "Profile(s) for rules without env_profile, e.g. 'infiniband' or 'infiniband,debug'; "
            "default: the file's `default:`.",
            "env_var": True,
        },
    )
    signal: str = field(
        default="USR2@120",
        metadata={
            "help": "sbatch --signal for GPU or multi-node jobs without a signal resource ('none' to send none). "
            "USR2 reaches the training workers, not torchrun's agent.",
            "env_var": True,
        },
    )
    logdir: str = field(
        default=".snakemake/multinode/logs",
        metadata={
            "help": "Folder (relative to the working directory) for job scripts and logs: "
            "rule_<rule>/<wildcards>/<jobid>.attempt<n>.log and .sh.",
            "env_var": True,
        },
    )
    max_requeues: int = field(
        default=3,
        metadata={
            "help": "How often a job that checkpointed on the pre-time-limit signal is requeued by SLURM "
            "(0: never; Snakemake's --retries then reruns it).",
            "env_var": True,
        },
    )
    gpu_flag: str = field(
        default="gres",
        metadata={
            "help": "How GPUs per node are asked for: 'gres' (--gres=gpu[:type]:N) or 'gpus-per-node'.",
            "choices": ["gres", "gpus-per-node"],
            "env_var": True,
        },
    )
    status_seconds: float = field(
        default=0.5,
        metadata={
            "help": "Seconds between status cycles; a cycle reads completion markers only (no SLURM query).",
            "env_var": True,
        },
    )
    sweep_seconds: float = field(
        default=30.0,
        metadata={
            "help": "Seconds between sacct/squeue sweeps that catch jobs ending without a marker "
            "(cancelled, timed out, node lost).",
            "env_var": True,
        },
    )
    inner_snakemake: bool = field(
        default=False,
        metadata={
            "help": "Always run Snakemake inside the job. By default a plain shell rule runs its formatted command "
            "directly (one process less, seconds faster); script/run/conda/container/group jobs always "
            "use Snakemake."
        },
    )


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


class Executor(RemoteExecutor):
    def __post_init__(self) -> None:
        s: ExecutorSettings = self.workflow.executor_settings or ExecutorSettings()
        self.settings = s
        self.run_id = uuid.uuid4().hex[:8]
        self.workdir = Path.cwd()
        base = self.workdir / ".snakemake" / "multinode"
        self.state_dir = base / "state"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.client = SlurmClient()
        self.tracker = Tracker(self.state_dir, self.client, sweep_seconds=s.sweep_seconds)
        self.next_seconds_between_status_checks = s.status_seconds
        self.external_ids: dict[str, str] = {}  # output file -> SLURM job id (afterok for --immediate-submit)
        self._warned: set[str] = set()
        try:
            self.profiles = environment.load_profiles(s.env_profiles)
        except environment.EnvProfileError as err:
            raise WorkflowError(f"--multinode-env-profiles: {err}") from err
        if s.env_profile and not self.profiles.known(s.env_profile):
            raise WorkflowError(
                f"--multinode-env-profile {s.env_profile!r}: unknown profile; defined: "
                f"{', '.join(sorted(self.profiles.names))}"
            )
        self.defaults = Defaults(
            account=s.account,
            partition=s.partition,
            signal=s.signal,
            env_profile=s.env_profile or self.profiles.default,
            gpu_flag=s.gpu_flag,
            max_requeues=s.max_requeues,
        )
        self._validate_planned_jobs()

    # --- request -------------------------------------------------------------------------------
    def request_for(self, job: JobExecutorInterface) -> JobRequest:
        resources = {k: v for k, v in job.resources.items() if not str(k).startswith("_")}
        declared = getattr(getattr(job, "rule", None), "resources", {}).get("nodes")
        wildcards = getattr(job, "wildcards_dict", None) or {}
        name = job.name if not job.is_group() else f"group_{job.name}"
        try:
            return build_request(
                name,
                resources,
                threads=job.threads,
                wildcards=wildcards,
                attempt=job.attempt,
                defaults=self.defaults,
                known_profiles=self.profiles.names,
                declared_nodes=declared if isinstance(declared, int) else None,
            )
        except RequestError as err:
            raise WorkflowError(str(err)) from err

    def _validate_planned_jobs(self) -> None:
        """Check every job whose resources are known now, so bad input stops the run before any submission."""
        dag = getattr(self.workflow, "dag", None)
        try:
            jobs = list(dag.needrun_jobs()) if dag is not None else []
        except Exception:  # the DAG API is not part of the executor interface: best effort only
            return
        for job in jobs:
            try:
                # tmpdir is always <TBD> in the main process; others are when they depend on missing input
                if any(str(v) == "<TBD>" for k, v in job.resources.items() if k != "tmpdir"):
                    continue
            except Exception:
                continue  # resources depending on inputs that do not exist yet: checked at submission
            self._warn(self.request_for(job))

    def _warn(self, req: JobRequest) -> None:
        for warning in set(req.warnings) - self._warned:
            self._warned.add(warning)
            self.logger.warning(warning)

    # --- command -------------------------------------------------------------------------------
    def runs_directly(self, job: JobExecutorInterface) -> bool:
        """A plain shell rule can run its formatted command without a Snakemake process inside the job."""
        if self.settings.inner_snakemake or job.is_group():
            return False
        rule = getattr(job, "rule", None)
        if rule is None or not getattr(rule, "shellcmd", None):
            return False
        if getattr(job, "conda_env_spec", None) or getattr(job, "container_img_url", None):
            return False
        if getattr(rule, "env_modules", None) or getattr(rule, "shadow_depth", None) or getattr(job, "benchmark", None):
            return False
        files = list(job.input) + list(job.output) + list(job.log)
        if any(
            getattr(f, "is_storage", False) or getattr(f, "is_pipe", False) or getattr(f, "is_service", False)
            for f in files
        ):
            return False
        return not any(getattr(f, "flags", {}).get("touch") for f in job.output)

    def command_for(self, job: JobExecutorInterface) -> str:
        if not self.runs_directly(job):
            return self.format_job_exec(job)
        # What the Snakemake process inside the job would do first: fresh outputs, existing folders.
        q = shlex.quote
        outputs = [str(f) for f in job.output]
        folders = sorted({os.path.dirname(p) for p in outputs + [str(f) for f in job.log] if os.path.dirname(p)})
        lines = ["set -euo pipefail"]
        if outputs:
            lines.append("rm -rf -- " + " ".join(q(p) for p in outputs))
        if folders:
            lines.append("mkdir -p -- " + " ".join(q(d) for d in folders))
        lines.append(job.shellcmd.strip())
        return "\n".join(lines)

    # --- submission ----------------------------------------------------------------------------
    def run_job(self, job: JobExecutorInterface) -> None:
        req = self.request_for(job)
        self._warn(req)
        log_dir = jobscript.log_dir_for(Path(self.settings.logdir), req)
        ctx = jobscript.ScriptContext(
            command=self.command_for(job),
            workdir=self.workdir,
            log_dir=log_dir,
            state_dir=self.state_dir,
            job_name=f"mn-{self.run_id}-{req.rule}",
        )
        env_lines = environment.render_lines(environment.resolve(self.profiles, req.env_profile))
        script = jobscript.render(req, ctx, env_lines)
        (self.workdir / log_dir).mkdir(parents=True, exist_ok=True)
        script_path = self.workdir / log_dir / f"snakejob{job.jobid}.attempt{req.attempt}.{self.run_id}.sh"
        script_path.write_text(script)
        extra = self._dependencies(job)
        try:
            jobid = self.client.submit(script_path, cwd=self.workdir, extra=extra)
        except SubmitError as err:
            raise WorkflowError(
                f"rule {req.rule!r}: sbatch refused the job: {err} (script kept at {script_path})"
            ) from err
        final_script = script_path.with_name(f"{jobid}.attempt{req.attempt}.sh")
        script_path.rename(final_script)
        log = self.workdir / log_dir / f"{jobid}.attempt{req.attempt}.log"
        for f in job.output:
            self.external_ids[str(f)] = jobid
        self.logger.info(f"rule {req.rule}: SLURM job {jobid} ({req.nodes} node(s) x {req.gpus} GPU(s)); log {log}")
        self.report_job_submission(
            SubmittedJobInfo(job, external_jobid=jobid, aux={"log": log, "script": final_script})
        )

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
        for info in active_jobs:
            outcome = outcomes[info.external_jobid]
            if not outcome.finished:
                yield info
                continue
            self.tracker.forget(info.external_jobid)
            if outcome.success:
                self.report_job_success(info)
            else:
                log = info.aux.get("log")
                self.report_job_error(
                    info,
                    msg=f"SLURM job {info.external_jobid} failed: {outcome.describe()}; log: {log} ",
                    aux_logs=[str(log)] if log else [],
                )

    def cancel_jobs(self, active_jobs: list[SubmittedJobInfo]) -> None:
        ids = [j.external_jobid for j in active_jobs]
        if ids:
            self.logger.info(f"cancelling SLURM jobs {' '.join(ids)}")
            self.client.cancel(ids)
