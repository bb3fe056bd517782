"""GPU sampling on the real local SLURM cluster: a GPU job samples every node's GPUs with nvidia-smi beside its log,
and `multinode status` and `multinode report` show each node's mean utilisation and peak memory.

The local nodes have fake GPUs (character devices) and no nvidia-smi: the sampling test puts a stand-in nvidia-smi
(tests/workflows/follow/nvidia-smi, two GPUs at 40% / 1000 MiB and 60% / 3000 MiB of 81559 MiB) first on the PATH
that the jobs inherit; the other test runs a GPU job where nvidia-smi is absent. The job's ranks wait for a release
file; the test waits for events, and the timeouts only stop hangs.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import JobFiles, StateFolders
from tests.helpers import ANY_FIRST_LOG, background, copied_workflow, multinode, wait_for

pytestmark = pytest.mark.cluster
QUERY = "--query-gpu=timestamp,index,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits"


def log_text(wd: Path) -> str:
    """The newest job's log; "" before it has one (`multinode logs` exits 2 then)."""
    return multinode(wd, "logs", check=False).stdout


def sacct_steps(cl, jobid: str) -> str:
    return cl.run("sacct", "-n", "-P", "-j", jobid, "-o", "JobName,State").stdout


def sample_files(wd: Path) -> dict[str, Path]:
    logs = list((StateFolders(wd).logs / "rule_ranks" / "_").glob(ANY_FIRST_LOG))
    return JobFiles.from_log(logs[0]).gpu_samples_by_node() if logs else {}


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def test_a_gpu_job_samples_every_node_and_status_and_report_show_it(slurm_cluster, tmp_path, monkeypatch):
    wd = copied_workflow("follow", tmp_path)
    stub = wd / "bin"
    stub.mkdir()
    shutil.move(wd / "nvidia-smi", stub / "nvidia-smi")
    monkeypatch.setenv("PATH", f"{stub}:{os.environ['PATH']}")
    with background(wd, "--multinode-gpu-sample-seconds", "1") as sm:
        # both nodes have written a sample of both GPUs
        files = wait_for(
            lambda: (
                len(f := sample_files(wd)) == 2 and all(len(p.read_text().splitlines()) >= 2 for p in f.values()) and f
            ),
            "both nodes' GPU samples",
            timeout=300,
            proc=sm.proc,
        )
        nodes = sorted(files)
        # one sampler per node, asked for the CSV of the fields the protocol names, every second
        calls = {n: (stub / f"calls.{n}").read_text().splitlines() for n in nodes}
        assert all(len(c) == 1 and c[0].split(" ", 1)[1] == f"{QUERY} -l 1" for c in calls.values()), calls
        status = multinode(wd, "status").stdout
        jobid = re.search(r"^ranks\s+(\d+)\s", status, re.M)[1]
        use = ", ".join(f"{n} util 50% mem 2.9/79.6 GiB" for n in nodes)
        gpu_paragraph = next(p for p in status.split("\n\n") if p.startswith("GPU use so far"))
        assert gpu_paragraph.splitlines() == [
            "GPU use so far (per node: mean utilisation, peak memory of one GPU):",
            f"  ranks (job {jobid}): {use}",
        ]
        (wd / "release").touch()
        assert sm.wait() == 0
    # the samplers ended with the job
    pids = [int(c[0].split()[0]) for c in calls.values()]
    wait_for(lambda: not any(alive(p) for p in pids), "the samplers' end", timeout=120)
    report = multinode(wd, "report").stdout
    assert f"| ranks | - | {jobid} | {use} |" in report.split("## GPU use per job")[1]


def test_without_nvidia_smi_no_sampler_runs_and_the_job_succeeds(slurm_cluster, tmp_path):
    wd = copied_workflow("follow", tmp_path)
    (wd / "nvidia-smi").unlink()
    assert shutil.which("nvidia-smi") is None  # the local nodes have none
    with background(wd, "--multinode-gpu-sample-seconds", "1") as sm:
        shown = wait_for(
            lambda: "BEFORE rank=3" in (out := log_text(wd)) and out, "every rank's start", timeout=300, proc=sm.proc
        )
        jobid = re.search(r"job (\d+), rule ranks", shown)[1]
        (wd / "release").touch()
        assert sm.wait() == 0
    # the job's steps as accounting recorded them, once it has the batch step's end: no sampler step
    steps = wait_for(lambda: "batch|COMPLETED" in (out := sacct_steps(slurm_cluster, jobid)) and out, "the job's steps")
    assert "torchrun|COMPLETED" in steps and "gpu-samples" not in steps, steps
    assert sample_files(wd) == {}
    assert "GPU use" not in multinode(wd, "status").stdout
