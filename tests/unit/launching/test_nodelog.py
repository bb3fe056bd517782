"""Labelled output: a line is written whole, once, with the node and rank that wrote it (cluster runs in
test_torchrun_cluster.py).
The tests that start processes: tests/process/launching/test_nodelog.py."""

from __future__ import annotations

import os
import shutil
import time

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


def rank_file(root, attempt: int, local: int):
    path = root / "run_x" / f"attempt_{attempt}" / str(local) / "stdout.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def next_round(root, workers: dict[tuple[int, int], int]) -> None:
    """torchrun's next rendezvous round under the same attempt number: it deletes attempt_0's folder
    (DefaultLogsSpecs.reify), its worker (same local rank) gets rank 3 and writes "round 2 line 1"."""
    shutil.rmtree(root / "run_x" / "attempt_0")
    workers[(0, 0)] = 3
    rank_file(root, 0, 0).write_text("round 2 line 1\n")


def labelled_rank_files(tmp_path, node: str, workers: dict[tuple[int, int], int]) -> tuple[nodelog.RankFiles, Labeller]:
    """The node's rank files under tmp_path/logs, labelled into tmp_path/<node>.out with the rank `workers` gives
    each worker ((local rank, attempt) -> global rank) once it is there."""
    found = nodelog.RankFiles(
        tmp_path / "logs", node, lambda local, attempt: workers.get((local, attempt)), lambda _: True
    )
    return found, Labeller(tmp_path / f"{node}.out")


def test_a_restart_under_the_same_attempt_number_loses_no_line_and_relabels_its_ranks(tmp_path):
    """torchrun restarts a healthy node's workers for a membership change without counting a restart: it deletes
    attempt_0's folder and writes the new workers' files under the same paths (seen under load: the lines of the
    second round were lost). Every line of both rounds comes out, labelled with the rank of the round that wrote it."""
    root, workers = tmp_path / "logs", {(0, 0): 1}  # (local rank, attempt) -> the global rank c10d gave the worker
    files, out = labelled_rank_files(tmp_path, "node1", workers)
    first = rank_file(root, 0, 0)
    first.write_text("round 1 line 1\n")
    files.poll(out)
    with open(first, "a") as fh:
        fh.write("round 1 line 2, written before the round ended\n")
    next_round(root, workers)
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
    files, out = labelled_rank_files(tmp_path, "node2", workers)
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
    files, out = labelled_rank_files(tmp_path, "node1", workers)
    rank_file(root, 0, 0).write_text("round 1, rank never seen\n")
    files.poll(out)
    next_round(root, workers)
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
