"""`multinode torchrun` on the real local SLURM: labelled, whole log lines from every node and rank, and torchrun's
own command line as users already write it (c10d restarts, --nproc_per_node=gpu, an equal --nnodes)."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest

from snakemake_executor_multinode.nodelog import failing_rank_lines

pytestmark = pytest.mark.cluster

WORKFLOW = Path(__file__).parent / "workflows" / "talk"
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


def test_c10d_rendezvous_restarts_failed_workers_within_the_job(slurm_cluster, tmp_path):
    command = "multinode torchrun --rdzv_backend=c10d --nnodes=2 --nproc_per_node=gpu --max-restarts=1 flaky.py"
    _, state, log = run_job(slurm_cluster, tmp_path, command, "--gres=gpu:2")
    assert state == "COMPLETED", log
    done = re.findall(r"\[node\d rank(\d)\] FLAKY-DONE rank=\1 attempt=(\d)", log)
    assert sorted(done) == [("0", "1"), ("1", "1"), ("2", "1"), ("3", "1")]  # every rank, in the second attempt
    assert "rank 3 fails on its first attempt" in log


def test_a_node_rank_of_ones_own_is_refused_with_the_reason(slurm_cluster, tmp_path):
    _, state, log = run_job(slurm_cluster, tmp_path, "multinode torchrun --node_rank=0 talk.py")
    assert state == "FAILED"
    assert "--node_rank: the launcher gives each node its rank" in log
