"""One job plan: a rule's job + the plugin settings -> the validated request, the environment and the exact script.

`plan_job` is the one plan sequence (the container directive refused, the nodes a retry avoids, the request, the
script, the launch check): the executor submits its plan, `multinode preview` prints one, and `multinode check`
makes one for every job of a run, so what a user previews or checks is what runs.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePath
from typing import Any

from snakemake_executor_multinode.contract.jobfiles import JobFiles, PendingFiles, StateFolders
from snakemake_executor_multinode.planning import environment, jobscript, launcher_use, snapshot
from snakemake_executor_multinode.planning.request import (
    JobRequest,
    RequestError,
    build_request,
    refuse_container_directive,
)
from snakemake_executor_multinode.planning.settings import PlanningSettings, SettingsError
from snakemake_executor_multinode.planning.snapshot import Snapshot
from snakemake_executor_multinode.slurm.sbatch_flags import ANY_RELEASE, OptionTable, table_for

_NODE = re.compile(r"^[A-Za-z0-9_.\-]+$")  # a node name as the launcher reports it
_LOGDIR = re.compile(r"^[A-Za-z0-9_.+\-][A-Za-z0-9_./+\-]*$")


@dataclass(frozen=True)
class RuleJob:
    """What a plan needs to know of one job: from Snakemake's job object, or from `multinode preview`'s arguments."""

    rule: str
    resources: Mapping[str, Any]
    command: str  # the shell command the job runs (on the head node)
    threads: int = 1
    wildcards: Mapping[str, Any] = field(default_factory=dict)
    attempt: int = 1
    declared_nodes: int | None = None  # what the rule itself asked for, when Snakemake's --resources capped it
    key: str = ""  # tells this submission apart from every other of the run (in the job name)
    keep: tuple[str, ...] = ()  # the job's outputs and logs: paths the code snapshot never takes over
    outputs: tuple[str, ...] = ()  # what the job makes: with the run, they name its experiment (tracking_id)
    shellcmd: str | None = None  # the rule's shell command (the launch check reads it); None: a rule without one
    kind: str | None = None  # what a rule without a shell command is (script rule, run: block, ...)
    container_image: str | None = None  # Snakemake's container: directive (request.py refuses it where it breaks)


@dataclass(frozen=True)
class JobPlan:
    request: JobRequest
    job_name: str  # unique to the submission: a lost sbatch reply is found by it
    environment: tuple[str, ...]
    script: str
    workdir: Path
    log_dir: PurePath  # relative to workdir
    state_dir: Path
    command: str = ""  # the rule's command as Snakemake formatted it (the script runs it with frozen code)
    snapshot: Snapshot | None = None  # the frozen code the script's command points into
    code_files: tuple[Path, ...] = ()  # without a snapshot: the files a restart checks for changes
    versions_in_job: bool = True  # the job reads its package versions itself (see ScriptContext)
    tracking_id: str = ""  # the experiment every run of the job logs to ($MULTINODE_RUN_ID)

    @property
    def fingerprint(self) -> str:
        """The script without what differs between runs of the same job (its name; the snapshot holding its code,
        whose changes Snakemake's own rerun triggers judge): equal means same job."""
        script = self.script.replace(self.job_name, "")
        if self.tracking_id:  # derived from the run: a later run's plan of the same job names another
            script = script.replace(self.tracking_id, "")
        if self.snapshot is not None:
            script = script.replace(str(self.snapshot.root), "")
        return hashlib.sha256(script.encode()).hexdigest()[:16]

    @property
    def code_manifest(self) -> Path:
        """sha256sum's check file of `code_files`, beside the job's script (written at submission)."""
        return PendingFiles(self.workdir / self.log_dir, self.job_name).code_manifest

    def files(self, jobid: str) -> JobFiles:
        """The job's files once sbatch has named it (its key: the job id, or <array id>_<i>)."""
        return JobFiles.of(self.workdir / self.log_dir, jobid, self.request.attempt)

    def log_path(self, jobid: str) -> Path:
        return self.files(jobid).log

    def script_path(self, jobid: str) -> Path:
        """Where the submitted script is kept, beside its log."""
        return self.files(jobid).script


class Planner:
    """Plans every job of one run with the same settings; the profile file is read once, when it is created."""

    def __init__(self, settings: PlanningSettings, workdir: Path, run_id: str) -> None:
        self.settings = settings
        self.workdir = workdir
        self.run_id = run_id
        if not _LOGDIR.match(settings.logdir):
            # it becomes sbatch's --output on an #SBATCH line, which has no quoting of its own
            raise SettingsError(
                f"--multinode-logdir={settings.logdir!r}: a relative folder of letters, digits and _ . / + - only"
            )
        if settings.crash_loop_runs < 0:
            raise SettingsError(f"--multinode-crash-loop-runs={settings.crash_loop_runs}: 0 (no bound) or more runs")
        if not settings.crash_loop_seconds > 0:
            raise SettingsError(f"--multinode-crash-loop-seconds={settings.crash_loop_seconds}: more than 0 seconds")
        if settings.gpu_sample_seconds < 0:
            raise SettingsError(
                f"--multinode-gpu-sample-seconds={settings.gpu_sample_seconds}: 0 (no sampling) or more seconds"
            )
        # slurm_extra is read with the options of the SLURM release the session finds (before its first plan)
        self.sbatch_options: OptionTable = ANY_RELEASE
        self.failed_nodes: dict[tuple[str, ...], tuple[str, ...]] = {}  # job outputs -> nodes its attempts failed on
        self.launchers = launcher_use.launchers_setting(settings.launchers)  # SettingsError names the command
        self.profiles = environment.load_profiles(settings.profile_file)  # EnvProfileError names file and key
        self.snapshots = snapshot.SnapshotStore(workdir, settings.snapshot)  # SnapshotError names setting and path
        if settings.env_profile is not None:
            environment.select(self.profiles, settings.env_profile, where="--multinode-env-profile")

    def use_release(self, version: str) -> None:
        """slurm_extra is read with the options of this SLURM release (`sbatch --version`'s answer; "": none)."""
        self.sbatch_options = table_for(version)

    def failed_on(self, outputs: tuple[str, ...], nodes: Sequence[str]) -> None:
        """An attempt of the job that makes `outputs` failed on `nodes`: its retries in this run avoid them."""
        known = self.failed_nodes.get(outputs, ())
        self.failed_nodes[outputs] = (*known, *(n for n in dict.fromkeys(nodes) if n not in known))


def plan_job(job: RuleJob, planner: Planner) -> JobPlan:
    """The one plan sequence: validate and render one job. RequestError (rule, field, value, what is allowed) on bad
    input, also for nodes or GPUs its command would leave idle (launcher_use.py). A retry (attempt > 1) avoids the
    nodes the earlier attempts of the same outputs failed on."""
    if job.container_image is not None:  # Snakemake's container: directive (request.py decides)
        refuse_container_directive(job.rule, job.container_image, job.resources.get("nodes"), job.shellcmd)
    req, resolved = _request(job, planner)
    lines = environment.render_lines(resolved)
    versions_in_job = req.gpus > 0 or environment.own_software(resolved)
    log_dir = jobscript.log_dir_for(PurePath(planner.settings.logdir), req)
    state_dir = StateFolders(planner.workdir).state
    name = jobscript.safe_component(f"mn-{planner.run_id}-{req.rule}" + (f"-{job.key}" if job.key else ""), 120)
    frozen = planner.snapshots.freeze()
    code_files: tuple[Path, ...] = ()
    if frozen is not None:
        command = snapshot.rewrite(job.command, frozen, planner.workdir, job.keep)
        if loose := snapshot.unfrozen(job.command, frozen, planner.workdir, job.keep):
            names = ", ".join(str(f) for f in loose)
            note = f"rule {job.rule!r}: not frozen with the code (git does not track it; `git add` it): {names}"
            req = replace(req, warnings=(*req.warnings, note))
    else:
        command, code_files = job.command, tuple(snapshot.named_files(job.command, planner.workdir, job.keep))
    ctx = jobscript.ScriptContext(
        run_id=experiment(job, planner),
        code_digest=frozen.digest if frozen else "",
        command=command,
        workdir=planner.workdir,
        log_dir=log_dir,
        state_dir=state_dir,
        job_name=name,
        code=frozen.describe() if frozen else "not frozen: a restart checks the files the command names",
        code_manifest=PendingFiles(planner.workdir / log_dir, name).code_manifest,
        versions_in_job=versions_in_job,
        gpu_sample_s=planner.settings.gpu_sample_seconds,
    )
    script = jobscript.render(req, ctx, lines)
    launcher_use.refuse_idle(req, job.shellcmd, job.kind, planner.launchers)
    return JobPlan(
        req, name, tuple(lines), script, planner.workdir, log_dir, state_dir, job.command, frozen, code_files,
        versions_in_job, ctx.tracking_id,
    )  # fmt: skip


def _request(job: RuleJob, planner: Planner) -> tuple[JobRequest, dict[str, Any]]:
    """The job's validated request and its flattened environment profile."""
    profiles = planner.profiles
    chosen = job.resources.get("env_profile") or planner.settings.env_profile or profiles.default
    try:
        selection = environment.select(profiles, str(chosen), where="env_profile") if chosen else None
    except environment.EnvProfileError as err:
        raise RequestError(
            job.rule,
            "env_profile",
            chosen,
            "a defined environment profile, or several comma-separated (applied left to right); defined: "
            + ", ".join(sorted(profiles.names)),
        ) from err
    try:
        resolved = environment.resolve(profiles, selection)
    except environment.EnvProfileError as err:  # a null that unsets nothing: names file, profile and key
        raise RequestError(job.rule, "env_profile", chosen, str(err)) from err
    req = build_request(
        job.rule,
        job.resources,
        threads=job.threads,
        wildcards=job.wildcards,
        attempt=job.attempt,
        defaults=planner.settings,
        sbatch_options=planner.sbatch_options,
        env_profile=selection,
        declared_nodes=job.declared_nodes,
        profile=resolved,
        site_launcher=launcher_use.site_launcher(job.shellcmd, planner.launchers),
    )
    failed = planner.failed_nodes.get(job.outputs, ()) if job.attempt > 1 else ()
    if avoid := [n for n in failed if _NODE.match(n)]:
        req = replace(req, exclude=",".join(filter(None, [req.exclude, *avoid])))
    return req, resolved


def experiment(job: RuleJob, planner: Planner) -> str:
    """The id of the experiment a job's runs log to: the same for every run of the job and for every retry of its
    outputs within one Snakemake run (the run id is the Session's), a new one for a new Snakemake run (`-F`, or a
    rerun after a failure): the working directory, the run, the rule and the outputs (without outputs, as `multinode
    preview` plans: the wildcards)."""
    what = sorted(job.outputs) or [f"{k}={v}" for k, v in sorted(job.wildcards.items())]
    return jobscript.tracking_id(str(planner.workdir), planner.run_id, job.rule, *what)


def direct_command(shellcmd: str, outputs: Sequence[str], logs: Sequence[str] = ()) -> str:
    """A plain shell rule's command as the job runs it without Snakemake inside: first what Snakemake would do
    (remove stale outputs, create their folders), then the formatted command, stopping at the first error."""
    q = shlex.quote
    folders = sorted({os.path.dirname(p) for p in [*outputs, *logs] if os.path.dirname(p)})
    lines = ["set -euo pipefail"]
    if outputs:
        lines.append("rm -rf -- " + " ".join(q(p) for p in outputs))
    if folders:
        lines.append("mkdir -p -- " + " ".join(q(d) for d in folders))
    lines.append(shellcmd.strip())
    return "\n".join(lines)
