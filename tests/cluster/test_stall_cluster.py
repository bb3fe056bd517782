"""A stalled job is noticed (launching/stall.py): a 2-node job whose rank 3 never joins the barrier its peers wait
in ends within stall_timeout + 30 s of its last progress, with every rank's Python stack in the log, the rank that
differs named in Snakemake's error, and nothing of it left running. The stall is the worker's own code; no
verdict depends on how fast anything runs (the one time bound is the issue's: timeout + 30 s)."""

from __future__ import annotations

import re
from datetime import datetime

import pytest

from snakemake_executor_multinode.contract.jobfiles import StateFolders
from snakemake_executor_multinode.launching import stall
from tests.helpers import (
    alive,
    copied_workflow,
    job_logs,
    jobs_from,
    log_times,
    run_log_names,
    snakemake,
    torchrun_workflow,
)


def test_a_deadlocked_two_node_job_is_ended_with_every_ranks_stack_and_the_odd_rank_named(slurm_cluster, tmp_path):
    wd = copied_workflow("stall", tmp_path)
    proc = snakemake(wd, jobs=1, timeout=600, check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said
    (log,) = job_logs(wd, "train")
    text = log.read_text()
    # Snakemake's error: what happened, where the stacks are, which rank differs
    assert "stalled: no progress for 20s on any rank; stacks in" in said, said
    assert re.search(r"rank 3 differs: <module> \(stall\.py:\d+\)", said), said
    assert "exit code 87" in said or "job script exit 87" in said
    # every rank's stack in the log, labelled; the blocking lines of the worker among them
    stacks = {int(m[1]) for m in re.finditer(r"^\[node\d rank(\d)\] stack\| ", text, re.M)}
    assert stacks == {0, 1, 2, 3}, text
    assert re.search(r"^\[node\d rank3\] stack\| .*<module> \(stall\.py:\d+\)", text, re.M)
    assert re.search(r"^\[node\d rank0\] stack\| .*barrier \(.*distributed_c10d\.py:\d+\)", text, re.M)
    # ended within stall_timeout + 30 s of the last progress, not at the time limit (30 min)
    noticed = re.search(r"^\[multinode torchrun\] stall noticed at (\S+): no progress for (\d+) s", text, re.M)
    assert noticed, text
    last_progress = datetime.fromisoformat(noticed[1]).timestamp() - int(noticed[2])
    _, end = log_times(log)
    assert end.timestamp() - last_progress <= 20 + 30, text
    # nothing left: every worker process ended with the job
    pids = [int((wd / "pids" / str(r)).read_text()) for r in range(4)]
    assert not [p for p in pids if alive(p, "python3") or alive(p, "python")]


@pytest.mark.slow
def test_a_stalled_job_under_on_stall_requeue_is_requeued_and_its_next_run_resumes_and_finishes(
    slurm_cluster, tmp_path
):
    """on_stall: requeue. The same deadlock is ended the same way, then the job script requeues the job (one
    submission, no Snakemake retry); the next run resumes from the checkpoints the stalled one left and finishes."""
    wd = copied_workflow("stall", tmp_path)
    proc = snakemake(wd, "--config", "on_stall=requeue", jobs=1, timeout=900, check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0 and (wd / "done.txt").exists(), said
    (job,) = jobs_from(slurm_cluster, wd)  # one submission: the requeue is the job's own
    # Snakemake's news line gives the stall as the reason, not a time-limit checkpoint that never happened
    assert f"SLURM job {job} (train): requeued (stalled: ended by the progress watchdog, on_stall requeue)" in said
    logdir = StateFolders(wd).logs / "rule_train"
    first, rerun = (next(logdir.rglob(name)).read_text() for name in run_log_names(job, 1))
    assert re.search(
        r"stalled: no progress for 20s on any rank; stacks in \S+; rank 3 differs: .*; requeued to resume", first
    ), first
    assert re.search(r"^\[node\d rank3\] stack\| .*<module> \(stall\.py:\d+\)", first, re.M), first
    # the job script says what happened: the watchdog's stall, no signal
    assert "[multinode] stalled, ended by the progress watchdog (on_stall: requeue): stalled: no progress" in first
    assert "checkpointed after" not in first and "[multinode] requeued; the next run resumes" in first, first
    resumed = {
        int(m[1])
        for m in re.finditer(
            r"^\[node\d rank\d\] rank (\d): resumed from the checkpoint of rank \1 at restart 1$", rerun, re.M
        )
    }
    assert resumed == {0, 1, 2, 3}, rerun
    assert "[multinode] exit 0," in rerun and "stall noticed" not in rerun, rerun
    pids = [int((wd / "pids" / str(r)).read_text()) for r in range(4)]  # the stalled run's workers
    assert not [p for p in pids if alive(p, "python3") or alive(p, "python")]


# A start slower than the timeout: 15 s without a line (torch's import on a loaded node, the rendezvous) against a
# 5 s stall_timeout; then the training prints, agrees in a barrier and ends.
SLOW_START = """
import sys, time
time.sleep(15)
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()}: started", flush=True)
dist.barrier()
if dist.get_rank() == 0:
    open(sys.argv[1], "w").write("trained\\n")
dist.destroy_process_group()
"""


def test_a_start_slower_than_stall_timeout_is_no_stall_the_timeout_counts_from_the_first_line(slurm_cluster, tmp_path):
    wd = torchrun_workflow(tmp_path, "slow.py", SLOW_START, 'nodes=2, gpus=1, stall_timeout="5s", max_restarts=0')
    proc = snakemake(wd, jobs=1, timeout=600, check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0 and (wd / "out.txt").read_text() == "trained\n", said
    (log,) = job_logs(wd, "train")
    text = log.read_text()
    assert stall.NOTICED not in text and stall.RELAUNCHED not in text, text
    started = {int(m[1]) for m in re.finditer(r"^\[node\d rank(\d)\] rank \1: started$", text, re.M)}
    assert started == {0, 1}, text
