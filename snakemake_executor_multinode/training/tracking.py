"""One experiment across requeues: what a training script does with $MULTINODE_RUN_ID (docs/training-contract.md).

Every run of a job (the first, each requeue and SLURM restart, each relaunch after a spare replaced a node, every
Snakemake retry of the same outputs in one Snakemake run) gets the same $MULTINODE_RUN_ID, and the same
$MULTINODE_TENSORBOARD_DIR. The job script also sets WANDB_RUN_ID to it and WANDB_RESUME=allow where the user has
not set WANDB_RUN_ID, so `wandb.init()` continues the run by itself. MLflow has no variable to resume a run by a
name: `mlflow_run` finds the run tagged multinode.run_id=<id> in the experiment, or creates it.

`Trackers.open` does all of it for a script's rank 0: TensorBoard (when the `tensorboard` package is installed),
Weights & Biases (when `wandb` is installed and WANDB_MODE, WANDB_PROJECT or WANDB_API_KEY says it is wanted) and
MLflow (when `mlflow` is installed and MLFLOW_TRACKING_URI is set). A tracker that fails is warned of once and left
off: it never fails the training. Standard library only; each tracker is imported when it is used.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from snakemake_executor_multinode.contract.protocol import (
    CODE_DIGEST_VAR,
    JOB_KEY_VAR,
    MLFLOW_RUN_TAG,
    RELAUNCH_VAR,
    RUN_ID_VAR,
    TENSORBOARD_DIR_VAR,
)

Metrics = Mapping[str, float | None]


def tags(env: Mapping[str, str]) -> dict[str, str]:
    """What a tracker records of this run of the job (each run overwrites the last's): the experiment, the SLURM job,
    its nodes, its restart count, the relaunch, the frozen code's snapshot. Empty values left out."""
    found = {
        MLFLOW_RUN_TAG: env.get(RUN_ID_VAR, ""),
        "multinode.job": env.get(JOB_KEY_VAR, ""),
        "slurm.job_id": env.get("SLURM_JOB_ID", ""),
        "slurm.nodes": env.get("SLURM_JOB_NODELIST", ""),
        "slurm.restart_count": env.get("SLURM_RESTART_COUNT", "0") if env.get("SLURM_JOB_ID") else "",
        "multinode.relaunch": env.get(RELAUNCH_VAR, ""),
        "multinode.code_digest": env.get(CODE_DIGEST_VAR, ""),
    }
    return {k: v for k, v in found.items() if v}


def mlflow_run(mlflow: Any, env: Mapping[str, str]) -> Any:
    """Start (or continue) the experiment's MLflow run: the run of the current experiment tagged with this
    $MULTINODE_RUN_ID, created on the first run of the job. A user's own MLFLOW_RUN_ID wins (mlflow reads it)."""
    run_id = env.get(RUN_ID_VAR, "")
    if env.get("MLFLOW_RUN_ID") or not run_id:
        return mlflow.start_run()
    if name := env.get("MLFLOW_EXPERIMENT_NAME"):
        experiment = mlflow.set_experiment(experiment_name=name)
    elif given := env.get("MLFLOW_EXPERIMENT_ID"):
        experiment = mlflow.set_experiment(experiment_id=given)
    else:
        experiment = mlflow.set_experiment(experiment_name="Default")
    found = mlflow.search_runs(
        experiment_ids=[experiment.experiment_id],
        filter_string=f"tags.`{MLFLOW_RUN_TAG}` = '{run_id}'",
        output_format="list",
        max_results=1,
    )
    if found:
        return mlflow.start_run(run_id=found[0].info.run_id)
    return mlflow.start_run(experiment_id=experiment.experiment_id, run_name=run_id, tags={MLFLOW_RUN_TAG: run_id})


def wandb_wanted(env: Mapping[str, str]) -> bool:
    mode = env.get("WANDB_MODE", "")
    return mode != "disabled" and bool(mode or env.get("WANDB_PROJECT") or env.get("WANDB_API_KEY"))


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


class Sink(Protocol):
    name: str

    def log(self, metrics: Metrics, step: int) -> None: ...

    def close(self) -> None: ...


@dataclass
class TensorBoard:
    folder: str
    first_step: int  # the first step this run logs: a resumed run's steps from here on replace the lost ones
    name: str = "TensorBoard"

    def __post_init__(self) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        # purge_step: a run resumed from an earlier checkpoint than its last logged step hides the steps it computes
        # again, so that the curve never goes back
        self.writer = SummaryWriter(self.folder, purge_step=self.first_step or None)

    def log(self, metrics: Metrics, step: int) -> None:
        for key, value in metrics.items():
            if value is not None:
                self.writer.add_scalar(key, value, step)
        self.writer.flush()  # a requeue ends the process at any time: the curve so far is on disk

    def close(self) -> None:
        self.writer.close()


def present(metrics: Metrics) -> dict[str, float]:
    """The metrics that have a value (mfu is None where the GPU's peak is not known)."""
    return {k: float(v) for k, v in metrics.items() if v is not None}


class WandB:
    """The job's one W&B run: wandb.init reads its id and resume mode from the job's WANDB_* variables."""

    name = "W&B"

    def __init__(self, env: Mapping[str, str], config: Mapping[str, Any]) -> None:
        self.run = importlib.import_module("wandb").init(config=dict(config))
        self.run.config.update(tags(env), allow_val_change=True)  # this run's job, nodes and restart count

    def log(self, metrics: Metrics, step: int) -> None:
        self.run.log(present(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class MLflow:
    """The job's one MLflow run, found again by its tag (mlflow_run); params written by the first run only (MLflow
    refuses to change a param)."""

    name = "MLflow"

    def __init__(self, env: Mapping[str, str], config: Mapping[str, Any]) -> None:
        self.mlflow = importlib.import_module("mlflow")
        mlflow_run(self.mlflow, env)
        self.mlflow.set_tags(tags(env))
        if env.get("SLURM_RESTART_COUNT", "0") == "0" and config:
            self.mlflow.log_params(dict(config))

    def log(self, metrics: Metrics, step: int) -> None:
        self.mlflow.log_metrics(present(metrics), step=step)

    def close(self) -> None:
        self.mlflow.end_run()


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Trackers:
    """The trackers a rank-0 training logs its curves to; each failure is said once and turns that tracker off."""

    sinks: list[Sink] = field(default_factory=list)
    warn: Callable[[str], None] = _stderr

    @classmethod
    def open(
        cls,
        first_step: int = 0,
        config: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        warn: Callable[[str], None] = _stderr,
    ) -> Trackers:
        env = os.environ if env is None else env
        made = cls(warn=warn)
        folder = env.get(TENSORBOARD_DIR_VAR, "")
        if folder and installed("tensorboard"):  # optional: without it, quietly none
            made._start("TensorBoard", lambda: TensorBoard(folder, first_step))
        if wandb_wanted(env) and installed("wandb"):
            made._start("W&B", lambda: WandB(env, config or {}))
        if env.get("MLFLOW_TRACKING_URI") and installed("mlflow"):
            made._start("MLflow", lambda: MLflow(env, config or {}))
        return made

    def _start(self, name: str, make: Callable[[], Sink]) -> None:
        try:
            self.sinks.append(make())
        except Exception as err:  # noqa: BLE001 -- a tracker never fails the training
            self.warn(f"tracking: {name} is off for this run: {type(err).__name__}: {err}")

    def log(self, metrics: Metrics, step: int) -> None:
        for sink in list(self.sinks):
            self._guard(sink, functools.partial(sink.log, metrics, step))

    def close(self) -> None:
        for sink in list(self.sinks):
            self._guard(sink, sink.close)
        self.sinks.clear()

    def _guard(self, sink: Sink, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception as err:  # noqa: BLE001 -- a tracker never fails the training
            self.sinks.remove(sink)
            self.warn(f"tracking: {sink.name} failed and is off for the rest of this run: {type(err).__name__}: {err}")

    @property
    def names(self) -> list[str]:
        return [sink.name for sink in self.sinks]
