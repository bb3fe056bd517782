"""The labeller's end of a stalled step, with real processes (the rest of the in-job restarts:
tests/unit/launching/test_restarts.py)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.launching import nodelog, stall
from snakemake_executor_multinode.launching.nodelog import Labeller, Source
from tests.helpers import wait_for


def test_a_stalled_step_s_processes_that_outlive_the_gentle_stop_are_sigkilled_by_the_labeller(tmp_path):
    """The gentle stop's SIGTERM reaches torchrun; a worker that outlives it (stopped, or hung with a SIGTERM handler)
    would hold the step until SLURM's KillWait. Without a container the labeller SIGKILLs torchrun and every process
    below it stall.STOP_KILL_S later: here a stand-in torchrun that ignores SIGTERM, and its child."""
    stem = str(JobFiles.of(tmp_path, "7", 1).prefix)
    stall.stop_file(stem).write_text("stop\n")  # the launcher's request: USR1 is the gentle stop, not a checkpoint
    child = tmp_path / "child.pid"
    torchrun = subprocess.Popen(["bash", "-c", f'trap "" TERM; sleep 600 & echo $! > {child}; wait'])
    wait_for(lambda: child.exists() and child.read_text().strip(), "the stand-in's child", 30)
    sleeper = int(child.read_text())
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)}
    try:
        term = nodelog.Preempted(torchrun, {}, "node1", Labeller(tmp_path / "node1.out"), Source(b"[node1] ", 2))
        nodelog._handle_signals(torchrun, stem, term, contained=False)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert torchrun.wait(timeout=120) == -signal.SIGKILL  # not the SIGTERM, which it ignores
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        if torchrun.poll() is None:
            torchrun.kill()
    wait_for(lambda: ended(sleeper), "the stand-in's child ended", 30)


def ended(pid: int) -> bool:
    """Gone, or a zombie left for its new parent to reap."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
