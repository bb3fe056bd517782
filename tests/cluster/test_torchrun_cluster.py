"""`multinode torchrun` on the real local SLURM: labelled, whole log lines from every node and rank, and torchrun's
own command line as users already write it (c10d restarts, --nproc_per_node=gpu, an equal --nnodes)."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.logline import failing_rank_lines
from tests.helpers import REPO, cpu_saturated

pytestmark = pytest.mark.cluster

WORKFLOW = REPO / "tests" / "workflows" / "talk"
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def run_job(cl, wd: Path, command: str, *sbatch: str) -> tuple[str, str, str]:
    """Submits `command` as a 2-node batch job from `wd`; waits for SLURM's end state (the timeout only stops a
    hang) and returns (job id, state, job log)."""
    for name in ("talk.py", "flaky.py", "fail.py"):
        shutil.copy(WORKFLOW / name, wd / name)
    job = cl.run(
        "sbatch", "--parsable", "-N2", "-o", str(wd / "job.log"), *sbatch, "--wrap", command, cwd=wd
    ).stdout.strip()
    deadline, state = time.monotonic() + 300, ""
    while time.monotonic() < deadline:
        state = cl.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%T").stdout.strip()
        if state in ENDED:
            break
        time.sleep(0.5)
    return job, state, (wd / "job.log").read_text()


TALK = re.compile(r"\[(node\d) rank(\d)\] TALK rank=(\d) line=(\d+) (x*) END")


def test_every_line_is_whole_once_and_labelled_with_its_node_and_rank(slurm_cluster, tmp_path):
    job, state, log = run_job(slurm_cluster, tmp_path, "multinode torchrun --nproc_per_node=2 talk.py")
    assert state == "COMPLETED", log
    talk = [line for line in log.splitlines() if "TALK rank=" in line]
    seen = set()
    for line in talk:
        m = TALK.fullmatch(line)
        assert m, f"cut or run together: {line[:200]!r}"
        node, label_rank, rank, i, xs = m.groups()
        assert label_rank == rank and len(xs) == int(i) * 50
        seen.add((node, int(rank), int(i)))
    assert len(talk) == len(seen) == 4 * 120  # each line once
    # ranks 0-1 on the head node, 2-3 on the other: the label names the node that wrote the line
    nodes = {rank: node for node, rank, _ in seen}
    assert nodes[0] == nodes[1] != nodes[2] == nodes[3]
    errs = [line for line in log.splitlines() if "TALK-ERR" in line]
    assert len(errs) == 4 * 6 and all(re.fullmatch(r"\[node\d rank(\d)\] TALK-ERR rank=\1 line=\d+", e) for e in errs)
    # each node's whole output is also kept beside the job log, its own lines only
    for node in set(nodes.values()):
        own = (tmp_path / f"slurm-{job}.{node}.out").read_text().splitlines()
        assert sum("TALK rank=" in line for line in own) == 2 * 120
        assert all(line.startswith(f"[{node}") for line in own)
    # c10d's "hostname of the client socket cannot be retrieved": fixed at its cause (the nodes' reverse lookup)
    assert "hostname of the client socket" not in log


def test_the_failing_ranks_last_lines_are_found_in_the_log(slurm_cluster, tmp_path):
    _, state, log = run_job(slurm_cluster, tmp_path, "multinode torchrun --nproc_per_node=2 fail.py")
    assert state == "FAILED", log
    failed = re.search(r"FAILED: node (\S+) \(node_rank 1\)", log)
    assert failed, log
    label, lines = failing_rank_lines(log, failed[1])
    assert label == f"{failed[1]} rank3"
    assert any("the data shard is corrupt" in line for line in lines)
    assert any("RuntimeError: corrupt shard" in line for line in lines)


FLAKY = re.compile(r"\[(node\d) rank(\d)\] (FLAKY rank=(\d) worker=(node\d)-\d+ attempt=\d world=4 line=\d+)")


def test_c10d_restarts_lose_no_line_of_any_rank_in_any_round_on_a_saturated_machine(slurm_cluster, tmp_path):
    """c10d with --max-restarts=1: one rank fails once after its lines, every worker restarts, the second round
    completes. With the CPU saturated (one busy loop per core plus one), a healthy node's agent often restarts its
    workers for the membership change under the same attempt number, and torchrun writes their files anew under the
    same paths: every line every worker wrote (its own truth file) is in its node's file and in the job log exactly
    once, labelled with the node and the rank that wrote it in that round."""
    command = "multinode torchrun --rdzv_backend=c10d --nnodes=2 --nproc_per_node=gpu --max-restarts=1 flaky.py"
    with cpu_saturated():
        job, state, log = run_job(slurm_cluster, tmp_path, command, "--gres=gpu:2")
    assert state == "COMPLETED", log
    truth = [line for f in sorted((tmp_path / "truth").glob("*.txt")) for line in f.read_text().splitlines()]
    assert len(truth) >= 2 * 4 * 50 and (tmp_path / "failed-once").exists()  # two rounds of 4 workers at least
    names = sorted(p.name.split(".")[1] for p in tmp_path.glob(f"slurm-{job}.*.out"))  # the job's two nodes
    assert len(names) == 2, names
    nodes = [(tmp_path / f"slurm-{job}.{node}.out").read_text() for node in names]
    for where in [log, *nodes]:
        lines = [m for m in map(FLAKY.fullmatch, where.splitlines()) if m]
        for m in lines:  # labelled with the node and the rank that wrote it
            node, label_rank, _, rank, worker_node = m.groups()
            assert node == worker_node and label_rank == rank, m[0]
        said = [m[3] for m in lines]
        assert len(said) == len(set(said)), "a line twice"
    in_log = {m[3] for m in map(FLAKY.fullmatch, log.splitlines()) if m}
    assert set(truth) <= in_log, sorted(set(truth) - in_log)[:5]
    for node, own in zip(names, nodes, strict=True):  # a node's file: every line of its own workers
        mine = {line for line in truth if f"worker={node}-" in line}
        assert mine and mine <= {m[3] for m in map(FLAKY.fullmatch, own.splitlines()) if m}
    done = re.findall(r"\[node\d rank(\d)\] FLAKY-DONE rank=\1 ", log)
    assert sorted(done) == ["0", "1", "2", "3"]  # every rank ends, in the last round
    assert "rank 3 fails once" in log


def test_a_node_rank_of_ones_own_is_refused_with_the_reason(slurm_cluster, tmp_path):
    _, state, log = run_job(slurm_cluster, tmp_path, "multinode torchrun --node_rank=0 talk.py")
    assert state == "FAILED"
    assert "--node_rank: the launcher gives each node its rank" in log
