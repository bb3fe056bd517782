"""docs/training-contract.md's copyable script (workflows/examples/minimal_train.py) keeps its contract: on SIGUSR2,
sent by pid to one worker, every rank stops at one step, rank 0 checkpoints and writes that step to
$MULTINODE_PREEMPT_FILE, all exit 0; the same command again resumes at the next step and finishes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.helpers import REPO
from tests.training.helpers import HANG_S

pytestmark = pytest.mark.slow

SCRIPT = REPO / "workflows" / "examples" / "minimal_train.py"
STEPS = 200


def start(tmp_path: Path, run: int) -> subprocess.Popen:
    env = {
        **os.environ,
        "MULTINODE_METRICS_FILE": str(tmp_path / f"metrics{run}.jsonl"),
        "MULTINODE_PREEMPT_FILE": str(tmp_path / f"preempted{run}"),
        "OMP_NUM_THREADS": "1",
    }
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", str(SCRIPT), "ckpt.pt", str(STEPS)]
    # as the launcher starts torchrun: its agent ignores USR2, the workers install their own handler
    return subprocess.Popen(
        argv, cwd=tmp_path, env=env, preexec_fn=lambda: signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    )


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def steps(path: Path) -> list[int]:
    return [r["step"] for r in records(path) if "event" not in r]


def events(path: Path) -> list[tuple[str, int]]:
    return [(r["event"], r["step"]) for r in records(path) if "event" in r]


def test_sigusr2_checkpoints_writes_the_preempt_file_exits_0_and_the_rerun_resumes(tmp_path):
    proc = start(tmp_path, 1)
    deadline = time.monotonic() + 120
    while len(steps(tmp_path / "metrics1.jsonl")) < 5:
        assert proc.poll() is None and time.monotonic() < deadline, "no metrics lines"
        time.sleep(0.1)
    workers = psutil.Process(proc.pid).children()
    assert len(workers) == 2
    os.kill(workers[1].pid, signal.SIGUSR2)  # one worker (rank 0 or 1): all ranks agree on the step
    assert proc.wait(timeout=HANG_S) == 0
    stopped = int((tmp_path / "preempted1").read_text())
    assert 5 <= stopped < STEPS
    assert torch.load(tmp_path / "ckpt.pt")["step"] == stopped == steps(tmp_path / "metrics1.jsonl")[-1]
    assert events(tmp_path / "metrics1.jsonl") == [("checkpoint_begin", stopped), ("checkpoint_end", stopped)]
    assert all(isinstance(r["wall"], float) for r in records(tmp_path / "metrics1.jsonl"))

    proc = start(tmp_path, 2)
    assert proc.wait(timeout=HANG_S) == 0
    assert steps(tmp_path / "metrics2.jsonl") == list(range(stopped + 1, STEPS + 1))  # resumed, not restarted
    assert events(tmp_path / "metrics2.jsonl") == [
        ("resume", stopped), ("checkpoint_begin", STEPS), ("checkpoint_end", STEPS),
    ]  # fmt: skip
    assert torch.load(tmp_path / "ckpt.pt")["step"] == STEPS
    assert not (tmp_path / "preempted2").exists()
