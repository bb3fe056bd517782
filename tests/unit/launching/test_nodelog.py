"""Labelled output: a line is written whole, once, with the node and rank that wrote it (cluster runs in
test_torchrun_cluster.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.launching import nodelog
from snakemake_executor_multinode.launching.nodelog import Labeller, Merger, Source, with_rank_logs


def test_a_line_written_in_pieces_comes_out_whole_and_labelled(tmp_path):
    out = Labeller(tmp_path / "n.out")
    a, b = Source(b"[n1 rank0] ", 1), Source(b"[n1 rank1] ", 1)
    out.feed(a, b"hello ")
    out.feed(b, b"other line\nsecond ")  # another rank writes while rank 0's line is unfinished
    out.feed(a, b"world\n")
    out.feed(b, b"half")
    out.close(b)  # a stream's last line without its newline still comes out, whole
    assert (tmp_path / "n.out").read_text().splitlines() == [
        "[n1 rank1] other line",
        "[n1 rank0] hello world",
        "[n1 rank1] second half",
    ]


def test_ranks_outside_the_local_ranks_filter_are_not_shown(tmp_path):
    out = Labeller(tmp_path / "n.out")
    out.feed(Source(b"[n1 rank1] ", 1, console=False), b"hidden\n")
    out.feed(Source(b"[n1 rank0] ", 1), b"shown\n")
    assert (tmp_path / "n.out").read_text() == "[n1 rank0] shown\n"


def test_the_merger_copies_whole_lines_written_after_the_launch_began(tmp_path):
    stem = str(tmp_path / "job")
    first = tmp_path / "job.a.out"
    first.write_text("[a rank0] from an earlier launch: already in the log\n")
    read, write = os.pipe()
    with Merger(stem, ["a", "b"], out_fd=write) as merger:
        with open(first, "a") as fh:
            fh.write("[a rank0] new line, in two pie")
            fh.flush()
            merger.copy()
            fh.write("ces\n")
        (tmp_path / "job.b.out").write_text("[b rank1] from node b\n")
    os.close(write)
    with os.fdopen(read) as fh:
        assert sorted(fh.read().splitlines()) == ["[a rank0] new line, in two pieces", "[b rank1] from node b"]


def test_rank_files_are_asked_of_torchrun_right_after_its_module():
    cmd = ["py", "-m", "torch.distributed.run", "--nnodes=2", "t.py"]
    assert with_rank_logs(cmd, "/tmp/d") == [
        "py",
        "-m",
        "torch.distributed.run",
        "--redirects=3",
        "--log-dir=/tmp/d",
        "--nnodes=2",
        "t.py",
    ]


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


def rank_file(root, attempt: int, local: int):
    path = root / "run_x" / f"attempt_{attempt}" / str(local) / "stdout.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def test_a_restart_under_the_same_attempt_number_loses_no_line_and_relabels_its_ranks(tmp_path):
    """torchrun restarts a healthy node's workers for a membership change without counting a restart: it deletes
    attempt_0's folder and writes the new workers' files under the same paths (seen under load: the lines of the
    second round were lost). Every line of both rounds comes out, labelled with the rank of the round that wrote it."""
    root, workers = tmp_path / "logs", {(0, 0): 1}  # (local rank, attempt) -> the global rank c10d gave the worker
    files = nodelog.RankFiles(root, "node1", lambda local, attempt: workers.get((local, attempt)), lambda _: True)
    out = Labeller(tmp_path / "node1.out")
    first = rank_file(root, 0, 0)
    first.write_text("round 1 line 1\n")
    files.poll(out)
    with open(first, "a") as fh:
        fh.write("round 1 line 2, written before the round ended\n")
    shutil.rmtree(root / "run_x" / "attempt_0")  # torchrun's DefaultLogsSpecs.reify for the same attempt number
    workers[(0, 0)] = 3  # the new rendezvous round gave the worker another rank
    rank_file(root, 0, 0).write_text("round 2 line 1\n")
    files.poll(out)
    files.close(out)
    assert (tmp_path / "node1.out").read_text().splitlines() == [
        "[node1 rank1] round 1 line 1",
        "[node1 rank1] round 1 line 2, written before the round ended",
        "[node1 rank3] round 2 line 1",
    ]


def test_lines_wait_for_their_workers_rank_and_never_go_out_unlabelled(tmp_path):
    """The file exists before its worker does (torchrun opens it first): its lines wait for the rank; a worker that
    was never found (it ended before a poll saw it) gets its local rank at the end."""
    root, workers = tmp_path / "logs", {}
    files = nodelog.RankFiles(root, "node2", lambda local, attempt: workers.get((local, attempt)), lambda _: True)
    out = Labeller(tmp_path / "node2.out")
    rank_file(root, 1, 0).write_text("early line\n")
    rank_file(root, 1, 1).write_text("a short-lived worker\n")
    files.poll(out)
    assert (tmp_path / "node2.out").read_text() == ""  # held, not lost, not mislabelled
    workers[(0, 1)] = 2
    files.poll(out)
    files.close(out)
    assert (tmp_path / "node2.out").read_text().splitlines() == [
        "[node2 rank2] early line",
        "[node2 local_rank1] a short-lived worker",
    ]


def test_a_replaced_file_whose_rank_was_never_found_keeps_its_round_not_the_new_rounds_rank(tmp_path):
    """A round's worker ended before its rank was seen, and the next round (same attempt number, same local rank)
    replaced its file: the old lines go out with their local rank, never with the rank of the round after them
    (seen in a job log: a line of the earlier round labelled `[node1 rank3]`)."""
    root, workers = tmp_path / "logs", {}
    files = nodelog.RankFiles(root, "node1", lambda local, attempt: workers.get((local, attempt)), lambda _: True)
    out = Labeller(tmp_path / "node1.out")
    rank_file(root, 0, 0).write_text("round 1, rank never seen\n")
    files.poll(out)
    shutil.rmtree(root / "run_x" / "attempt_0")
    workers[(0, 0)] = 3  # the new round's worker: same local rank, same attempt number
    rank_file(root, 0, 0).write_text("round 2 line 1\n")
    files.poll(out)
    files.close(out)
    assert (tmp_path / "node1.out").read_text().splitlines() == [
        "[node1 local_rank0] round 1, rank never seen",
        "[node1 rank3] round 2 line 1",
    ]


def test_a_rank_looked_up_while_the_next_round_replaces_the_file_is_not_trusted(tmp_path):
    """The round ends between finding the file and asking for its worker's rank: the worker found is the next
    round's, so the old lines must not take its rank."""
    root, workers = tmp_path / "logs", {}

    def rank(local: int, attempt: int) -> int | None:
        if not workers:  # torchrun restarts the round just as the rank is asked for
            shutil.rmtree(root / "run_x" / "attempt_0")
            rank_file(root, 0, 0).write_text("round 2 line 1\n")
            workers[(0, 0)] = 3
        return workers.get((local, attempt))

    files = nodelog.RankFiles(root, "node1", rank, lambda _: True)
    out = Labeller(tmp_path / "node1.out")
    rank_file(root, 0, 0).write_text("round 1 line 1\n")
    files.poll(out)
    files.poll(out)
    files.close(out)
    assert (tmp_path / "node1.out").read_text().splitlines() == [
        "[node1 local_rank0] round 1 line 1",
        "[node1 rank3] round 2 line 1",
    ]


def test_the_first_output_time_is_written_once_at_the_first_line_of_a_rank_not_of_the_agent(tmp_path):
    root, first = tmp_path / "logs", tmp_path / "job.node1.first"
    files = nodelog.RankFiles(root, "node1", lambda local, attempt: local, lambda _: True)
    out = Labeller(tmp_path / "node1.out", first_output=first)
    agent = Source(b"[node1] ", 2)
    out.write(agent, b"[multinode torchrun] launching on node1, node_rank=0\n")
    out.feed(agent, b"torchrun's own line\n")
    rank = rank_file(root, 0, 0)
    rank.write_text("no newline yet")  # a line being printed: not a line yet
    files.poll(out)
    assert not first.exists()
    before = time.time()
    with open(rank, "a") as fh:
        fh.write(", now whole\n")
    files.poll(out)
    after = time.time()
    written = float(first.read_text())
    assert before <= written <= after
    with open(rank, "a") as fh:
        fh.write("a later line\n")
    files.poll(out)
    files.close(out)
    assert float(first.read_text()) == written  # once: the first line's time
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # renamed into place, no temp left


def test_an_earlier_launch_of_the_run_keeps_its_first_output_time(tmp_path):
    first = tmp_path / "job.node1.first"
    first.write_text("1800000000.000\n")
    out = Labeller(tmp_path / "node1.out", first_output=first)
    files = nodelog.RankFiles(tmp_path / "logs", "node1", lambda local, attempt: local, lambda _: True)
    rank_file(tmp_path / "logs", 0, 0).write_text("the second launch's first line\n")
    files.close(out)
    assert first.read_text() == "1800000000.000\n"


def test_a_first_output_time_that_cannot_be_written_says_so_and_the_lines_still_go_out(tmp_path):
    read, write = os.pipe()
    out = Labeller(tmp_path / "node1.out", out_fds=(write, write), first_output=tmp_path / "gone" / "job.node1.first")
    files = nodelog.RankFiles(tmp_path / "logs", "node1", lambda local, attempt: local, lambda _: True)
    rank_file(tmp_path / "logs", 0, 0).write_text("line 1\nline 2\n")
    files.close(out)
    os.close(write)
    with os.fdopen(read) as fh:
        said = fh.read()
    assert said.startswith("[multinode torchrun] first output time not written: ") and said.count("\n") == 1
    assert (tmp_path / "node1.out").read_text() == "[node1 rank0] line 1\n[node1 rank0] line 2\n"


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
    proc = subprocess.Popen([sys.executable, str(script), "agent"], cwd=tmp_path)
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
    for pid in (proc.pid, *nodelog.descendants(proc.pid)):
        try:
            os.kill(pid, signal.SIGKILL)
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
