"""How a run watches its jobs, as settings (`--multinode-<name>`): the status cycle, the sweeps, reattach, waiting
notices, progress lines, the efficiency report, the notify command. Declared by the stage that reads them; session.py
composes them into the plugin's `Settings`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from snakemake_executor_multinode.contract.jobfiles import REPORTS_DIR


@dataclass(frozen=True)
class WatchSettings:
    """The settings of watching a run's jobs."""

    status_seconds: float = field(
        default=0.5,
        metadata={
            "help": "Seconds between status cycles; a cycle reads completion markers only (no SLURM query). A job's "
            "exit marker that lands in the state folder starts the next cycle at once (inotify, where the folder's "
            "writes are seen from this host)."
        },
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
    efficiency_report: bool = field(
        default=False,
        metadata={
            "help": "At the end of the run, write an efficiency report from sacct (time, CPU, memory used against "
            "requested, GPU-hours; suggestions for rules that waste more than half) to "
            f"{REPORTS_DIR}/<run>.{{csv,md}} and print its summary."
        },
    )
    pending_notice_seconds: float = field(
        default=300.0,
        metadata={
            "help": "Once a job has waited this long in the queue, say once why, in plain words with what to do "
            "(SLURM's pending reason, read by the status sweeps); `multinode status` always shows it."
        },
    )
    progress_seconds: float = field(
        default=60.0,
        metadata={
            "help": "At most one progress line (step, loss, tokens/s, ETA) per running training job every this many "
            "seconds, read from the job's metrics file ($MULTINODE_METRICS_FILE; no SLURM query). 0: none."
        },
    )
    cancel_checkpoint_seconds: float = field(
        default=120.0,
        metadata={
            "help": "Snakemake's first Ctrl-C asks each running training (a multinode torchrun step) to checkpoint, "
            "as at the time limit, and cancels it once it has ended or after this many seconds; other jobs are "
            "cancelled at once. A second Ctrl-C cancels everything at once. 0: the first Ctrl-C cancels at once."
        },
    )
    notify: Optional[str] = field(
        default=None,
        metadata={
            "help": "A command (shell words, run without a shell on the submitting side) run for each event: a job "
            "started, stalled, requeued, node replaced, failed, finished, and the run finished. It reads one JSON "
            "object on stdin (event, run, job, rule, nodes, reason, log, time); secrets such as a webhook URL come "
            "from its environment, never its command line. One that fails or hangs is warned of once; the run goes on."
        },
    )
    notify_timeout: float = field(
        default=10.0,
        metadata={"help": "Seconds a --multinode-notify command may take per event before it is killed."},
    )
