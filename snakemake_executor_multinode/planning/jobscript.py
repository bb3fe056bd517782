"""JobRequest + environment -> the sbatch script, from the one template in templates/job.sh.

The executor submits exactly what `render` returns and `multinode preview` prints it: what a user reads is what
runs. Values that reach the shell are quoted with shlex; #SBATCH values are restricted to characters sbatch's own
parser takes literally (the request's validation and `safe_component` see to that).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePath

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.contract.jobfiles import (
    CANCEL_MARKER,
    CRASH_MARKER,
    EXIT_MARKER,
    FAILED_NODE_MARKER,
    PREEMPT_MARKER,
    PREEMPT_NOTICE_MARKER,
    REQUEUE_MARKER,
    SELF_REQUEUE_MARKER,
    STALL_MARKER,
    JobFiles,
    ShellJobFiles,
    marker_shell,
    tensorboard_dir,
)
from snakemake_executor_multinode.planning.quoting import shell_quote
from snakemake_executor_multinode.planning.request import JobRequest
from snakemake_executor_multinode.planning.settings import PlanningSettings

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.=+\-]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class ScriptContext:
    """Where and what the job runs; decided by the caller (the executor or the preview)."""

    command: str  # one shell command line, run with bash from the working directory
    workdir: PurePath
    log_dir: PurePath  # relative to workdir: sbatch resolves --output there, and no space can sneak in
    state_dir: PurePath
    job_name: str
    title: str = ""
    code: str = ""  # what code the command runs (the snapshot), for the script's reader
    code_manifest: PurePath | None = None  # the restart's code check (sha256sum -c), when nothing is frozen
    # The job's start line reads GPUs and package versions in the job (a Python process, ~0.1 s of CPU): for a job
    # with GPUs or software of its own. Any other job runs in the submitting side's environment, whose versions the
    # submission record holds, and writes its start line with the shell alone.
    versions_in_job: bool = True
    # Seconds between GPU samples on every node (--multinode-gpu-sample-seconds); used for a job with GPUs only.
    gpu_sample_s: int = PlanningSettings.gpu_sample_seconds
    # The experiment every run of the job logs to ($MULTINODE_RUN_ID; plan.py derives it); "": one of the job name.
    run_id: str = ""
    code_digest: str = ""  # the frozen snapshot's digest ($MULTINODE_CODE_DIGEST, a tracker tag); "": not frozen

    @property
    def tracking_id(self) -> str:
        return self.run_id or tracking_id(self.job_name)


def tracking_id(*parts: str) -> str:
    """An experiment's id from what identifies it: 16 hex digits, a valid W&B run id and a folder name."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def safe_component(text: str, limit: int = 80) -> str:
    """A file-name and #SBATCH-safe form of free text (wildcards); a short hash keeps distinct values apart."""
    cleaned = _UNSAFE.sub("_", text)
    if cleaned == text and len(text) <= limit:
        return text or "_"
    digest = hashlib.sha1(text.encode()).hexdigest()[:8]
    return f"{cleaned[: limit - 9]}-{digest}"


def inert(text: str) -> str:
    """Free text for a comment line: control characters (a newline would end the comment and start a command)
    written as escapes."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


def log_dir_for(base: PurePath, req: JobRequest) -> PurePath:
    wildcards = safe_component(req.wildcards_str) if req.wildcards else "_"
    return base / f"rule_{safe_component(req.rule)}" / wildcards


def sbatch_options(req: JobRequest, ctx: ScriptContext) -> list[str]:
    return [
        f"--job-name={safe_component(ctx.job_name, 120)}",
        f"--comment=rule_{safe_component(req.rule)}_wildcards_{safe_component(req.wildcards_str or '_')}",
        f"--output={JobFiles.of(Path(ctx.log_dir), '%j', req.attempt).log}",
        *resource_options(req),
    ]


def resource_options(req: JobRequest) -> list[str]:
    """What a job asks SLURM for; jobs of one rule that ask for the same may go as one job array."""
    opts = [
        "--open-mode=append",
        "--export=ALL",
        f"--nodes={req.allocated_nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={req.cpus_per_task}",
    ]
    if req.gpus:
        typed = f"{req.gpu_type}:" if req.gpu_type else ""
        opts.append(f"--gres=gpu:{typed}{req.gpus}" if req.gpu_flag == "gres" else f"--gpus-per-node={typed}{req.gpus}")
    optional = [
        ("--partition", req.partition),
        ("--account", req.account),
        ("--qos", req.qos),
        ("--reservation", req.reservation),
        ("--time", req.runtime_min),
        ("--mem", req.mem_mb and f"{req.mem_mb}M"),
        ("--mem-per-cpu", req.mem_mb_per_cpu and f"{req.mem_mb_per_cpu}M"),
        ("--constraint", req.constraint),
        ("--nodelist", req.nodelist),
        ("--exclude", req.exclude),
        ("--signal", req.signal),
    ]
    opts += [f"{flag}={value}" for flag, value in optional if value]
    if req.spare_nodes:  # a node's failure must not end the allocation: the launcher swaps in a spare
        opts.append("--no-kill")
    # SLURM may always requeue the job (an admin's `scontrol requeue`, a preemption): --multinode-max-requeues bounds
    # only the job's own requeues, which the job script counts. With --no-requeue SLURM refuses an admin's requeue
    # ("Requested operation is presently disabled") and cancels a preempted job instead of requeueing it.
    opts.append("--requeue")
    opts += list(req.slurm_extra)
    return opts


def render_array(req: JobRequest, name: str, scripts: Sequence[Path]) -> str:
    """The script of a job array whose element i runs scripts[i], each a job script as `render` writes it."""
    opts = [
        f"--job-name={safe_component(name, 120)}",
        f"--comment=rule_{safe_component(req.rule)}_array",
        "--output=/dev/null",  # each element writes its own log
        f"--array=0-{len(scripts) - 1}",
        *resource_options(req),
    ]
    elements = "\n".join(
        f'    {i}) export {protocol.ARRAY_KEY_VAR}="${{SLURM_ARRAY_JOB_ID}}_{i}"; exec bash {shell_quote(str(path))} ;;'
        for i, path in enumerate(scripts)
    )
    values = {
        "title": inert(f"Snakemake rule {req.rule}: a job array of {len(scripts)} jobs"),
        "sbatch": _sbatch_lines(opts),
        "elements": elements,
    }
    template = resources.files(__package__).joinpath("templates", "array.sh").read_text()
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def _sbatch_lines(opts: list[str]) -> str:
    lines = []
    for opt in opts:
        # Extra flags from the user may hold spaces; sbatch's #SBATCH parser honours double quotes.
        flag, sep, value = opt.partition("=")
        if sep and (not value or re.search(r"[\s\"'\\$`]", value)):
            value = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        lines.append(f"#SBATCH {flag}{sep}{value}")
    return "\n".join(lines)


def signal_name(signal: str | None) -> str | None:
    """The name (or number) of the rule's pre-time-limit signal, [B:|R:]NAME|NUMBER[@lead]; None without one."""
    return None if signal is None else signal.split(":", 1)[-1].split("@", 1)[0].removeprefix("SIG")


def checkpointed(signal: str | None) -> str:
    """What the log says when the training asked for a requeue: after the rule's pre-time-limit signal (the one its
    checkpoint handler answers; SLURM tells the job no signal name, so the plan's is the one to say)."""
    name = signal_name(signal)
    if name is None:
        return "checkpointed without a pre-time-limit signal"
    return f"checkpointed after signal {name}" if name.isdigit() else f"checkpointed after SIG{name}"


def gpu_sampler(seconds: int) -> str:
    """What each node's task of the sampler step runs: nvidia-smi into the node's file, where the node has it. It
    starts with USR1 and USR2 ignored: the signal before the time limit goes to every step's task (to every process
    of a step under proctrack/linuxproc), and their default action would end the samples at the checkpoint."""
    node_file = ShellJobFiles(f'"${protocol.GPU_SAMPLES_VAR}"').gpu_samples('"$SLURMD_NODENAME"')
    sampler = shlex.join(protocol.gpu_sampler(seconds))
    return f'command -v nvidia-smi >/dev/null || exit 0; trap "" USR1 USR2; exec {sampler} >>{node_file}'


def render(req: JobRequest, ctx: ScriptContext, environment: list[str]) -> str:
    q = shlex.quote
    values = {
        **_contract_values(),
        **_file_values(req, ctx),
        "title": inert(ctx.title or f"Snakemake rule {req.rule} {req.wildcards_str}".strip()),
        "sbatch": _sbatch_lines(sbatch_options(req, ctx)),
        "rule_q": q(req.rule),
        "job_name": q(ctx.job_name),
        "attempt": str(req.attempt),
        "environment": "\n".join(environment) if environment else "# (no environment profile)",
        "master_port": str(req.master_port) if req.master_port else protocol.master_port_shell(),
        # the training's checkpoint signal (a preemption is passed on as it): the rule's, else the contract's USR2
        "checkpoint_signal": q(signal_name(req.signal) or "USR2"),
        "crash_loop_runs": str(req.crash_loop_runs),
        "crash_loop_seconds": str(req.crash_loop_s),
        "nodes": str(req.nodes),
        "gpus": str(req.gpus),
        "cpus_per_task": str(req.cpus_per_task),
        "omp_threads": str(req.omp_threads),
        "threads": str(req.threads),
        "workdir": shell_quote(str(ctx.workdir)),
        "command": f"bash -c {q(ctx.command)}",
        "max_requeues": str(req.max_requeues),
        "checkpointed": checkpointed(req.signal),
        "launcher_variables": "export " + " ".join(f"{k}={q(v)}" for k, v in req.launcher_variables().items()),
        "code": inert(ctx.code or "as the command names it"),
        "versions_in_job": "1" if ctx.versions_in_job else "0",
        "run_id": ctx.tracking_id,
        "code_digest": q(ctx.code_digest[:12]),
        "gpu_sample_seconds": str(ctx.gpu_sample_s if req.gpus else 0),  # >= 0: the planner refuses less
        "gpu_sampler": q(gpu_sampler(max(1, ctx.gpu_sample_s))),  # rendered even when off (0): never runs
    }
    template = resources.files(__package__).joinpath("templates", "job.sh").read_text()

    def fill(match: re.Match[str]) -> str:
        return values[match.group(1)]  # a KeyError here is a template bug, never user input

    return _PLACEHOLDER.sub(fill, template)


def _contract_values() -> dict[str, str]:
    """The markers' shell names and the exit codes: the same in every job script."""
    return {
        "restart_suffix": ShellJobFiles.restart_suffix("$SLURM_RESTART_COUNT"),
        "exit_marker": marker_shell(EXIT_MARKER),
        "preempt_marker": marker_shell(PREEMPT_MARKER),
        "preempt_notice_marker": marker_shell(PREEMPT_NOTICE_MARKER),
        "cancel_marker": marker_shell(CANCEL_MARKER),
        "failed_node_marker": marker_shell(FAILED_NODE_MARKER),
        "requeue_marker": marker_shell(REQUEUE_MARKER),
        "stall_marker": marker_shell(STALL_MARKER),
        "self_requeue_marker": marker_shell(SELF_REQUEUE_MARKER),
        "crash_marker": marker_shell(CRASH_MARKER),
        "exit_crash_loop": str(protocol.EXIT_CRASH_LOOP),
        "exit_preempted": str(protocol.EXIT_PREEMPTED),
        "exit_unrecorded": str(protocol.EXIT_UNRECORDED),
        "exit_code_changed": str(protocol.EXIT_CODE_CHANGED),
    }


def _file_values(req: JobRequest, ctx: ScriptContext) -> dict[str, str]:
    """Where the job's logs, records and state go, as the job script's shell words."""
    first_run = ShellJobFiles.of(shlex.quote(str(ctx.log_dir)), req.attempt)
    # absolute: the training may change folders before it writes there
    kept = ShellJobFiles.of(shell_quote(str(ctx.workdir / ctx.log_dir)), req.attempt)
    this_run = ShellJobFiles.this_run()
    return {
        "log_stem": first_run.prefix,
        "this_log": this_run.log,
        "node_out": this_run.node_out("<node>"),
        "metrics_file": kept.metrics,
        "state_dir": shell_quote(str(ctx.state_dir)),
        "code_manifest": shell_quote(str(ctx.code_manifest or "/dev/null/none")),
        "runs_file": kept.runs,
        "tensorboard_dir": shell_quote(str(tensorboard_dir(ctx.workdir / ctx.log_dir, ctx.tracking_id))),
        "replacements_file": first_run.replacements,
        "gpu_samples": kept.prefix,
        "gpu_samples_file": ShellJobFiles(f'"${protocol.GPU_SAMPLES_VAR}"').gpu_samples("<node>"),  # a comment: no path
    }
