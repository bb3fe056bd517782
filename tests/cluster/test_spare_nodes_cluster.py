"""A node dies under a 2-node torch job with a spare (spare_nodes=1): the launcher swaps the spare in, in the same job.

The job holds 3 nodes (--no-kill) and trains on 2. The non-head node is killed by pid, as in
test_node_death_cluster.py; the launcher blames it, ends the step, and starts a new step on the head and the spare
with the same world size, MULTINODE_RELAUNCH=1. The training resumes from the step it saved, and the job ends with
exit 0: one submission, no requeue, no retry. Afterwards the node is brought back.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.launching import launcher
from tests.helpers import (
    Snakemake,
    ckpt_loop,
    figures,
    kill_node,
    rank_pids,
    records,
    relaunched_on_the_spare,
    sacct_jobs,
    saved_step,
    torchrun_workflow,
    train_rule,
    training_folder,
    wait_for,
)
from tests.training.helpers import TINY, train

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CKPT = ckpt_loop()  # resumes from the step rank 0 saves; a launch trains until release-<relaunch> exists

RESOURCES = "nodes=2, gpus=1, spare_nodes=1"


def test_a_dead_node_is_replaced_by_the_spare_in_the_same_job(slurm_cluster, tmp_path, restore_nodes):
    wd = torchrun_workflow(tmp_path, "ckpt.py", CKPT, RESOURCES)
    sm = Snakemake(wd)  # no --retries: only the spare can save the job
    try:
        job, joblog = sm.submitted("train")
        first = wait_for(lambda: len(r := sorted(wd.glob(f"ready-{job}-0-*"))) == 2 and r, "both ranks ready", 300)
        head, other = (p.name.split("-", 4)[4] for p in first)  # ready-<job>-<relaunch>-<rank>-<host>
        wait_for(lambda: saved_step(wd) >= 5, "five steps saved", 120)
        restore_nodes.append(other)
        killed = kill_node(slurm_cluster, other)  # the fault
        wait_for(lambda: "replacing node" in joblog.read_text(), "the launcher's replacement line", 120)
        second = wait_for(lambda: len(r := sorted(wd.glob(f"ready-{job}-1-*"))) == 2 and r, "relaunched ranks", 300)
        relaunched = time.monotonic()
        (wd / "release-1").touch()
        rc = sm.wait(600)
    finally:
        (wd / "release-0").touch()
        (wd / "release-1").touch()
        sm.stop()
    assert rc == 0, sm.text
    relaunch_hosts = [p.name.split("-", 4)[4] for p in second]
    spare = relaunch_hosts[1]
    assert relaunch_hosts[0] == head and spare not in (head, other)  # ranks 0 and 1: the head, then the spare
    log = joblog.read_text()
    assert f"replacing node {other} (does not answer: the node is down) with spare {spare}; relaunch 1" in log, log
    assert f"nodes {head},{spare}, 0 spare(s) left" in log, log
    # every rank's start: the first launch from step 0, the relaunch from the step saved before the kill, told it is
    # relaunch 1
    assert relaunched_on_the_spare(wd, head, other, spare) >= 5
    # one job, one run: no requeue, no retry
    recs = records(wd)
    assert [r["jobid"] for r in recs] == [job], recs
    assert (wd / "out.txt").read_text().split() == [job]
    runs = sacct_jobs(slurm_cluster, {r["job_name"] for r in recs}, {job})
    assert runs == {job: ["COMPLETED"]}, runs
    # the job script's own record of its runs: one start and one end, restart 0, exit 0; no later run's log
    files = JobFiles.from_log(joblog)
    lines = [json.loads(x) for x in files.runs.read_text().splitlines()]
    assert [(x["event"], x["restart"]) for x in lines] == [("start", 0), ("end", 0)] and lines[1]["exit"] == 0, lines
    assert files.restart_logs() == []
    # the replacement is on record, and `multinode status` names it
    record = [json.loads(x) for x in files.replacements.read_text().splitlines()]
    assert [(r["node"], r["spare"], r["relaunch"]) for r in record] == [(other, spare, 1)], record
    status = subprocess.run(
        [sys.executable, "-m", "snakemake_executor_multinode.cli", "status"],
        cwd=wd, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert f"{other} -> {spare} (does not answer: the node is down)" in status.stdout, status.stdout + status.stderr
    figures("spare node", kill_to_relaunched_ranks_s=round(relaunched - killed, 1), dead=other, spare=spare)


# The first launch deadlocks: ranks 0-2 wait in a barrier that rank 3 (on the second node) never joins; a relaunch
# finishes. Each rank writes where it starts (launch-<rank>.txt: relaunch, host).
STALL = """
import os, pathlib, socket, sys, time
import torch.distributed as dist

dist.init_process_group("gloo")
rank, host, relaunch = dist.get_rank(), socket.gethostname(), os.environ.get("MULTINODE_RELAUNCH", "unset")
with open(f"launch-{rank}.txt", "a") as fh:
    fh.write(f"{relaunch} {host}\\n")
print(f"rank {rank} on {host}: relaunch {relaunch}", flush=True)
if relaunch == "0" and rank == 3:
    time.sleep(3600)  # the blocking line
dist.barrier()
if rank == 0:
    pathlib.Path(sys.argv[1]).write_text(os.environ["SLURM_JOB_ID"] + "\\n")
dist.destroy_process_group()
"""

STALL_RESOURCES = 'nodes=2, gpus=2, cpus_per_task=2, spare_nodes=1, stall_timeout="20s"'


def test_the_node_of_a_stalled_rank_is_replaced_by_the_spare_in_the_same_job(slurm_cluster, tmp_path):
    wd = torchrun_workflow(tmp_path, "stall.py", STALL, STALL_RESOURCES)
    sm = Snakemake(wd)
    try:
        job, joblog = sm.submitted("train")
        rc = sm.wait(600)
    finally:
        sm.stop()
    assert rc == 0, sm.text
    log = joblog.read_text()
    starts = {rank: (wd / f"launch-{rank}.txt").read_text().split() for rank in range(4)}
    first = {rank: lines[1] for rank, lines in starts.items()}  # relaunch 0's host of each rank
    second = {rank: lines[3] for rank, lines in starts.items() if len(lines) == 4}
    assert all(lines[0] == "0" and lines[2] == "1" for lines in starts.values()), starts
    head, stalled = first[0], first[3]
    (spare,) = set(second.values()) - {head}
    assert spare != stalled and len(set(second.values())) == 2, starts
    assert re.search(rf"stalled: no progress for 20s on any rank; .*rank 3 differs: .*; node {stalled} holds", log)
    assert f"replacing node {stalled} (stalled: its ranks differ" in log and f"with spare {spare}; relaunch 1" in log
    # the relaunched step's labellers found no stale stack request: no stack was taken after the replacement
    assert "] stack| " not in log.split("replacing node", 1)[1], log
    assert (wd / "out.txt").read_text().split() == [job]
    recs = records(wd)
    assert [r["jobid"] for r in recs] == [job], recs
    assert sacct_jobs(slurm_cluster, {r["job_name"] for r in recs}, {job}) == {job: ["COMPLETED"]}
    assert "stalled: no progress" not in sm.text, sm.text  # no stall verdict (marker) reached Snakemake


def test_with_its_spare_used_up_a_second_dead_node_ends_the_job_and_the_retry_resumes_without_both(
    slurm_cluster, tmp_path, restore_nodes
):
    """Spares used up: the first dead node is replaced in the job, the second ends it (today's path). The retry is
    a new job that leaves out both nodes (the one it failed on and the one the spare replaced) and resumes from the
    step saved before the second death: no step is lost."""
    wd = torchrun_workflow(tmp_path, "ckpt.py", CKPT, RESOURCES)
    sm = Snakemake(wd, "--retries", "1")
    try:
        job, joblog = sm.submitted("train")
        first = wait_for(lambda: len(r := sorted(wd.glob(f"ready-{job}-0-*"))) == 2 and r, "both ranks ready", 300)
        head, dead = (p.name.split("-", 4)[4] for p in first)
        wait_for(lambda: saved_step(wd) >= 3, "three steps saved", 120)
        restore_nodes.append(dead)
        kill_node(slurm_cluster, dead)  # replaced by the spare
        second = wait_for(lambda: len(r := sorted(wd.glob(f"ready-{job}-1-*"))) == 2 and r, "relaunched ranks", 300)
        spare = second[1].name.split("-", 4)[4]
        wait_for(lambda: saved_step(wd) >= 6, "steps saved after the relaunch", 120)
        restore_nodes.append(spare)
        kill_node(slurm_cluster, spare)  # no spare left: the job fails
        before = saved_step(wd)  # the training is stopped by now: its last step stays saved
        _, line = sm.wait_line("rule train: SLURM job", ".attempt2.", timeout=300)
        retry = line.split("SLURM job ")[1].split()[0]
        third = wait_for(lambda: len(r := sorted(wd.glob(f"ready-{retry}-0-*"))) == 2 and r, "the retry's ranks", 300)
        (wd / "release-0").touch()
        rc = sm.wait(600)
    finally:
        for k in (0, 1):
            (wd / f"release-{k}").touch()
        sm.stop()
    assert rc == 0, sm.text
    log = joblog.read_text()
    assert f"replacing node {dead} (does not answer: the node is down) with spare {spare}; relaunch 1" in log, log
    assert f"node {spare} (node_rank 1) does not answer" in log, log
    # the retry runs on neither node, as its script's exclude says
    retry_hosts = {p.name.split("-", 4)[4] for p in third}
    assert not retry_hosts & {dead, spare}, (retry_hosts, dead, spare)
    [script] = [Path(r["script"]).read_text() for r in records(wd) if r["jobid"] == retry]
    assert re.search(rf"^#SBATCH --exclude=({dead},{spare}|{spare},{dead})$", script, re.M), script
    # nothing lost: the retry resumed from the step saved before the second death
    starts = {rank: [line.split() for line in (wd / f"launch-{rank}.txt").read_text().splitlines()] for rank in (0, 1)}
    assert [len(lines) for lines in starts.values()] == [3, 3], starts  # launch, relaunch, retry
    resumed = {int(lines[-1][1]) for lines in starts.values()}
    assert min(resumed) >= before >= 6, (starts, before)
    assert (wd / "out.txt").read_text().split() == [retry]


# The real training (train.py, torch_ddp, gloo): long enough that it is still running when the test stops it after
# its first checkpoint (about 10 ms a step here; 900 steps are left when the checkpoint of step 100 appears).
TRAIN_CFG = {**TINY, "plugin": "torch_ddp", "steps": 1000, "ckpt_every": 100, "keep_ckpts": 2, "log_every": 10}


@pytest.mark.one_release  # the replacement itself is the first test's, on both releases; this one adds the model
def test_a_training_whose_node_dies_resumes_on_the_spare_and_ends_with_the_model_of_a_run_without_the_fault(
    slurm_cluster, tmp_path, restore_nodes
):
    wd = tmp_path / "wf"
    training_folder(wd)
    (wd / "Snakefile").write_text(train_rule(TRAIN_CFG, resources="spare_nodes=1"))
    sm = Snakemake(wd)  # no --retries: only the spare can save the job
    stopped: list[int] = []
    try:
        job, joblog = sm.submitted("train")
        wait_for(lambda: (wd / "ckpt" / "step_00000100").exists(), "the checkpoint of step 100", 600, interval=0.05)
        head, other = re.search(r"; nodes (\S+),(\S+), 1 spare\(s\) left", joblog.read_text()).groups()
        # the training halted by pid where it is (after its first checkpoint, long before its end), then the node
        # killed; the head's rank goes on, and fails on its lost peer (or hangs in its all_reduce until SLURM reports
        # the node failure: said alike)
        workers = {**rank_pids(slurm_cluster, head), **rank_pids(slurm_cluster, other)}
        assert sorted(workers) == [0, 1], workers
        for pid in workers.values():
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        restore_nodes.append(other)
        kill_node(slurm_cluster, other)  # the fault
        os.kill(workers[0], signal.SIGCONT)
        rc = sm.wait(900)
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        sm.stop()
    assert rc == 0, sm.text
    log = joblog.read_text()
    # the live rank failed on its lost peer (the node does not answer), or it hung in its all_reduce and the stall
    # watchdog's probe found the node unreachable: a dead node looks like a cut-off one from the head
    why = re.search(rf"replacing node {other} \((.*)\) with spare", log)
    assert why and why[1] in ("does not answer: the node is down", launcher.UNREACHABLE_WHAT), log
    resumes = [r for r in map(json.loads, (wd / "ckpt" / "metrics.jsonl").read_text().splitlines())
               if r.get("event") == "resume"]  # fmt: skip
    assert [r["step"] for r in resumes] and resumes[0]["step"] >= 100, resumes
    assert [r["jobid"] for r in records(wd)] == [job]  # one SLURM job: no requeue, no retry
    # a run without the fault (the same world size: 2 ranks, gloo, one thread each) makes the same model
    ref = tmp_path / "ref"
    train(ref, wd / "data", TRAIN_CFG)
    got, want = torch.load(wd / "model.pt", map_location="cpu"), torch.load(ref / "model.pt", map_location="cpu")
    assert got["step"] == want["step"] == TRAIN_CFG["steps"]
    assert got["state_dict"].keys() == want["state_dict"].keys()
    differ = [k for k, v in want["state_dict"].items() if not torch.equal(got["state_dict"][k], v)]
    assert not differ, differ
