"""Labelled output: a line is written whole, once, with the node and rank that wrote it (cluster runs in
test_torchrun_cluster.py).

Here the tests that start processes (the process tier); the others: tests/unit/launching/test_nodelog.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.launching import nodelog
from snakemake_executor_multinode.launching.nodelog import Labeller, Source


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


# --- a SIGTERM to the node's task: SLURM's preemption (the checkpoint signal) or the end (launching/preemption.py) ---
# A stand-in for torchrun and its worker: each says which signals reached it, in a file of its own.
TORCHRUN = """
import os, signal, subprocess, sys, time
name = sys.argv[1]
say = lambda n, _f: open(f"{name}.signals", "a").write(signal.Signals(n).name + "\\n")
for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, say)
if name == "agent":
    subprocess.Popen([sys.executable, __file__, "worker"])
open(f"{name}.ready", "w").close()
while True:
    time.sleep(0.05)
"""


def preempted(tmp_path, env, ask):
    script = tmp_path / "torchrun.py"
    script.write_text(TORCHRUN)
    proc = subprocess.Popen([sys.executable, str(script), "agent"], cwd=tmp_path, start_new_session=True)
    wait_until(lambda: (tmp_path / "worker.ready").exists() and (tmp_path / "agent.ready").exists())
    term = nodelog.Preempted(proc, env, "node1", Labeller(tmp_path / "node1.out"), Source(b"[node1] ", 2), ask=ask)
    return proc, term


def signals(tmp_path, name):
    path = tmp_path / f"{name}.signals"
    return path.read_text().split() if path.exists() else []


def wait_until(check, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "no event within the timeout"
        time.sleep(0.02)


def stop(proc):
    """The stand-in and its worker, by their session's process group (started with start_new_session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()


def test_slurms_preemption_sigterm_reaches_the_ranks_as_the_checkpoint_signal_and_is_noted_once(tmp_path):
    from snakemake_executor_multinode.contract import protocol
    from snakemake_executor_multinode.slurm.client import Preemption

    env = {
        "SLURM_JOB_ID": "57", "SLURM_RESTART_COUNT": "2", protocol.PREEMPT_NOTICE_FILE_VAR: str(tmp_path / "57.notice"),
        protocol.RUNS_FILE_VAR: str(tmp_path / "runs.jsonl"),
    }  # fmt: skip
    proc, term = preempted(tmp_path, env, lambda _env: Preemption(1_800_000_000.0, 1_800_000_060.0))
    try:
        term.sigterm()
        wait_until(lambda: signals(tmp_path, "worker") == ["SIGUSR2"])
        assert signals(tmp_path, "agent") == ["SIGUSR2"]  # the agent ignores it (nodelog.main): no TERM for it
        assert "SLURM's preemption SIGTERM at " in (tmp_path / "node1.out").read_text()
        notice = json.loads((tmp_path / "57.notice").read_text())
        assert (notice["event"], notice["job"], notice["restart"], notice["grace_s"]) == ("preempted", "57", 2, 60)
        assert json.loads((tmp_path / "runs.jsonl").read_text()) == notice  # the ledger's and status's record
        # the grace time's end (or a scancel during it): the second SIGTERM stops torchrun at once
        term.sigterm()
        wait_until(lambda: signals(tmp_path, "agent") == ["SIGUSR2", "SIGTERM"])
        assert signals(tmp_path, "worker") == ["SIGUSR2"]
    finally:
        stop(proc)


def test_a_sigterm_that_is_no_preemption_stops_torchrun_at_once(tmp_path):
    proc, term = preempted(tmp_path, {"SLURM_JOB_ID": "57"}, lambda _env: None)  # a scancel, the time limit
    try:
        term.sigterm()
        wait_until(lambda: signals(tmp_path, "agent") == ["SIGTERM"])
        assert signals(tmp_path, "worker") == [] and not (tmp_path / "node1.out").read_text()
    finally:
        stop(proc)


def test_when_slurm_does_not_answer_the_sigterm_stops_torchrun_and_the_log_says_why(tmp_path):
    from snakemake_executor_multinode.slurm.client import QueryError

    def down(_env):
        raise QueryError("squeue: Unable to contact slurm controller")

    proc, term = preempted(tmp_path, {"SLURM_JOB_ID": "57"}, down)
    try:
        term.sigterm()
        wait_until(lambda: signals(tmp_path, "agent") == ["SIGTERM"])
        said = (tmp_path / "node1.out").read_text()
        assert "SLURM did not answer whether this SIGTERM is a preemption (squeue: Unable to contact" in said
    finally:
        stop(proc)


def test_a_cancel_that_checkpoints_first_needs_no_question_and_passes_the_rules_checkpoint_signal(tmp_path):
    from snakemake_executor_multinode.contract import protocol

    (tmp_path / "57.cancel").write_text("multinode cancel --checkpoint, 10:00:00\n")
    env = {"SLURM_JOB_ID": "57", protocol.CANCEL_FILE_VAR: str(tmp_path / "57.cancel"),
           protocol.CHECKPOINT_SIGNAL_VAR: "USR1"}  # fmt: skip

    def never(_env):
        raise AssertionError("SLURM asked")

    proc, term = preempted(tmp_path, env, never)
    try:
        term.sigterm()
        wait_until(lambda: signals(tmp_path, "worker") == ["SIGUSR1"])
        assert (
            "SIGTERM of a cancel that checkpoints first: passed on to the ranks as SIGUSR1"
            in (tmp_path / "node1.out").read_text()
        )
    finally:
        stop(proc)
