"""Helpers of the training tests: tiny configs and torchrun launches on CPU (gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers import REPO

SCRIPTS = REPO / "workflows" / "scripts"
sys.path.insert(0, str(SCRIPTS))

# Small enough for 2 CPU cores: ~10 ms per step; a launch costs ~10 s of imports.
TINY: dict[str, Any] = {
    "n_layer": 2,
    "n_head": 4,
    "d_model": 64,
    "seq_len": 64,
    "micro_batch": 4,
    "log_every": 1,
    "ckpt_every": 0,
    "warmup": 2,
}

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def torchrun_argv(script: Path | str, *args: str, nproc: int = 2) -> list[str]:
    # --standalone: a private rendezvous on a free port, so launches never collide.
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(script),
        *args,
    ]


def train_argv(out: Path, data_dir: Path, cfg: dict[str, Any]) -> list[str]:
    return [
        "--data-dir",
        str(data_dir),
        "--out",
        str(out / "model.pt"),
        "--ckpt-dir",
        str(out / "ckpt"),
        "--metrics",
        str(out / "metrics.jsonl"),
        "--config-json",
        json.dumps(cfg),
    ]


# Only stops a hang: a training of a few hundred steps takes seconds here alone, minutes on a loaded 2-core machine
# (the 24.11 cluster tier runs beside these tests).
HANG_S = 900


def run(argv: list[str], timeout: float = HANG_S, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env or ENV, cwd=REPO)


def train(out: Path, data_dir: Path, cfg: dict[str, Any], nproc: int = 2) -> subprocess.CompletedProcess:
    """torchrun train.py; fails the test with the output when it does not exit 0."""
    proc = run(torchrun_argv(SCRIPTS / "train.py", *train_argv(out, data_dir, cfg), nproc=nproc))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def metrics(path: Path) -> list[dict[str, Any]]:
    """The step lines (event records, such as checkpoints and resumes, left out: `events`)."""
    return [r for r in records(path) if "event" not in r]


def events(path: Path) -> list[dict[str, Any]]:
    return [r for r in records(path) if "event" in r]


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def step_dir(out: Path, step: int) -> Path:
    """The checkpoint of `step` in a training's folder (train_argv's --ckpt-dir)."""
    import checkpoint

    return out / "ckpt" / f"{checkpoint.CKPT_PREFIX}{step:08d}"


def truncate(path: Path) -> None:
    """Cut a file to half its size: a damaged checkpoint file."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def assert_same_final_model(a: Path, b: Path) -> None:
    """Every tensor of the final model (--out) in folder b equal to folder a's; the message counts those that differ."""
    import torch

    sa, sb = (torch.load(p / "model.pt", map_location="cpu", weights_only=False)["state_dict"] for p in (a, b))
    assert sa.keys() == sb.keys()
    differ = [key for key in sa if not torch.equal(sa[key], sb[key])]
    assert differ == [], f"{len(differ)} of {len(sa)} tensors differ from {a}'s: {differ}"


def checkpoint_bytes(cfg: dict[str, Any]) -> int:
    """About the size of one torch_ddp fp32 checkpoint of `cfg` (AdamW): the model's parameters 4 bytes each, the
    optimizer's two moments 8 more, plus 64 KiB for the per-rank files, indexes and trainer.json. What the disk-full
    cluster test sizes its filesystem by; test_checkpoint_verify.py holds a real checkpoint to it."""
    import lm

    params = sum(p.numel() for p in lm.build_model(lm.merge_config(cfg), cuda=False).parameters())
    return 12 * params + (64 << 10)
