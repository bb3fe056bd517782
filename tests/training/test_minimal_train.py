"""docs/training-contract.md's copyable script (workflows/examples/minimal_train.py) keeps its contract on CPU and
gloo: it checkpoints every --ckpt-every steps; on SIGUSR2, sent by pid to one worker, every rank stops at one step,
rank 0 checkpoints and writes that step to $MULTINODE_PREEMPT_FILE, all exit 0; the same command again resumes at
the next step and finishes. Its GPU path (NCCL, each rank on its local rank's GPU) ran on the lent H100:
benchmarks/gpu/results-first-job-h100.txt."""

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
EVERY = 20  # --ckpt-every


def start(tmp_path: Path, run: int) -> subprocess.Popen:
    env = {
        **os.environ,
        "MULTINODE_METRICS_FILE": str(tmp_path / f"metrics{run}.jsonl"),
        "MULTINODE_PREEMPT_FILE": str(tmp_path / f"preempted{run}"),
        "OMP_NUM_THREADS": "1",
    }
    script = [str(SCRIPT), "ckpt.pt", str(STEPS), f"--ckpt-every={EVERY}", "--sleep=0.05"]  # sleep: a step's work
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", *script]
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


def saves(first: int, last: int) -> list[tuple[str, int]]:
    """The checkpoint events of a run from step `first` (excluded) to `last`: every EVERY steps, and at `last`."""
    at = [s for s in range(first + 1, last) if s % EVERY == 0] + [last]
    return [(e, s) for s in at for e in ("checkpoint_begin", "checkpoint_end")]


def test_periodic_checkpoints_then_sigusr2_checkpoints_writes_the_preempt_file_exits_0_and_the_rerun_resumes(tmp_path):
    proc = start(tmp_path, 1)
    deadline = time.monotonic() + 120
    while len(steps(tmp_path / "metrics1.jsonl")) < EVERY + 5:  # past the first periodic checkpoint
        assert proc.poll() is None and time.monotonic() < deadline, "no metrics lines"
        time.sleep(0.1)
    workers = psutil.Process(proc.pid).children()
    assert len(workers) == 2
    os.kill(workers[1].pid, signal.SIGUSR2)  # one worker (rank 0 or 1): all ranks agree on the step
    assert proc.wait(timeout=HANG_S) == 0
    stopped = int((tmp_path / "preempted1").read_text())
    assert EVERY + 5 <= stopped < STEPS
    assert torch.load(tmp_path / "ckpt.pt")["step"] == stopped == steps(tmp_path / "metrics1.jsonl")[-1]
    assert events(tmp_path / "metrics1.jsonl") == saves(0, stopped)
    assert all(isinstance(r["wall"], float) for r in records(tmp_path / "metrics1.jsonl"))
    lines = [r for r in records(tmp_path / "metrics1.jsonl") if "event" not in r]
    assert all(r["tokens_per_s"] > 0 and r["mfu"] is None for r in lines)  # no GPU: no peak, no mfu

    proc = start(tmp_path, 2)
    assert proc.wait(timeout=HANG_S) == 0
    assert steps(tmp_path / "metrics2.jsonl") == list(range(stopped + 1, STEPS + 1))  # resumed, not restarted
    assert events(tmp_path / "metrics2.jsonl") == [("resume", stopped), *saves(stopped, STEPS)]
    assert torch.load(tmp_path / "ckpt.pt")["step"] == STEPS
    assert not (tmp_path / "preempted2").exists()
