"""Labelled output: a line is written whole, once, with the node and rank that wrote it (cluster runs in
test_torchrun_cluster.py).

Here the tests that start processes (the process tier); the others: tests/unit/launching/test_nodelog.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.launching import nodelog


def test_usr2_to_the_node_process_reaches_the_workers_and_spares_torchruns_agent(tmp_path):
    """With proctrack/cgroup SLURM signals only the step's task (the labeller), not its children: the labeller
    passes SLURM's pre-time-limit USR2 on; torchrun's agent ignores it, the worker's own handler sees it."""
    worker = tmp_path / "w.py"
    worker.write_text(
        "import os, signal, threading\n"
        "got = threading.Event()\n"
        "signal.signal(signal.SIGUSR2, lambda *_: got.set())\n"
        "print('WAITING', flush=True)\n"
        "print('GOT USR2' if got.wait(120) else 'NO USR2', flush=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "MULTINODE_"))}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", str(worker)]
    proc = subprocess.Popen(
        ["bash", "-c", 'trap "" USR2; exec "$@"', "task", sys.executable, "-m", nodelog.__name__, "--nproc=1", "--"]
        + cmd,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:  # waits for the event, not for a time
        lines.append(line)
        if "WAITING" in line:
            proc.send_signal(signal.SIGUSR2)
    assert proc.wait(timeout=120) == 0, lines  # the agent survived it and the worker ended well
    assert any(line.rstrip().endswith("] GOT USR2") for line in lines), lines


def test_a_real_torchrun_writes_the_first_output_time_when_its_rank_prints_not_before(tmp_path):
    """Through the node process as the job runs it: torchrun's agent and the launch line come first and write no
    time; the worker's first line, printed once the test lets it, does."""
    worker = tmp_path / "w.py"
    worker.write_text(
        "import os, pathlib, time\n"
        "d = pathlib.Path(os.environ['TEST_DIR'])\n"
        "(d / 'ready').write_text('')\n"
        "end = time.monotonic() + 300\n"  # never outlives the test, whatever fails
        "while not (d / 'go').exists() and time.monotonic() < end:\n"
        "    time.sleep(0.05)\n"
        "print('first rank line', flush=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "MULTINODE_"))}
    env |= {"TEST_DIR": str(tmp_path), "SLURMD_NODENAME": "nodeA", "MULTINODE_LOG_STEM": str(tmp_path / "9.attempt1")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", str(worker)]
    proc = subprocess.Popen(
        [sys.executable, "-m", nodelog.__name__, "--nproc=1", "--", *cmd], env=env, cwd=tmp_path, start_new_session=True
    )
    files = JobFiles(tmp_path / "9.attempt1")
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "ready").exists():  # the worker runs and has printed nothing
            assert proc.poll() is None and time.monotonic() < deadline, "the worker never started"
            time.sleep(0.05)
        assert "launching on nodeA" in files.node_out("nodeA").read_text()  # a line, but not a rank's
        assert not files.first_output("nodeA").exists() and files.first_output_time() is None
        go = time.time()
        (tmp_path / "go").write_text("")
        assert proc.wait(timeout=120) == 0
        ended = time.time()
    finally:  # a failed assertion above must not leave torchrun and its worker waiting: the whole session goes
        (tmp_path / "go").write_text("")
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    assert "[nodeA rank0] first rank line" in files.node_out("nodeA").read_text()
    assert go <= files.first_output_time() <= ended  # type: ignore[operator]
