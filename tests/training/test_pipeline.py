"""The whole chain on CPU: preprocess -> train (torch_ddp, 2 ranks, torchrun) -> evaluate."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import checkpoint
import lm
import pytest
import torch

from .helpers import SCRIPTS, TINY, metrics, run, train

CHAIN = {**TINY, "plugin": "torch_ddp", "steps": 40, "lr": 1e-2, "warmup": 4, "log_every": 2, "ckpt_every": 15}


@pytest.mark.slow
def test_preprocess_train_evaluate_produces_model_metrics_eval_and_plot_and_loss_decreases(
    tmp_path: Path, data_dir: Path
) -> None:
    out = tmp_path / "run"
    proc = train(out, data_dir, CHAIN)
    assert "step 40/40 loss" in proc.stdout

    # Metrics: one line per log_every steps, rank 0 only, loss going down.
    rows = metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(2, 41, 2))
    assert {"step", "loss", "lr", "tokens", "tokens_per_s", "mfu", "elapsed"} <= set(rows[0])
    assert rows[-1]["tokens"] == 40 * 2 * 4 * 64  # steps * dp ranks * micro_batch * seq_len
    assert rows[-1]["loss"] < rows[0]["loss"] - 1.0
    assert rows[0]["loss"] == pytest.approx(math.log(lm.DATA_VOCAB), abs=0.3)  # starts near uniform

    # Checkpoints: every 15 steps and at the end, last two kept.
    assert [s for s, _ in checkpoint.complete_checkpoints(out / "ckpt")] == [30, 40]

    # Final model: a plain file that loads on CPU in one process.
    blob = torch.load(out / "model.pt", map_location="cpu", weights_only=False)
    assert blob["step"] == 40 and blob["model_config"]["d_model"] == TINY["d_model"]
    lm.load_final_model(out / "model.pt")

    proc = run(
        [
            sys.executable,
            str(SCRIPTS / "evaluate.py"),
            "--model",
            str(out / "model.pt"),
            "--data-dir",
            str(data_dir),
            "--metrics-in",
            str(out / "metrics.jsonl"),
            "--out-json",
            str(out / "eval.json"),
            "--plot",
            str(out / "loss.png"),
        ]
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "eval.json").read_text())
    assert result["val_loss"] < math.log(lm.DATA_VOCAB) - 1.0
    assert result["val_ppl"] == pytest.approx(math.exp(result["val_loss"]))
    assert result["tokens_scored"] > 0 and result["model_step"] == 40
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
