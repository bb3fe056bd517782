"""One job plan: a rule's job + the plugin settings -> the validated request, the environment and the exact script.

The executor submits a plan, `multinode preview` prints one, and `multinode check` makes one for every job of a
run: all three call `plan_job`, so what a user previews or checks is what runs. The plugin settings are declared
once here (`Settings`); the Snakemake adapter builds its `--multinode-*` options from these fields.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePath
from typing import Any, Optional

from . import environment, jobscript, protocol
from .request import Defaults, JobRequest, RequestError, build_request

_NODE = re.compile(r"^[A-Za-z0-9_.\-]+$")  # a node name as the launcher reports it
_LOGDIR = re.compile(r"^[A-Za-z0-9_.+\-][A-Za-z0-9_./+\-]*$")


class SettingsError(ValueError):
    """A plugin setting that cannot be used; the message names the setting, the value and what is allowed."""


@dataclass(frozen=True)
class Settings:
    """The plugin settings (`--multinode-<name>`, `multinode-<name>:` in a profile, `SNAKEMAKE_MULTINODE_<NAME>`).

    Types are spelled `Optional[...]` because Snakemake reads them at run time to build its command line."""

    account: Optional[str] = field(
        default=None, metadata={"help": "SLURM account for every job without slurm_account."}
    )
    partition: Optional[str] = field(
        default=None, metadata={"help": "SLURM partition for every job without slurm_partition."}
    )
    reservation: Optional[str] = field(
        default=None, metadata={"help": "SLURM reservation for every job without slurm_reservation."}
    )
    allow_unknown_resources: bool = field(
        default=False,
        metadata={
            "help": "Ignore (with a warning) resource names this plugin does not know, for sites that use custom "
            "resources for their own scheduling. By default an unknown name is an error naming close matches."
        },
    )
    env_profiles: Optional[str] = field(
        default=None,
        metadata={
            "help": "YAML file of environment profiles (CUDA, conda/venv, modules, NCCL/InfiniBand, variables); "
            "adds to the built-in infiniband, ethernet and debug profiles."
        },
    )
    env_profile: Optional[str] = field(
        default=None,
        metadata={
            "help": "Profile(s) for rules without env_profile, e.g. 'infiniband' or 'infiniband,debug'; "
            "default: the file's `default:`."
        },
    )
    signal: str = field(
        default="USR2@120",
        metadata={
            "help": "sbatch --signal for GPU or multi-node jobs without a signal resource ('none' to send none). "
            "USR2 reaches the training workers, not torchrun's agent."
        },
    )
    logdir: str = field(
        default=str(protocol.LOGS_DIR),
        metadata={
            "help": "Folder (relative to the working directory) for job scripts and logs: "
            "rule_<rule>/<wildcards>/<jobid>.attempt<n>.log and .sh."
        },
    )
    max_requeues: int = field(
        default=3,
        metadata={
            "help": "How often a job that checkpointed on the pre-time-limit signal is requeued by SLURM "
            "(0: never; Snakemake's --retries then reruns it)."
        },
    )
    gpu_flag: str = field(
        default="gres",
        metadata={
            "help": "How GPUs per node are asked for: 'gres' (--gres=gpu[:type]:N) or 'gpus-per-node'.",
            "choices": ["gres", "gpus-per-node"],
        },
    )
    status_seconds: float = field(
        default=0.5,
        metadata={"help": "Seconds between status cycles; a cycle reads completion markers only (no SLURM query)."},
    )
    sweep_seconds: float = field(
        default=30.0,
        metadata={
            "help": "Seconds between sacct/squeue sweeps that catch jobs ending without a marker "
            "(cancelled, timed out, node lost)."
        },
    )
    no_reattach: bool = field(
        default=False,
        metadata={
            "help": "Never adopt a job that an earlier (killed) run submitted for the same outputs; by default a "
            "rerun reattaches to it while it runs, or takes its result when it succeeded."
        },
    )
    slurm_retry_seconds: float = field(
        default=600.0,
        metadata={
            "help": "How long sbatch/squeue/sacct/scancel failures that SLURM reports as transient (controller "
            "restarting, timeouts) are retried, with backoff, before the run gives up."
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
    efficiency_report: bool = field(
        default=False,
        metadata={
            "help": "At the end of the run, write an efficiency report from sacct (time, CPU, memory used against "
            "requested, GPU-hours; suggestions for rules that waste more than half) to "
            ".snakemake/multinode/reports/<run>.{csv,md} and print its summary."
        },
    )
    progress_seconds: float = field(
        default=60.0,
        metadata={
            "help": "At most one progress line (step, loss, tokens/s, ETA) per running training job every this many "
            "seconds, read from the job's metrics file ($MULTINODE_METRICS_FILE; no SLURM query). 0: none."
        },
    )


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
    avoid_nodes: tuple[str, ...] = ()  # nodes an earlier attempt of this job failed on: excluded for this one


@dataclass(frozen=True)
class JobPlan:
    request: JobRequest
    job_name: str  # unique to the submission: a lost sbatch reply is found by it
    environment: tuple[str, ...]
    script: str
    workdir: Path
    log_dir: PurePath  # relative to workdir
    state_dir: Path

    @property
    def fingerprint(self) -> str:
        """The script without what differs between runs of the same job (its name): equal means same job."""
        return hashlib.sha256(self.script.replace(self.job_name, "").encode()).hexdigest()[:16]

    def log_path(self, jobid: str) -> Path:
        return self.workdir / self.log_dir / f"{protocol.log_stem(jobid, self.request.attempt)}.log"

    def script_path(self, jobid: str) -> Path:
        """Where the submitted script is kept, beside its log."""
        return self.workdir / self.log_dir / f"{protocol.log_stem(jobid, self.request.attempt)}.sh"


class Planner:
    """Plans every job of one run with the same settings; the profile file is read once, when it is created."""

    def __init__(self, settings: Settings, workdir: Path, run_id: str) -> None:
        self.settings = settings
        self.workdir = workdir
        self.run_id = run_id
        if not _LOGDIR.match(settings.logdir):
            # it becomes sbatch's --output on an #SBATCH line, which has no quoting of its own
            raise SettingsError(
                f"--multinode-logdir={settings.logdir!r}: a relative folder of letters, digits and _ . / + - only"
            )
        self.profiles = environment.load_profiles(settings.env_profiles)  # EnvProfileError names file and key
        if settings.env_profile is not None:
            environment.select(self.profiles, settings.env_profile, where="--multinode-env-profile")
        self.defaults = Defaults(
            account=settings.account,
            partition=settings.partition,
            reservation=settings.reservation,
            allow_unknown_resources=settings.allow_unknown_resources,
            signal=settings.signal,
            gpu_flag=settings.gpu_flag,
            max_requeues=settings.max_requeues,
        )

    def plan(self, job: RuleJob) -> JobPlan:
        return plan_job(job, self)


def plan_job(job: RuleJob, planner: Planner) -> JobPlan:
    """Validate and render one job; raises RequestError (rule, field, value, what is allowed) on bad input."""
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
    req = build_request(
        job.rule,
        job.resources,
        threads=job.threads,
        wildcards=job.wildcards,
        attempt=job.attempt,
        defaults=planner.defaults,
        env_profile=selection,
        declared_nodes=job.declared_nodes,
    )
    if avoid := [n for n in job.avoid_nodes if _NODE.match(n)]:
        req = replace(req, exclude=",".join(filter(None, [req.exclude, *avoid])))
    lines = environment.render_lines(environment.resolve(profiles, req.env_profile))
    log_dir = jobscript.log_dir_for(PurePath(planner.settings.logdir), req)
    state_dir = planner.workdir / protocol.STATE_DIR
    name = jobscript.safe_component(f"mn-{planner.run_id}-{req.rule}" + (f"-{job.key}" if job.key else ""), 120)
    ctx = jobscript.ScriptContext(
        command=job.command, workdir=planner.workdir, log_dir=log_dir, state_dir=state_dir, job_name=name
    )
    script = jobscript.render(req, ctx, lines)
    return JobPlan(req, name, tuple(lines), script, planner.workdir, log_dir, state_dir)


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
