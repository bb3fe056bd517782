"""A node dies under a running 2-node torch job: the dead node is named, not the live one whose rank failed first.

The fault is a node's death as the sandbox can make it: its slurmd and every process in its network namespace
SIGKILLed by pid (the slurmd pid from its pid file, the others from `ip netns pids`). The live node's gloo rank
fails at once (its peer vanished) and srun names that live node; the launcher asks every node's slurmd before
blaming one, and the dead node does not answer. SLURM itself would mark the node only after SlurmdTimeout (300 s).
Afterwards the node is brought back (its slurmd restarted, resumed), so later tests have every node.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import RELEASED, Snakemake, figures, kill_node, records, sacct_jobs, torchrun_workflow, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# Every rank says it is ready (a file, and a line), then all_reduces until `release` exists (RELEASED).
RING = (
    RELEASED
    + """
import os, pathlib, socket, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, host, job = dist.get_rank(), socket.gethostname(), os.environ["SLURM_JOB_ID"]
print(f"rank {rank} ready on {host}", flush=True)
pathlib.Path(f"ready-{job}-{rank}-{host}").touch()
while not released("release"):
    time.sleep(0.1)
dist.barrier()
if rank == 0:
    with open(sys.argv[1], "a") as fh:
        fh.write(job + "\\n")
dist.destroy_process_group()
"""
)

RESOURCES = "nodes=2, gpus=1"


def test_a_dead_node_is_named_and_the_retry_runs_without_it(slurm_cluster, tmp_path, restore_nodes):
    wd = torchrun_workflow(tmp_path, "ring.py", RING, RESOURCES)
    sm = Snakemake(wd, "--retries", "1")
    try:
        job, joblog = sm.submitted("train")
        ready = wait_for(lambda: len(r := sorted(wd.glob(f"ready-{job}-*"))) == 2 and r, "both ranks ready", 300)
        # and their lines in the job log: what the node printed last must be there to be quoted
        wait_for(lambda: joblog.read_text().count(" ready on ") == 2, "both ready lines in the job log", 60)
        # ready-<job>-<rank>-<host>: rank 0 runs on the head node (the batch script, the launcher)
        head, other = (p.name.split("-", 3)[3] for p in ready)
        restore_nodes.append(other)
        killed = kill_node(slurm_cluster, other)  # the fault
        noticed, error = sm.wait_line(f"SLURM job {job} failed", timeout=300)
        (wd / "release").touch()
        rc = sm.wait(600)
    finally:
        (wd / "release").touch()
        sm.stop()
    assert rc == 0, sm.text
    assert f"failing node {other}" in error and f"failing node {head}" not in error, error
    # the launcher's verdict, and the dead node's own last lines, in Snakemake's error message
    text = sm.text
    message = text.split(f"SLURM job {job} failed", 1)[1]
    assert f"FAILED: node {other} (node_rank 1) does not answer" in message, text
    assert f"[{other} rank1] rank 1 ready on {other}" in message, text  # the dead node's last words
    log = Path(error.split("log: ", 1)[1].split()[0]).read_text()
    assert f"node {other} (node_rank 1) does not answer" in log and f"node {head} failed after it" in log, log
    recs = sorted(records(wd), key=lambda r: r["attempt"])
    assert [r["attempt"] for r in recs] == [1, 2], recs
    first, retry = (Path(r["script"]).read_text().splitlines() for r in recs)
    assert not [x for x in first if "--exclude" in x]
    assert f"#SBATCH --exclude={other}" in retry
    second = recs[1]["jobid"]
    assert (wd / "out.txt").read_text().split() == [second]  # written once, by the retry
    hosts = slurm_cluster.run("squeue", "-h", "-t", "all", "-j", second, "-o", "%N").stdout.strip()
    assert other not in slurm_cluster.run("scontrol", "show", "hostnames", hosts).stdout.split()
    runs = sacct_jobs(slurm_cluster, {r["job_name"] for r in recs}, {job, second})
    assert runs[job][-1] != "COMPLETED" and runs[second] == ["COMPLETED"] and len(runs) == 2, runs
    figures(
        "node death",
        kill_to_snakemake_error_s=round(noticed - killed, 1),
        dead=other,
        blamed=error.split("failing node ", 1)[1].split(";")[0],
        jobs_lost=0,
        duplicates=0,
    )
