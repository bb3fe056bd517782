"""A network split under a 2-node torch job with a spare (issue 38, part 5): one node's traffic is dropped mid-training.

The job holds 3 nodes (spare_nodes=1, --no-kill), trains on 2 with `stall_timeout="20s"`, and saves its step after
every all_reduce. Once steps are saved, every packet between the second node and the cluster's subnet (the other
nodes, the head, slurmctld) is dropped in that node's network namespace (iptables, both directions): its processes
live on, but no traffic reaches them. Every rank then waits in its all_reduce with the same stack, and nothing fails:
the progress watchdog notices the stall, the head node asks every node's slurmd, and the one it cannot reach is named
in the job log within `stall_timeout` + 30 s of the split (the issue's bound), replaced by the spare, and the training
resumes from its saved step in the same job: exit 0, one SLURM job. The rules are removed afterwards, and the test
waits until slurmctld takes jobs on the node again. While torchrun starts (before the split, and again after the
replacement) the test touches the nodes' output files, so that torch's slow import on a loaded machine is not taken
for a stall; from the split to the replacement only the training's own lines count.

The measured figures (split -> named, split -> relaunched ranks) are printed as `[figures] ...` (pytest -s).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest

from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.launching import launcher
from snakemake_executor_multinode.sandbox import cluster
from tests.helpers import (
    Cluster,
    Snakemake,
    ckpt_loop,
    figures,
    node_index,
    records,
    relaunched_on_the_spare,
    sacct_jobs,
    saved_step,
    torchrun_workflow,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

STALL_TIMEOUT_S = 20
BOUND_S = STALL_TIMEOUT_S + 30  # the issue's: the unreachable node named within stall_timeout + 30 s of the split

# Rank 0 prints every step: the progress the watchdog sees (a training that prints nothing between steps would stall
# in its own right).
CKPT = ckpt_loop(0.2, print_steps=True)

RESOURCES = f'nodes=2, gpus=1, spare_nodes=1, stall_timeout="{STALL_TIMEOUT_S}s"'


def drop_traffic(cl: Cluster, host: str, iptables: str, action: str) -> None:
    """`-I`: every packet between the node and the cluster's subnet dropped, in and out, in the node's own network
    namespace (its loopback untouched); `-D`: those rules removed again."""
    netns = cl.spec.netns(node_index(cl, host))
    subnet = f"{cl.spec.subnet}.0/24"
    for chain, way, addr in (("INPUT", "-i", "-s"), ("OUTPUT", "-o", "-d")):
        rule = [chain, way, "eth0", addr, subnet, "-j", "DROP"]
        subprocess.run(["ip", "netns", "exec", netns, iptables, action, *rule], check=True, timeout=30)


def test_a_node_cut_off_by_a_network_split_is_named_and_replaced_by_the_spare(slurm_cluster, tmp_path):
    iptables = shutil.which("iptables")
    assert iptables, "iptables is missing (scripts/bootstrap.sh installs it)"
    wd = torchrun_workflow(tmp_path, "ckpt.py", CKPT, RESOURCES)
    sm = Snakemake(wd)  # no --retries: only the spare can save the job
    cut: str | None = None
    try:
        job, joblog = sm.submitted("train")
        first = wait_for(
            lambda: len(r := sorted(wd.glob(f"ready-{job}-0-*"))) == 2 and r, "both ranks ready", 300, sm.proc
        )
        head, other = (p.name.split("-", 4)[4] for p in first)  # ready-<job>-<relaunch>-<rank>-<host>
        wait_for(lambda: saved_step(wd) >= 5, "five steps saved", 120, sm.proc)
        cut = other
        drop_traffic(slurm_cluster, other, iptables, "-I")  # the fault
        split_at = time.monotonic()
        at_split = saved_step(wd)
        named = f"node {other} (node_rank 1) is unreachable from the head node {head}"
        named_at = wait_for(
            lambda: named in joblog.read_text() and time.monotonic(), "the unreachable node named", 300, sm.proc, 0.1
        )
        wait_for(lambda: "replacing node" in joblog.read_text(), "the replacement", 300, sm.proc)
        second = wait_for(
            lambda: len(r := sorted(wd.glob(f"ready-{job}-1-*"))) == 2 and r, "relaunched ranks", 300, sm.proc
        )
        relaunched = time.monotonic()
        (wd / "release-1").touch()
        rc = sm.wait(600)
    finally:
        (wd / "release-0").touch()
        (wd / "release-1").touch()
        sm.stop()
        if cut is not None:  # later tests see a healthy node: its traffic flows, and slurmctld takes jobs there
            drop_traffic(slurm_cluster, cut, iptables, "-D")
            healed = time.monotonic()
            cluster.restart_node(slurm_cluster.spec, node_index(slurm_cluster, cut), timeout=400)
            figures("network split: restore", node_takes_jobs_again_s=round(time.monotonic() - healed, 1))
    assert rc == 0, sm.text
    log = joblog.read_text()
    assert named_at - split_at <= BOUND_S, (named_at - split_at, log)
    relaunch_hosts = [p.name.split("-", 4)[4] for p in second]
    spare = relaunch_hosts[1]
    assert relaunch_hosts[0] == head and spare not in (head, other), relaunch_hosts
    # the stall noticed first (every rank waits alike), then the node named, then replaced, saying why
    why = launcher.UNREACHABLE_WHAT
    replaced = f"replacing node {other} ({why}) with spare {spare}; relaunch 1"
    assert log.index("stall noticed at") < log.index(named) < log.index(replaced), log
    assert f"nodes {head},{spare}, 0 spare(s) left" in log, log
    # the first launch from step 0, the relaunch from the step saved before the split, told it is relaunch 1
    assert relaunched_on_the_spare(wd, head, other, spare) >= at_split >= 5, at_split
    # one job, one run: no requeue, no retry; no stall verdict reached Snakemake
    recs = records(wd)
    assert [r["jobid"] for r in recs] == [job], recs
    assert (wd / "out.txt").read_text().split() == [job]
    assert sacct_jobs(slurm_cluster, {r["job_name"] for r in recs}, {job}) == {job: ["COMPLETED"]}
    assert "stalled: no progress" not in sm.text, sm.text
    files = JobFiles.from_log(joblog)
    assert files.restart_logs() == []
    record = [json.loads(x) for x in files.replacements.read_text().splitlines()]
    assert [(r["node"], r["spare"], r["why"], r["relaunch"]) for r in record] == [(other, spare, why, 1)], record
    status = subprocess.run(
        [sys.executable, "-m", "snakemake_executor_multinode.cli", "status"],
        cwd=wd, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert f"{other} -> {spare} ({why})" in status.stdout, status.stdout + status.stderr
    figures(
        "network split",
        split_to_named_s=round(named_at - split_at, 1),
        bound_s=BOUND_S,
        split_to_relaunched_ranks_s=round(relaunched - split_at, 1),
        cut=other,
        spare=spare,
    )
