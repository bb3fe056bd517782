"""train.py logs its curves where people look (issue 39, part 3): loss, lr, throughput and step time in
$MULTINODE_TENSORBOARD_DIR, one curve across a stop and a resume; a tracker that fails is warned of once and the
training goes on."""

from __future__ import annotations

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.training.helpers import ENV, SCRIPTS, TINY, run, torchrun_argv, train_argv

pytestmark = pytest.mark.slow

STEPS, STOP = 6, 3


def test_train_logs_one_tensorboard_curve_across_a_resume_and_a_failing_tracker_never_fails_it(tmp_path, data_dir):
    tb = tmp_path / "tb"
    # MLflow is configured but unreachable: its failure must not fail the training
    env = {**ENV, "MULTINODE_TENSORBOARD_DIR": str(tb), "MLFLOW_TRACKING_URI": "nowhere-scheme://x"}
    for stop in (STOP, None):  # a run stopped (and checkpointed) at STOP, then the same command resumes it
        cfg = {**TINY, "steps": STEPS, "stop_after": stop}
        proc = run(torchrun_argv(SCRIPTS / "train.py", *train_argv(tmp_path, data_dir, cfg)), env=env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        warned = [line for line in proc.stderr.splitlines() if "tracking: MLflow" in line]
        assert len(warned) == 1 and "is off for this run" in warned[0], proc.stderr[-3000:]
    curves = EventAccumulator(str(tb))
    curves.Reload()
    assert {"loss", "lr", "tokens_per_s", "step_ms"} <= set(curves.Tags()["scalars"])
    for tag in ("loss", "lr", "tokens_per_s", "step_ms"):
        assert [e.step for e in curves.Scalars(tag)] == list(range(1, STEPS + 1)), tag
