"""SIGUSR2, the signal before the time limit, reaches the training's ranks and nothing below them: DataLoader workers
started by spawn or forkserver begin with USR2's default action (exec resets the rank's handler), which would kill
them, and the rank would then die of "DataLoader worker exited unexpectedly" instead of checkpointing. Sent by pid to
`multinode torchrun` (outside SLURM, its forwarding is the labeller's: launching/nodelog.py), the signal makes the
training checkpoint, with every worker alive and serving, and the run ends with the preempted exit code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from snakemake_executor_multinode.contract import protocol
from tests.training.helpers import HANG_S

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("usr2_dataloader.py")


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for f in folder.glob("**/*.metrics.jsonl") for line in f.read_text().splitlines()]


def test_sigusr2_to_multinode_torchrun_checkpoints_and_leaves_spawn_and_forkserver_dataloader_workers_alive(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MULTINODE_"))}
    argv = [sys.executable, "-m", "snakemake_executor_multinode.cli", "torchrun", "--nproc_per_node=1"]
    proc = subprocess.Popen([*argv, str(SCRIPT), "ckpt.pt"], cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + HANG_S
    while not any(r.get("event") == "workers" for r in records(tmp_path)):
        assert proc.poll() is None and time.monotonic() < deadline, "the DataLoader workers never started"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGUSR2)
    assert proc.wait(timeout=HANG_S) == protocol.EXIT_PREEMPTED
    (signalled,) = [r for r in records(tmp_path) if r.get("event") == "signalled"]
    assert signalled["alive"] == {"spawn": [True], "forkserver": [True]}
    assert torch.load(tmp_path / "ckpt.pt")["step"] == signalled["step"]
