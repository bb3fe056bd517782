"""collective_timeout_s: a hung rank ends the training with an error within the timeout, in every process group of
the run (the default one and those made later: the plugin's, the checkpointer's), instead of holding every rank for
torch's 30 minutes. What a team adds to the seed's recipe (benchmarks/goodput.py, the competent variant)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import wait_for

from .helpers import ENV, HANG_S, REPO, SCRIPTS, TINY, metrics, torchrun_argv, train_argv

TIMEOUT_S = 5


def worker(torchrun: psutil.Process, rank: int) -> psutil.Process | None:
    for child in torchrun.children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank):
                return child
        except psutil.Error:
            continue
    return None


@pytest.mark.slow
def test_a_hung_rank_fails_the_others_within_the_collective_timeout(tmp_path: Path, data_dir: Path) -> None:
    cfg = {**TINY, "plugin": "torch_ddp", "steps": 100_000, "collective_timeout_s": TIMEOUT_S}
    log = (tmp_path / "run.log").open("w")
    proc = subprocess.Popen(torchrun_argv(SCRIPTS / "train.py", *train_argv(tmp_path, data_dir, cfg)), env=ENV,
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_for(lambda: len(metrics(tmp_path / "metrics.jsonl")) >= 3 if (tmp_path / "metrics.jsonl").exists()
                 else False, "3 steps", HANG_S)  # fmt: skip
        hung = wait_for(lambda: worker(psutil.Process(proc.pid), 1), "rank 1's worker", 60)
        os.kill(hung.pid, signal.SIGSTOP)  # the fault: rank 1 stops inside its loop, rank 0 waits in a collective
        stopped = time.monotonic()
        rc = proc.wait(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = (tmp_path / "run.log").read_text()
    assert rc != 0, text[-3000:]
    # rank 0's own error: the collective it waited in timed out after the configured seconds (gloo's words)
    assert f"Timed out waiting {TIMEOUT_S * 1000}ms" in text, text[-3000:]
    # a figure only (the verdict is the error above): how long the whole launch took to end after the stop
    print(f"stopped -> torchrun's exit: {time.monotonic() - stopped:.1f} s (timeout {TIMEOUT_S} s)")
