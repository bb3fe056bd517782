"""One experiment across requeues (issue 39): the run id every run of a job shares, what the job script exports for
the trackers, the helper a training logs through (training/tracking.py), where `multinode status` says the curves
are.
The tests that start processes: tests/process/training/test_tracking.py."""

from __future__ import annotations

from pathlib import Path

from snakemake_executor_multinode.contract.jobfiles import JobFiles, tensorboard_dir
from snakemake_executor_multinode.slurm.client import SlurmClient
from snakemake_executor_multinode.training import tracking
from snakemake_executor_multinode.watching import status_view
from tests.helpers import FakeSlurm, record


def test_tags_name_the_experiment_the_slurm_job_its_nodes_restarts_and_the_snapshot():
    env = {
        "MULTINODE_RUN_ID": "abc", "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_RESTART_COUNT": "2",
        "MULTINODE_CODE_DIGEST": "0123456789ab", "MULTINODE_JOB_KEY": "42",
    }  # fmt: skip
    assert tracking.tags(env) == {
        "multinode.run_id": "abc", "multinode.job": "42", "slurm.job_id": "42", "slurm.nodes": "n[1-2]",
        "slurm.restart_count": "2", "multinode.code_digest": "0123456789ab",
    }  # fmt: skip
    assert tracking.tags({}) == {}  # outside a job: nothing made up


class Failing:
    name = "Broken"

    def __init__(self) -> None:
        self.calls = 0

    def log(self, metrics: tracking.Metrics, step: int) -> None:
        self.calls += 1
        raise RuntimeError("server gone")

    def close(self) -> None:
        raise AssertionError("a failed tracker is not closed again")


class Kept:
    name = "Kept"

    def __init__(self) -> None:
        self.steps: list[int] = []

    def log(self, metrics: tracking.Metrics, step: int) -> None:
        self.steps.append(step)

    def close(self) -> None:
        pass


def test_a_failing_tracker_is_warned_of_once_and_left_off_while_the_others_go_on():
    said: list[str] = []
    broken, kept = Failing(), Kept()
    trackers = tracking.Trackers([broken, kept], warn=said.append)
    for step in range(3):
        trackers.log({"loss": 1.0}, step)
    trackers.close()
    assert broken.calls == 1 and kept.steps == [0, 1, 2]
    assert said == ["tracking: Broken failed and is off for the rest of this run: RuntimeError: server gone"]
    opened = tracking.Trackers(warn=said.append)
    opened._start("W&B", lambda: (_ for _ in ()).throw(ValueError("no key")))
    assert opened.names == [] and said[-1] == "tracking: W&B is off for this run: ValueError: no key"


def test_without_a_configured_tracker_nothing_is_opened():
    assert tracking.Trackers.open(env={}).names == []
    assert not tracking.wandb_wanted({"WANDB_MODE": "disabled", "WANDB_PROJECT": "p"})
    assert tracking.wandb_wanted({"WANDB_MODE": "offline"}) and tracking.wandb_wanted({"WANDB_PROJECT": "p"})


def test_status_says_where_a_trainings_curves_are(tmp_path):
    run = "aaaa1111"
    train = record(tmp_path, run, "train", "440", at=1.0, tracking_id="0123456789abcdef")
    record(tmp_path, run, "fanout", "448", at=2.0, tracking_id="fedcba9876543210")  # 1 node, no GPU, no curves
    folder = Path(tensorboard_dir(JobFiles.from_log(train.log).prefix.parent, "0123456789abcdef"))
    squeue = "440|RUNNING|None|2|0:13|30:00|2|gres:gpu:2|\n448|RUNNING|None|0|0:13|30:00|1|N/A|\n"
    fake = FakeSlurm(sacct=(1, "", "sacct: error: Slurm accounting storage is disabled"), squeue=(0, squeue, ""))
    rows = status_view.collect(tmp_path, status_view.run_table(tmp_path)[run], SlurmClient(runner=fake))
    text = status_view.render(run, rows, tmp_path)
    assert "train (job 440): run 0123456789abcdef, TensorBoard none written yet" in text, text
    assert "fedcba9876543210" not in text
    folder.mkdir(parents=True)
    rows = status_view.collect(tmp_path, status_view.run_table(tmp_path)[run], SlurmClient(runner=fake))
    shown = status_view.render(run, rows, tmp_path)
    assert f"run 0123456789abcdef, TensorBoard {folder.relative_to(tmp_path)}" in shown
