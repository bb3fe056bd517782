"""Sharded checkpoints and resume: N steps straight == K steps, stop, resume, N-K steps (model, optimizer,
schedule, RNG, fp32 masters), for every plugin that runs on CPU; resume on another world size; refusals."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import checkpoint
import lm
import numpy as np
import plugins
import pytest
import torch
from torch import nn

from .helpers import SCRIPTS, TINY, metrics, run, train, train_argv

STEPS, STOP = 8, 5
CPU_PLUGINS = [name for name, spec in plugins.PLUGIN_TABLE.items() if "cpu" in spec.devices]
# The configs whose resume is checked: every CPU plugin, and every precision that keeps fp32 masters apart from
# the model checkpoint (bf16 hybrid, torch_ddp's bf16_master): a resume must restore them, not re-seed them from bf16.
RESUME_CONFIGS: dict[str, dict[str, Any]] = {
    "torch_ddp": {"plugin": "torch_ddp", "grad_accum": 2},
    "torch_ddp_bf16_master": {"plugin": "torch_ddp", "precision": "bf16_master", "grad_accum": 2},
    "hybrid": {"plugin": "hybrid", "precision": "bf16", "grad_accum": 2},
}
CASES = list(RESUME_CONFIGS)


def keeps_masters_apart(case: str) -> bool:
    cfg = lm.merge_config(RESUME_CONFIGS[case])
    return plugins.masters_apart(cfg) and plugins.bf16_compute(cfg)


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


def files(step_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(step_dir)) for p in step_dir.rglob("*") if p.is_file())


def assert_sharded_layout(step_dir: Path, world: int) -> None:
    """The Booster's sharded format: an index per part, shard files, the scheduler file, one file per rank."""
    names = files(step_dir)
    for part in (checkpoint.MODEL, checkpoint.OPTIMIZER):
        assert (step_dir / part).is_dir(), names
        assert list((step_dir / part).glob("*.index.json")), names
    assert (step_dir / checkpoint.SCHEDULER).is_file()
    assert [n for n in names if n.startswith(checkpoint.RANKS)] == [
        f"{checkpoint.RANKS}/rank{r:05d}.pt" for r in range(world)
    ]
    assert json.loads((step_dir / checkpoint.META).read_text())["format"] == checkpoint.FORMAT


def assert_same_end_state(straight: Path, resumed: Path) -> None:
    a, b = straight / "ckpt" / f"step_{STEPS:08d}", resumed / "ckpt" / f"step_{STEPS:08d}"
    assert files(a) == files(b)
    for name in files(a):
        if name == checkpoint.META:
            continue  # holds the wall-clock time
        if name.endswith(".json"):
            assert json.loads((a / name).read_text()) == json.loads((b / name).read_text()), name
        else:
            assert_identical(load(a / name), load(b / name), name)
    final_a, final_b = load(straight / "model.pt"), load(resumed / "model.pt")
    assert_identical(final_a["state_dict"], final_b["state_dict"], "--out")
    # Metrics: appended after the resume, each step once, same losses and learning rates.
    ra, rb = metrics(straight / "metrics.jsonl"), metrics(resumed / "metrics.jsonl")
    assert [r["step"] for r in rb] == list(range(1, STEPS + 1))
    assert [(r["loss"], r["lr"], r["tokens"]) for r in ra] == [(r["loss"], r["lr"], r["tokens"]) for r in rb]


def test_every_plugin_that_runs_on_cpu_and_every_bf16_precision_has_a_resume_case() -> None:
    assert {cfg["plugin"] for cfg in RESUME_CONFIGS.values()} == set(CPU_PLUGINS)
    torch_ddp = plugins.PLUGIN_TABLE["torch_ddp"]
    covered = {cfg.get("precision") for cfg in RESUME_CONFIGS.values() if cfg["plugin"] == "torch_ddp"}
    assert set(torch_ddp.precisions) - {"fp32", "bf16"} <= covered  # bf16 autocast keeps no masters
    assert [case for case in CASES if keeps_masters_apart(case)] == ["torch_ddp_bf16_master", "hybrid"]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_stop_after_k_then_resume_equals_a_straight_run(case: str, tmp_path: Path, data_dir: Path) -> None:
    cfg = {**TINY, **RESUME_CONFIGS[case], "steps": STEPS, "lr": 3e-3}
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(straight, data_dir, cfg)

    proc = train(resumed, data_dir, {**cfg, "stop_after": STOP})  # same schedule, stops early
    assert f"stop_after: stopped at step {STOP}" in proc.stdout
    assert not (resumed / "model.pt").exists()  # no final model before the last step
    assert [s for s, _ in checkpoint.complete_checkpoints(resumed / "ckpt")] == [STOP]
    step_dir = resumed / "ckpt" / f"step_{STOP:08d}"
    assert_sharded_layout(step_dir, world=2)
    replicated = plugins.PLUGIN_TABLE[cfg["plugin"]].replicated
    saved = [load(step_dir / checkpoint.RANKS / f"rank{r:05d}.pt")["masters"] for r in (0, 1)]
    masters = saved[0] if replicated else saved[1]
    if keeps_masters_apart(case):
        assert masters and all(v.dtype == torch.float32 for v in masters.values())
        assert "model.embed_tokens.weight" in masters  # keyed by parameter name, not position
        if replicated:  # every rank holds the same masters: rank 0 writes them once, every rank reads that copy
            assert saved[1] is None
    else:
        assert saved == [None, None]
    proc = train(resumed, data_dir, cfg)
    assert f"at step {STOP}" in proc.stdout
    assert "resume: world size" not in proc.stdout  # same size: nothing converted
    assert_same_end_state(straight, resumed)


@pytest.mark.slow
def test_a_run_that_died_after_a_checkpoint_resumes_from_it_and_drops_later_metrics(
    tmp_path: Path, data_dir: Path
) -> None:
    cfg = {**TINY, **RESUME_CONFIGS["hybrid"], "steps": STEPS, "lr": 3e-3, "ckpt_every": STOP}
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(straight, data_dir, cfg)
    assert [s for s, _ in checkpoint.complete_checkpoints(straight / "ckpt")] == [STOP, STEPS]
    # A run that died after step STOP's checkpoint: its metrics already hold later steps.
    shutil.copytree(straight / "ckpt" / f"step_{STOP:08d}", resumed / "ckpt" / f"step_{STOP:08d}")
    shutil.copy(straight / "metrics.jsonl", resumed / "metrics.jsonl")
    proc = train(resumed, data_dir, cfg)
    assert f"at step {STOP}" in proc.stdout
    assert_same_end_state(straight, resumed)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_resume_on_another_world_size_reshards_and_logs_what_per_rank_state_did_not_follow(
    case: str, tmp_path: Path, data_dir: Path
) -> None:
    cfg = {**TINY, **RESUME_CONFIGS[case], "steps": STEPS, "lr": 3e-3}
    train(tmp_path, data_dir, {**cfg, "stop_after": STOP}, nproc=2)
    saved = load(tmp_path / "ckpt" / f"step_{STOP:08d}" / checkpoint.RANKS / "rank00000.pt")
    proc = train(tmp_path, data_dir, cfg, nproc=1)
    assert f"at step {STOP}" in proc.stdout
    line = next(x for x in proc.stdout.splitlines() if x.startswith("resume: world size 2 -> 1"))
    assert "data-parallel 2 -> 1" in line and "RNG states not restored" in line
    if saved["masters"] is not None and plugins.PLUGIN_TABLE[cfg["plugin"]].replicated:
        assert "fp32 master weights restored from rank 0's copy" in line  # exact on any world size
    elif saved["masters"] is not None:
        assert "fp32 master weights re-seeded from the checkpoint's model weights" in line
    rows = metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    # The global batch halves with the data-parallel size; training goes on from the restored state.
    per_step = {r["step"]: r["tokens"] - prev for r, prev in zip(rows, [0] + [r["tokens"] for r in rows], strict=False)}
    assert per_step[STOP] == 2 * per_step[STOP + 1]
    assert abs(rows[STOP]["loss"] - rows[STOP - 1]["loss"]) < 0.5  # not a restart from the initial weights
    assert lm.load_final_model(tmp_path / "model.pt")[1]["step"] == STEPS


def test_a_checkpoint_of_the_old_unsharded_format_is_refused_with_exit_2(tmp_path: Path, data_dir: Path) -> None:
    step = tmp_path / "ckpt" / "step_00000003"
    step.mkdir(parents=True)
    (step / checkpoint.META).write_text(json.dumps({"step": 3, "tokens": 0, "elapsed": 0.0, "world_size": 1}))
    proc = run([sys.executable, str(SCRIPTS / "train.py"), *train_argv(tmp_path, data_dir, {**TINY, "steps": 4})])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "checkpoint format 'unsharded (model.bin)'" in proc.stderr
    assert checkpoint.FORMAT in proc.stderr


# ---- Checkpointer.load's refusals, without a process group: a checkpointer with stand-in model/optimizer. ----
class Wrapped:
    """Stand-ins for a boosted model (unwrap) and a mixed-precision optimizer (get_working_to_master_map)."""

    def __init__(self, module: nn.Module, masters: dict[int, torch.Tensor] | None) -> None:
        self.module, self.masters = module, masters

    def unwrap(self) -> nn.Module:
        return self.module

    def get_working_to_master_map(self) -> dict[int, torch.Tensor] | None:
        return self.masters


def checkpointer(plugin: str, module: nn.Module, masters: dict[int, torch.Tensor] | None, world: int) -> Any:
    ck = checkpoint.Checkpointer.__new__(checkpoint.Checkpointer)
    wrapped = Wrapped(module, masters)
    ck.model, ck.optimizer, ck.cfg = wrapped, wrapped, lm.merge_config({"plugin": plugin})
    ck.rank, ck.world, ck.dp_size, ck.spec = 0, world, world, plugins.PLUGIN_TABLE[plugin]
    ck.masters_apart = plugins.masters_apart(ck.cfg)
    return ck


def test_fp32_masters_are_restored_by_name_and_a_layout_mismatch_is_an_error_not_a_skip() -> None:
    module = nn.Linear(4, 3)
    masters = {id(p): p.detach().float().clone() for p in module.parameters()}
    ck = checkpointer("hybrid", module, masters, world=2)
    saved = {"weight": torch.full((3, 4), 2.0), "bias": torch.full((3,), 3.0)}
    ck._restore_masters(saved)
    assert torch.equal(masters[id(module.weight)], saved["weight"])
    assert torch.equal(masters[id(module.bias)], saved["bias"])
    with pytest.raises(lm.ConfigError, match="do not match this run's layout"):
        ck._restore_masters({"weight": torch.zeros(6, 2), "bias": torch.zeros(3)})  # e.g. another ZeRO split
    with pytest.raises(lm.ConfigError, match="refusing to drop them"):
        ck._restore_masters(None)  # this run keeps masters the checkpoint lacks


def test_resume_on_another_world_size_is_an_error_naming_both_sizes_where_the_plugin_cannot_reshard(
    tmp_path: Path,
) -> None:
    ck = checkpointer("torch_ddp", nn.Linear(2, 2), None, world=4)
    ck.spec = dataclasses.replace(ck.spec, resize_ok=False)
    meta = {"format": checkpoint.FORMAT, "step": 3, "tokens": 0, "elapsed": 0, "world_size": 2, "config": ck.cfg}
    (tmp_path / checkpoint.META).write_text(json.dumps(meta))
    with pytest.raises(lm.ConfigError, match="written by world size 2; this run has world size 4"):
        ck.load(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_a_rerun_with_the_same_config_and_world_size_gives_the_same_model_bit_for_bit(
    case: str, tmp_path: Path, data_dir: Path
) -> None:
    """CPU + gloo: two straight runs of the same config on the same world size write a byte-identical final model
    and the same loss on every logged step (seeded data order and init, deterministic CPU kernels)."""
    cfg = {**TINY, **RESUME_CONFIGS[case], "steps": STEPS, "lr": 3e-3}
    first, second = tmp_path / "first", tmp_path / "second"
    train(first, data_dir, cfg)
    train(second, data_dir, cfg)
    assert (first / "model.pt").read_bytes() == (second / "model.pt").read_bytes()
    la, lb = metrics(first / "metrics.jsonl"), metrics(second / "metrics.jsonl")
    assert [(r["step"], r["loss"], r["lr"]) for r in la] == [(r["step"], r["loss"], r["lr"]) for r in lb]
    assert len(la) == STEPS
