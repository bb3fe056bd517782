"""SIGUSR2, the signal before the time limit, reaches the training's ranks and nothing below them: DataLoader workers
started by spawn or forkserver begin with USR2's default action (exec resets the rank's handler), which would kill
them, and the rank would then die of "DataLoader worker exited unexpectedly" instead of checkpointing. Sent by pid to
`multinode torchrun` (outside SLURM, its forwarding is the labeller's: launching/nodelog.py), the signal makes the
training checkpoint, with every worker alive and serving, and the run ends with the preempted exit code. Sent to every
process, as SLURM does under proctrack/linuxproc, the same holds for a training that blocks USR2 (minimal_train.py)."""

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

from snakemake_executor_multinode.contract import protocol
from tests.training.helpers import HANG_S

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("usr2_dataloader.py")


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for f in folder.glob("**/*.metrics.jsonl") for line in f.read_text().splitlines()]


def start(tmp_path: Path, *flags: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MULTINODE_"))}
    argv = [sys.executable, "-m", "snakemake_executor_multinode.cli", "torchrun", "--nproc_per_node=1"]
    return subprocess.Popen([*argv, str(SCRIPT), "ckpt.pt", *flags], cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"})


def wait_for_the_workers(tmp_path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + HANG_S
    while not any(r.get("event") == "workers" for r in records(tmp_path)):
        assert proc.poll() is None and time.monotonic() < deadline, "the DataLoader workers never started"
        time.sleep(0.2)


def assert_checkpointed_with_every_worker_alive(tmp_path: Path, proc: subprocess.Popen) -> None:
    assert proc.wait(timeout=HANG_S) == protocol.EXIT_PREEMPTED
    (signalled,) = [r for r in records(tmp_path) if r.get("event") == "signalled"]
    assert signalled["alive"] == {"spawn": [True], "forkserver": [True]}
    assert torch.load(tmp_path / "ckpt.pt")["step"] == signalled["step"]


def test_sigusr2_to_multinode_torchrun_checkpoints_and_leaves_spawn_and_forkserver_dataloader_workers_alive(tmp_path):
    proc = start(tmp_path)
    wait_for_the_workers(tmp_path, proc)
    os.kill(proc.pid, signal.SIGUSR2)  # as SLURM signals a step's task (proctrack/cgroup): the launcher passes it on
    assert_checkpointed_with_every_worker_alive(tmp_path, proc)


def test_with_usr2_blocked_in_the_rank_the_workers_outlive_a_signal_to_every_process(tmp_path):
    """Under proctrack/linuxproc SLURM signals every process of the step itself, the workers, the forkserver and
    multiprocessing's resource tracker too: blocked in the rank (and taken by a thread, as minimal_train.py does), the
    signal starts blocked in every process the rank starts. Without the block this run fails (the lent H100's
    one-node SLURM, linuxproc: benchmarks/gpu/results-first-job-h100.json, linuxproc_dataloader)."""
    proc = start(tmp_path, "--block-usr2")
    wait_for_the_workers(tmp_path, proc)
    tree = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
    assert len(tree) >= 7  # launcher, labeller, agent, rank, spawn worker, forkserver and its worker (+ trackers)
    for pid in tree:
        os.kill(pid, signal.SIGUSR2)
    assert_checkpointed_with_every_worker_alive(tmp_path, proc)
