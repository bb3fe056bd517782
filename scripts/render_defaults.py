"""Render README.md's table "Defaults that act on your job" from the code's own constants and settings.

    python scripts/render_defaults.py           # rewrite the table between the markers in README.md
    python scripts/render_defaults.py --check   # exit 1 when the table differs from what the code says

Each row's value is read from where the code keeps it (a setting's declaration, a module's constant, the built-in
profiles, the launcher's srun line); the words around it are here. The table sits between `<!-- defaults-table -->`
and `<!-- /defaults-table -->` on lines of their own; tests/process/test_defaults_table.py fails while it differs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # marked_block.py beside it, also when a test imports this
import marked_block  # noqa: E402
from marked_block import cell  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "README.md"
BEGIN, END = "<!-- defaults-table -->", "<!-- /defaults-table -->"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def rows() -> list[tuple[str, str, str]]:
    """(the default, what it does to your job, how to change it), each value from the code."""
    sys.path.insert(0, str(ROOT))
    from snakemake_executor_multinode.session import Settings

    s = Settings()
    return [*_training_rows(s), *_node_rows(s), *_run_rows(s)]


def _training_rows(s: Any) -> list[tuple[str, str, str]]:
    """What watches, restarts, checkpoints and requeues a training."""
    from snakemake_executor_multinode.contract import protocol
    from snakemake_executor_multinode.launching import stall
    from snakemake_executor_multinode.planning import launcher_resources

    launch = launcher_resources.LauncherResources()
    signal_name, signal_lead = s.signal.split("@")
    return [
        (
            f"stall watchdog: adaptive ({stall.PACE_FACTOR:g}x the recent interval between step lines, at least "
            f"{stall.PACE_FLOOR_S:g} s; {_minutes(stall.LONG_S)} before the second step line), "
            f"{launcher_resources.DEFAULT_MAX_RESTARTS} in-job restarts, "
            f"`on_stall={launch.on_stall}` (multi-node jobs that run `multinode torchrun`)",
            "no new line from any rank and no metrics line for that long: every rank's Python stack goes into the log "
            "(py-spy) and the step ends; a crash or stall on nodes that answer restarts in the job, from the "
            f"checkpoint; past the restarts the job ends with exit {protocol.EXIT_STALLED}, naming the odd rank",
            'resource `stall_timeout` (`"2h"`, `"off"`), `max_restarts`, `on_stall="requeue"`; '
            "[restarts.md](docs/restarts.md)",
        ),
        (
            f"node check before every launch and relaunch ({protocol.NODE_CHECK_DEFAULT_S} s limit)",
            "one short step on every node: `nvidia-smi -L` lists the GPUs SLURM granted (where nvidia-smi exists), "
            "then the profile's own command; a failing node is replaced by a spare or named for the retry to exclude",
            "profile `node_check: false`, or `{command: ..., timeout: ...}`; "
            "[environment-profiles.md](docs/environment-profiles.md)",
        ),
        (
            f"GPU sampler every {s.gpu_sample_seconds} s (jobs with GPUs)",
            "a step of its own runs `nvidia-smi` on every node into `<jobid>.attempt<n>.<node>.gpu.csv` beside the "
            "log; `multinode status` and `multinode report` show each node's mean utilisation and peak memory",
            "`--multinode-gpu-sample-seconds` (0: none)",
        ),
        (
            f"code snapshot `{s.snapshot}`",
            "the workflow's code is frozen at submission and the rule's command is rewritten to run the frozen "
            "scripts: every requeue and restart runs the code the job was submitted with",
            "`--multinode-snapshot` (files or folders, or `off`: a restart whose code changed stops)",
        ),
        (
            f"signal `{s.signal}` (GPU or multi-node jobs)",
            f"SIG{signal_name} {signal_lead} s before the time limit to torchrun's workers, the ranks (not torchrun's "
            "agent, not the ranks' own children such as DataLoader workers): your script checkpoints and writes "
            "`$MULTINODE_PREEMPT_FILE`",
            "resource `signal` (`none`: no signal), `--multinode-signal`; "
            "[training-contract.md](docs/training-contract.md)",
        ),
        (
            f"{s.max_requeues} requeues",
            "a job whose training checkpointed on the signal requeues itself at most this often, then ends with exit "
            f"{protocol.EXIT_PREEMPTED} for Snakemake's `--retries`; preemptions and admin requeues do not count",
            "`--multinode-max-requeues`",
        ),
        (
            f"crash loop: {s.crash_loop_runs} runs, each failed within {s.crash_loop_seconds:g} s of its start",
            f"a job SLURM keeps running again (RequeueExit, node failures) ends with exit {protocol.EXIT_CRASH_LOOP}",
            "`--multinode-crash-loop-runs` (0: no bound), `--multinode-crash-loop-seconds`",
        ),
    ]


def _node_rows(s: Any) -> list[tuple[str, str, str]]:
    """What happens to a failed, slow or broken node, and to the jobs at Ctrl-C."""
    from snakemake_executor_multinode.launching import launcher
    from snakemake_executor_multinode.launching.allocation import Allocation
    from snakemake_executor_multinode.planning import environment, launcher_resources

    ib = environment.load_profiles().profiles["infiniband"]
    srun = launcher.srun_command(Allocation("1", ("n1", "n2"), 8, 64, "10.0.0.1", 20004), [], ["train.py"])
    kill_on_bad_exit = next(a for a in srun if a.startswith("--kill-on-bad-exit"))
    launch = launcher_resources.LauncherResources()
    return [
        (
            f"one node fails, the others stop (`srun {kill_on_bad_exit}`)",
            "the launcher names the failing node and returns at most "
            f"{launcher.STOP_WAIT_S:g} s later; the retry (`--retries`) leaves that node out",
            "not a setting; `spare_nodes` replaces the node inside the job instead",
        ),
        (
            f"Ctrl-C cancels this run's jobs, a running training after its checkpoint (at most "
            f"{s.cancel_checkpoint_seconds:g} s); with `--immediate-submit` a failed job cancels its dependants",
            "`scancel` of every job this run submitted, and of none other; a training (a `multinode torchrun` step) is "
            "asked to checkpoint first and resumes at the next run, a second Ctrl-C cancels at once; dependants "
            "submitted ahead carry `--dependency=afterok:...` and `--kill-on-invalid-dep=yes`, so none waits for an "
            "input that never comes",
            "`--multinode-cancel-checkpoint-seconds` (0: at once); [preemption.md](docs/preemption.md)",
        ),
        (
            "`spare_nodes=0`",
            "spares are asked for with the job (`nodes + spare_nodes` nodes, `--no-kill`) and billed for the whole "
            "job while they wait idle, until one replaces a failed, hung or slow node",
            "resource `spare_nodes`; [further.md](docs/further.md#spare-nodes)",
        ),
        (
            f"stragglers: `on_straggler={launch.on_straggler}` at "
            f"{launcher_resources.DEFAULT_STRAGGLER_FACTOR:g}x the other nodes' busy time for "
            f"{_minutes(launcher_resources.DEFAULT_STRAGGLER_WINDOW_S)}",
            "the slow node is named in the log and by `multinode status`; the training goes on",
            "resources `on_straggler` (`replace`: a spare takes its place), `straggler_factor`, `straggler_window`",
        ),
        (
            f"network preflight in the `infiniband` profile ({environment.network_check_seconds(ib['network_check'])}"
            " s limit)",
            "one tiny all-reduce over every rank before the training: a broken link fails the job in seconds, naming "
            "the node",
            "profile `network_check: false` or `{timeout: S}`; [network-preflight.md](docs/network-preflight.md)",
        ),
    ]


def _run_rows(s: Any) -> list[tuple[str, str, str]]:
    """What the run shows and keeps, and what every job's environment holds."""
    from snakemake_executor_multinode.planning import environment

    variables = ", ".join(f"`{k}={v}`" for k, v in environment.DEFAULT_VARS.items())
    return [
        (
            f"progress line every {s.progress_seconds:g} s",
            "Snakemake's output gets `step N/M loss ... tok/s mfu ...% ETA ...` per running training job, from its "
            "metrics file",
            "`--multinode-progress-seconds` (0: none)",
        ),
        (
            "reattach" if not s.no_reattach else "no reattach",
            "a rerun after a killed Snakemake adopts the job an earlier run submitted for the same outputs while SLURM "
            "holds it, or takes its result when it succeeded",
            "`--multinode-no-reattach`",
        ),
        (
            "job arrays" if not s.no_arrays else "no job arrays",
            "single-node jobs of one rule that ask SLURM for the same go as one job array, each element with its own "
            "log and markers",
            "`--multinode-no-arrays`",
        ),
        (
            variables,
            "exported in every job, before the rule's command",
            "a profile's `env:` (a `null` unsets it)",
        ),
        (
            "`OMP_NUM_THREADS` = the node's CPUs / its processes",
            "`multinode torchrun` sets it for its workers (`cpus_per_task // gpus`)",
            "resource `cpus_per_task`",
        ),
    ]


def table() -> str:
    lines = ["| default | what it does to your job | to change it |", "|---|---|---|"]
    lines += [f"| {cell(a)} | {cell(b)} | {cell(c)} |" for a, b, c in rows()]
    return "\n".join(lines) + "\n"


def render(text: str) -> str:
    """`text` with the block between the markers replaced by the table; an error when the markers are missing."""
    return marked_block.render(text, DOC, BEGIN, END, table)


def main(argv: list[str] | None = None) -> int:
    return marked_block.main(argv, __doc__.split("\n")[0], DOC, render, "scripts/render_defaults.py")


if __name__ == "__main__":
    sys.exit(main())
