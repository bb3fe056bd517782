"""Resume equality: N steps straight == K steps, stop, resume, N-K steps (model, optimizer, schedule, RNG)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import lm
import numpy as np
import pytest
import torch

from .helpers import TINY, metrics, train

STEPS, STOP = 8, 5


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in flatten(val, f"{prefix}/{key}").items()}
    if isinstance(obj, list | tuple):
        return {k: v for i, val in enumerate(obj) for k, v in flatten(val, f"{prefix}/{i}").items()}
    return {prefix: obj}


def assert_identical(a: Any, b: Any, what: str) -> None:
    fa, fb = flatten(a), flatten(b)
    assert fa.keys() == fb.keys(), what
    for key in fa:
        if isinstance(fa[key], torch.Tensor):
            assert torch.equal(fa[key], fb[key]), f"{what}{key} differs"
        elif isinstance(fa[key], np.ndarray):
            assert np.array_equal(fa[key], fb[key]), f"{what}{key} differs"
        else:
            assert fa[key] == fb[key], f"{what}{key}: {fa[key]!r} != {fb[key]!r}"


def load(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=False)


def assert_same_end_state(straight: Path, resumed: Path) -> None:
    a, b = straight / "ckpt" / f"step_{STEPS:08d}", resumed / "ckpt" / f"step_{STEPS:08d}"
    for part in ("model.bin", "optimizer.bin", "scheduler.bin", "rank00000.pt", "rank00001.pt"):
        assert_identical(load(a / part), load(b / part), part)
    final_a, final_b = load(straight / "model.pt"), load(resumed / "model.pt")
    assert_identical(final_a["state_dict"], final_b["state_dict"], "--out")
    # Metrics: appended after the resume, each step once, same losses and learning rates.
    ra, rb = metrics(straight / "metrics.jsonl"), metrics(resumed / "metrics.jsonl")
    assert [r["step"] for r in rb] == list(range(1, STEPS + 1))
    assert [(r["loss"], r["lr"], r["tokens"]) for r in ra] == [(r["loss"], r["lr"], r["tokens"]) for r in rb]


@pytest.mark.slow
def test_torch_ddp_stop_after_k_then_resume_equals_a_straight_run(tmp_path: Path, data_dir: Path) -> None:
    cfg = {**TINY, "plugin": "torch_ddp", "steps": STEPS, "grad_accum": 2, "lr": 3e-3}
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(straight, data_dir, cfg)

    proc = train(resumed, data_dir, {**cfg, "stop_after": STOP})  # same schedule, stops early
    assert f"stop_after: stopped at step {STOP}" in proc.stdout
    assert not (resumed / "model.pt").exists()  # no final model before the last step
    assert [s for s, _ in lm.complete_checkpoints(resumed / "ckpt")] == [STOP]
    proc = train(resumed, data_dir, cfg)
    assert f"at step {STOP}" in proc.stdout
    assert_same_end_state(straight, resumed)


@pytest.mark.slow
def test_hybrid_bf16_resume_from_a_mid_run_checkpoint_equals_the_straight_run(tmp_path: Path, data_dir: Path) -> None:
    # bf16 AMP keeps fp32 masters in the optimizer: a resume must restore them, not re-seed them from bf16.
    cfg = {
        **TINY,
        "plugin": "hybrid",
        "precision": "bf16",
        "steps": STEPS,
        "grad_accum": 2,
        "lr": 3e-3,
        "ckpt_every": STOP,
    }
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(straight, data_dir, cfg)
    assert [s for s, _ in lm.complete_checkpoints(straight / "ckpt")] == [STOP, STEPS]

    # A run that died after step STOP's checkpoint: its metrics already hold later steps.
    shutil.copytree(straight / "ckpt" / f"step_{STOP:08d}", resumed / "ckpt" / f"step_{STOP:08d}")
    shutil.copy(straight / "metrics.jsonl", resumed / "metrics.jsonl")
    proc = train(resumed, data_dir, cfg)
    assert f"at step {STOP}" in proc.stdout
    assert_same_end_state(straight, resumed)
