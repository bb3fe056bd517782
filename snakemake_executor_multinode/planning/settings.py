"""Planning's settings, declared once: `--multinode-<name>`, `multinode-<name>:` in a profile,
`SNAKEMAKE_MULTINODE_<NAME>`. Each stage declares the settings it reads (slurm/settings.py: submitting,
watching/settings.py: watching); session.py composes them into the one `Settings` from which the Snakemake adapter
builds its options. `multinode preview` takes its flags from these fields, and the request fills what a rule leaves
out from them: every default is read from its declaration. help_text and SettingsError serve every stage's settings.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, field
from typing import Any, Optional

from snakemake_executor_multinode.contract.jobfiles import GPU_SAMPLES, LOG, LOGS_DIR, SCRIPT, STEM_SHOWN


class SettingsError(ValueError):
    """A plugin setting that cannot be used; the message names the setting, the value and what is allowed."""


@dataclass(frozen=True)
class PlanningSettings:
    """The settings that shape a job's request and script (`--multinode-<name>`, `multinode-<name>:` in a profile,
    `SNAKEMAKE_MULTINODE_<NAME>`).

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
    profile_file: Optional[str] = field(
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
            "none: the profile file's `default:`."
        },
    )
    launchers: Optional[str] = field(
        default=None,
        metadata={
            "help": "Comma-separated commands (on PATH) that start a job's ranks on every node themselves, e.g. "
            "'accelerate,deepspeed': a multi-node or multi-GPU rule whose command runs one of them is accepted "
            "like one that runs `multinode torchrun`."
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
        default=str(LOGS_DIR),
        metadata={
            "help": "Folder (relative to the working directory) for job scripts and logs: "
            f"rule_<rule>/<wildcards>/{STEM_SHOWN}{LOG} and {SCRIPT}."
        },
    )
    max_requeues: int = field(
        default=3,
        metadata={
            "help": "How often a job that checkpointed on the pre-time-limit signal requeues itself (0: never; "
            "Snakemake's --retries then reruns it). Preemptions and admin requeues do not count."
        },
    )
    crash_loop_runs: int = field(
        default=3,
        metadata={
            "help": "A job whose runs fail this many times in a row, each within --multinode-crash-loop-seconds of "
            "its start, is not run again: it fails with its last error (0: no bound). Only a requeued failed run "
            "can loop (SLURM's RequeueExit, a node failure); SLURM's own SIGTERM (preemption, admin requeue, "
            "scancel) is not a failure here. Inside a run, this many failed launches in a row without a step "
            "beyond the first one's end the in-job restarts (resource max_restarts)."
        },
    )
    crash_loop_seconds: float = field(
        default=300.0,
        metadata={"help": "A run that fails within this many seconds of its start counts toward the crash loop."},
    )
    gpu_flag: str = field(
        default="gres",
        metadata={
            "help": "How GPUs per node are asked for: 'gres' (--gres=gpu[:type]:N) or 'gpus-per-node'.",
            "choices": ["gres", "gpus-per-node"],
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
    snapshot: str = field(
        default="git",
        metadata={
            "help": "The code every run of a job (first, requeue, restart) executes, frozen at submission: 'git' (the "
            "workflow repository's files git knows, with uncommitted changes), comma-separated files or folders "
            "(relative to the working directory; without git), or 'off' (a restart whose code changed stops)."
        },
    )
    gpu_sample_seconds: int = field(
        default=30,
        metadata={
            "help": "A job with GPUs samples every node's GPU utilisation and memory with nvidia-smi every this many "
            f"seconds, where the nodes have nvidia-smi, beside the job's log ({STEM_SHOWN}.<node>{GPU_SAMPLES}); "
            "`multinode status` and `multinode report` show each node's mean utilisation and peak memory. "
            "0: no sampling."
        },
    )


def help_text(f: Field[Any]) -> str:
    """A setting's help as every command line shows it: ending with its default."""
    default = f.default
    if isinstance(default, bool):
        shown = "on" if default else "off"
    elif default is None:
        shown = "none"
    elif isinstance(default, float) and default.is_integer():
        shown = str(int(default))
    else:
        shown = str(default)
    return f"{f.metadata['help']} (default: {shown})"
