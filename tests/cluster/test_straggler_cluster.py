"""A straggling node under a 2-node torch job with a spare (spare_nodes=1, on_straggler replace): named, replaced.

The job holds 3 nodes (--no-kill) and trains on 2. Each rank times its step's "compute" (a sleep, which a stopped
process overruns: no CPU speed in the verdict) apart from the all_reduce where a fast rank waits for a slow one, and
rank 0 writes each node's mean busy seconds per step as a "ranks" metrics event every 5 steps
(docs/training-contract.md). The test stops the non-head node's worker 80% of the time (SIGSTOP/SIGCONT by pid);
its busy time grows about fivefold, the launcher names the node after the 10 s window (factor 2), ends the step
and relaunches on the head and the spare from the saved step, in the same job, which ends with exit 0.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import JobFiles
from tests.helpers import (
    Slowdown,
    Snakemake,
    figures,
    records,
    relaunched_on_the_spare,
    sacct_jobs,
    saved_step,
    torchrun_workflow,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# Every rank says where it starts (launch-<rank>.txt: relaunch, resumed step, host) and its pid
# (pid-<relaunch>-<rank>: host pid); rank 0 saves the step after every all_reduce (step.txt, by rename), every rank
# resumes from it. Rank 0 ends a launch once release-<relaunch> exists, telling the others in the all_reduce.
STRAGGLE = """
import json, os, pathlib, socket, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world, host = dist.get_rank(), dist.get_world_size(), socket.gethostname()
job, relaunch = os.environ["SLURM_JOB_ID"], os.environ.get("MULTINODE_RELAUNCH", "unset")
saved = pathlib.Path("step.txt")
start = int(saved.read_text()) if saved.exists() else 0
hosts = [None] * world
dist.all_gather_object(hosts, host)
with open(f"launch-{rank}.txt", "a") as fh:
    fh.write(f"{relaunch} {start} {host}\\n")
pathlib.Path(f"pid-{relaunch}-{rank}").write_text(f"{host} {os.getpid()}\\n")
print(f"rank {rank} on {host}: relaunch {relaunch}, resuming at step {start}", flush=True)
step, busy, n = start, 0.0, 0
while True:
    t = time.perf_counter()
    time.sleep(0.05)  # the step's compute
    busy, n = busy + time.perf_counter() - t, n + 1
    done = torch.tensor([1.0 if rank == 0 and pathlib.Path(f"release-{relaunch}").exists() else 0.0])
    dist.all_reduce(done)  # the gradient sync: a fast rank waits here for a slow one
    step += 1
    if rank == 0:
        pathlib.Path("step.tmp").write_text(str(step))
        os.replace("step.tmp", saved)
    if step % 5 == 0:
        every = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(every, torch.tensor([busy / n]))
        busy, n = 0.0, 0
        if rank == 0:
            per = {}
            for h, b in zip(hosts, every):
                per.setdefault(h, []).append(b.item())
            event = {"event": "ranks", "step": step, "wall": time.time(),
                     "busy_s": {h: sum(v) / len(v) for h, v in per.items()}}
            with open(os.environ["MULTINODE_METRICS_FILE"], "a") as fh:
                fh.write(json.dumps(event) + "\\n")
    if done.item() > 0:
        break
if rank == 0:
    with open(sys.argv[1], "a") as fh:
        fh.write(job + "\\n")
dist.destroy_process_group()
"""

RESOURCES = 'nodes=2, gpus=1, spare_nodes=1, on_straggler="replace", straggler_window="10s", straggler_factor=2'


def test_a_straggling_node_is_named_and_replaced_by_the_spare_in_the_same_job(slurm_cluster, tmp_path):
    wd = torchrun_workflow(tmp_path, "straggle.py", STRAGGLE, RESOURCES)
    sm = Snakemake(wd)  # no --retries: only the spare can take the slow node's place
    slow: Slowdown | None = None
    try:
        job, joblog = sm.submitted("train")
        wait_for(lambda: all((wd / f"pid-0-{r}").exists() for r in (0, 1)), "both ranks started", 300)
        head, other = ((wd / f"pid-0-{r}").read_text().split()[0] for r in (0, 1))
        host, pid = (wd / "pid-0-1").read_text().split()
        assert host == other != head and Path(f"/proc/{pid}").exists(), (head, other, pid)
        wait_for(lambda: saved_step(wd) >= 10, "ten steps saved", 120)
        slow = Slowdown(int(pid))  # the fault
        started = time.monotonic()
        wait_for(lambda: "straggler: node" in joblog.read_text(), "the launcher naming a straggler", 300)
        named = time.monotonic()
        slow.end()
        wait_for(lambda: "replacing node" in joblog.read_text(), "the launcher's replacement line", 120)
        wait_for(lambda: all((wd / f"pid-1-{r}").exists() for r in (0, 1)), "relaunched ranks", 300)
        at_relaunch = saved_step(wd)
        wait_for(lambda: saved_step(wd) >= at_relaunch + 10, "ten steps after the relaunch", 120)
        (wd / "release-1").touch()
        rc = sm.wait(600)
    finally:
        if slow is not None:
            slow.end()
        (wd / "release-0").touch()
        (wd / "release-1").touch()
        sm.stop()
    assert rc == 0, sm.text
    log = joblog.read_text()
    spare = re.search(rf"replacing node {other} .* with spare (\S+); relaunch 1", log)[1]  # one of the job's 3 nodes
    assert spare not in (head, other), log
    assert f"straggler: node {other}'s ranks" in log and "> 2x for 10 s" in log, log
    assert f"replacing node {other} (straggler: node {other}'s ranks" in log, log
    assert f"with spare {spare}; relaunch 1" in log and f"nodes {head},{spare}, 0 spare(s) left" in log, log
    assert f"straggler: node {head}" not in log, log  # the fast node is never named
    # every rank's start: the first launch from step 0, the relaunch (ranks 0 and 1 on the head and the spare) from
    # the step saved before the step ended, told it is relaunch 1
    assert relaunched_on_the_spare(wd, head, other, spare) >= 10
    # one job, one run: no requeue, no retry; nothing lost
    recs = records(wd)
    assert [r["jobid"] for r in recs] == [job], recs
    assert (wd / "out.txt").read_text().split() == [job]
    assert sacct_jobs(slurm_cluster, {r["job_name"] for r in recs}, {job}) == {job: ["COMPLETED"]}
    files = JobFiles.from_log(joblog)
    assert files.restart_logs() == []
    # the straggler and its replacement are on record, and `multinode status` names both
    record = [json.loads(x) for x in files.replacements.read_text().splitlines()]
    assert [(r["event"], r["node"]) for r in record] == [("straggler", other), ("replaced", other)], record
    assert record[0]["action"] == "replace" and record[0]["figure"] > 2 * record[0]["median"], record
    assert record[1]["spare"] == spare and record[1]["relaunch"] == 1, record
    status = subprocess.run(
        [sys.executable, "-m", "snakemake_executor_multinode.cli", "status"],
        cwd=wd, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    said = status.stdout + status.stderr
    assert f"{other} straggler (" in said and f"{other} -> {spare} (straggler: node {other}'s" in said, said
    figures("straggler", slowed_to_named_s=round(named - started, 1), slow=other, spare=spare)
