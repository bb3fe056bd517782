"""`snakemake --executor multinode` on the real local SLURM cluster (3 namespaced nodes, fake GPUs)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.cluster
WORKFLOWS = REPO / "tests" / "workflows"


def copy_workflow(name: str, tmp_path: Path) -> Path:
    dest = tmp_path / name
    shutil.copytree(WORKFLOWS / name, dest)
    return dest


def snakemake(workdir: Path, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--executor", "multinode", "--jobs", "4", "--latency-wait", "5", *args]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def job_logs(workdir: Path, rule: str) -> list[Path]:
    return sorted((workdir / ".snakemake" / "multinode" / "logs" / f"rule_{rule}").rglob("*.log"))


def submitted_jobs(cl) -> set[str]:
    out = cl.run("squeue", "-h", "-t", "all", "-o", "%i").stdout
    return set(out.split())


def test_gpu_rule_becomes_one_two_node_job_with_one_torchrun_per_node(slurm_cluster, tmp_path):
    wd = copy_workflow("torchrun", tmp_path)
    snakemake(wd)
    result = json.loads((wd / "results" / "allreduce.json").read_text())
    assert result["world_size"] == 4 and result["sum"] == 1 + 2 + 3 + 4
    ranks = sorted(result["ranks"], key=lambda r: r["rank"])
    assert [r["host"] for r in ranks] == ["node1", "node1", "node2", "node2"]
    assert [r["node_rank"] for r in ranks] == [0, 0, 1, 1]
    assert [r["local_rank"] for r in ranks] == [0, 1, 0, 1]
    # cpus_per_task=4 shared by 2 GPU processes per node
    assert {r["omp"] for r in ranks} == {"2"}
    log = job_logs(wd, "allreduce")[0].read_text()
    for line in (
        "NODE_NUM=2",
        "NODELIST: node1 node2",
        f"MASTER_ADDR={slurm_cluster.spec.node_ip(1)}",
        "launching on node1, node_rank=0",
        "launching on node2, node_rank=1",
    ):
        assert line in log


def test_three_rule_chain_runs_cpu_and_multinode_jobs_in_order(slurm_cluster, tmp_path):
    wd = copy_workflow("chain", tmp_path)
    started = time.monotonic()
    snakemake(wd)
    elapsed = time.monotonic() - started
    assert (wd / "results" / "data.txt").read_text().startswith("data-from-node")
    assert (wd / "results" / "evaluated.txt").read_text().split() == ["2", "2", "0,1"]
    # each job's script sits beside its log: what ran can be read back
    for rule in ("preprocess", "train", "evaluate"):
        logs = job_logs(wd, rule)
        assert len(logs) == 1 and logs[0].with_suffix(".sh").exists()
    # markers, not status polls, report completion: a run of 3 short jobs takes seconds, not minutes
    assert elapsed < 60
    # and a second run has nothing to do
    assert "Nothing to be done" in snakemake(wd).stdout + snakemake(wd).stderr


def test_whole_pipeline_submitted_at_once_is_chained_by_afterok(slurm_cluster, tmp_path):
    wd = copy_workflow("chain", tmp_path)
    snakemake(wd, "--immediate-submit", "--notemp")
    scripts = {
        rule: next((wd / ".snakemake/multinode/logs" / f"rule_{rule}").rglob("*.sh"))
        for rule in ("preprocess", "train", "evaluate")
    }
    ids = {rule: path.name.split(".")[0] for rule, path in scripts.items()}
    deps = slurm_cluster.run("squeue", "-h", "-t", "all", "-j", ids["evaluate"], "-o", "%E").stdout
    assert ids["train"] in deps or deps.strip() in ("", "(null)")  # gone once satisfied
    deadline = time.monotonic() + 90
    while not (wd / "results" / "evaluated.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert (wd / "results" / "evaluated.txt").read_text().split() == ["2", "2", "0,1"]
    start = {r: slurm_cluster.run("sacct", "-X", "-n", "-P", "-j", ids[r], "-o", "Start").stdout.strip() for r in ids}
    assert start["preprocess"] <= start["train"] <= start["evaluate"]


def test_wildcards_with_shell_metacharacters_neither_break_the_job_nor_run_anything(slurm_cluster, tmp_path):
    nasty = "a b;$(touch PWNED)'x\"`touch PWNED2`"
    wd = tmp_path / "nasty"
    wd.mkdir()
    (wd / "Snakefile").write_text(
        'rule make:\n    output: "out/{name}.txt"\n    resources: nodes=1, gpus=1\n'
        '    shell: "echo {wildcards.name:q} > {output:q}"\n'
    )
    snakemake(wd, f"out/{nasty}.txt")
    assert (wd / "out" / f"{nasty}.txt").read_text().strip() == nasty
    assert not list(wd.rglob("PWNED*"))


def test_failing_job_reports_slurm_state_exit_code_and_log(slurm_cluster, tmp_path):
    wd = tmp_path / "fail"
    wd.mkdir()
    (wd / "Snakefile").write_text('rule broken:\n    output: "out.txt"\n    shell: "echo about to fail; exit 3"\n')
    proc = snakemake(wd, check=False)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "SLURM state FAILED" in text and "job script exit 3" in text
    log = job_logs(wd, "broken")[0]
    assert str(log) in text and "about to fail" in log.read_text()  # kept on failure


def test_failing_node_stops_the_others_and_is_named(slurm_cluster, tmp_path):
    wd = tmp_path / "nodefail"
    wd.mkdir()
    (wd / "fail.py").write_text(
        "import os, sys, time\nif os.environ['GROUP_RANK'] == '1':\n    sys.exit(3)\ntime.sleep(300)\n"
    )
    (wd / "Snakefile").write_text(
        'rule train:\n    output: "out.txt"\n    resources: nodes=2, gpus=1\n'
        '    shell: "multinode torchrun fail.py && touch {output}"\n'
    )
    started = time.monotonic()
    proc = snakemake(wd, check=False)
    assert proc.returncode != 0
    assert time.monotonic() - started < 90  # not the 300 s the surviving rank would sleep
    text = proc.stdout + proc.stderr
    assert "failing node node2" in text
    assert "node node2 (node_rank 1) failed" in job_logs(wd, "train")[0].read_text()


def test_pre_time_limit_signal_checkpoints_requeues_and_resumes(slurm_cluster, tmp_path):
    wd = copy_workflow("preempt", tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--executor", "multinode", "--jobs", "1"],
        cwd=wd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # both ranks' handlers are installed: send what --signal=USR2@120 sends, to every step process
        deadline = time.monotonic() + 90
        while len(list((wd / "results").glob("ckpt.ready*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.3)
        job = next((wd / ".snakemake/multinode/logs/rule_train").rglob("*.sh")).name.split(".")[0]
        slurm_cluster.run("scancel", "--signal=USR2", job)
        out, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert (wd / "results" / "done.txt").read_text().strip() == "resumed from step-42 restart=1"
    logs = [p.name for p in job_logs(wd, "train")]
    assert logs == [f"{job}.attempt1.log", f"{job}.attempt1.restart1.log"]  # one log per run
    first = (job_logs(wd, "train")[0]).read_text()
    assert "checkpointed after SIGUSR2" in first and "requeued" in first


def test_ctrl_c_cancels_every_submitted_job(slurm_cluster, tmp_path):
    wd = tmp_path / "cancel"
    wd.mkdir()
    (wd / "Snakefile").write_text(
        'rule all:\n    input: expand("out/{i}.txt", i=range(2))\n'
        'rule sleep:\n    output: "out/{i}.txt"\n    shell: "sleep 300; touch {output}"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--executor", "multinode", "--jobs", "2"],
        cwd=wd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        scripts: list[Path] = []
        while len(scripts) < 2 and time.monotonic() < deadline:
            scripts = [p for p in (wd / ".snakemake").rglob("*.attempt1.sh")]
            time.sleep(0.3)
        ids = [p.name.split(".")[0] for p in scripts]
        assert len(ids) == 2
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    deadline = time.monotonic() + 30
    states: list[str] = []
    while time.monotonic() < deadline:
        states = slurm_cluster.run("squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%T").stdout.split()
        if states and all(s == "CANCELLED" for s in states):
            break
        time.sleep(0.5)
    assert states == ["CANCELLED", "CANCELLED"]


def test_more_nodes_than_the_partition_has_is_sbatch_error_surfaced(slurm_cluster, tmp_path):
    wd = tmp_path / "toobig"
    wd.mkdir()
    (wd / "Snakefile").write_text('rule big:\n    output: "x"\n    resources: nodes=5\n    shell: "touch {output}"\n')
    proc = snakemake(wd, check=False)
    assert proc.returncode != 0
    assert "rule 'big': sbatch refused the job" in proc.stderr + proc.stdout
    assert "Node count specification invalid" in proc.stderr + proc.stdout


def test_bad_resources_stop_the_run_before_anything_is_submitted(slurm_cluster, tmp_path):
    wd = tmp_path / "bad"
    wd.mkdir()
    (wd / "Snakefile").write_text(
        'rule all:\n    input: "b.txt"\n'
        'rule a:\n    output: "a.txt"\n    shell: "touch {output}"\n'
        'rule b:\n    input: "a.txt"\n    output: "b.txt"\n    resources: nodes=2, gpus=4, cpus_per_task=2\n'
        '    shell: "touch {output}"\n'
    )
    before = submitted_jobs(slurm_cluster)
    proc = snakemake(wd, check=False)
    assert proc.returncode != 0
    assert "rule 'b': resource cpus_per_task=2 is invalid: must be at least gpus=4" in proc.stderr + proc.stdout
    assert submitted_jobs(slurm_cluster) == before
    assert not (wd / "a.txt").exists()


def test_snakemake_own_executor_test_workflows_pass(slurm_cluster, tmp_path):
    """snakemake.common.tests' simple (a -> b -> c, report output, a '/' in a wildcard) and groups workflows."""
    code = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(REPO / "tests" / "snakemake_suite.py"),
            "--basetemp",
            str(tmp_path / "suite"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"PYTHONPATH": str(REPO)},
    )
    assert code.returncode == 0, code.stdout[-4000:] + code.stderr[-2000:]
    assert "2 passed" in code.stdout


HAND_WRITTEN = """#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --gres=gpu:2 --cpus-per-task=2
cd {wd}
{launch}
"""


@pytest.mark.parametrize(
    "launch",
    [
        "multinode torchrun allreduce.py results/allreduce.json",  # from the batch script: one srun per node
        "srun --ntasks-per-node=1 multinode torchrun allreduce.py results/allreduce.json",  # one task per node
    ],
    ids=["batch-script", "srun-step"],
)
def test_multinode_torchrun_uses_a_hand_written_allocation(slurm_cluster, tmp_path, launch):
    wd = copy_workflow("torchrun", tmp_path)
    (wd / "results").mkdir()
    script = wd / "job.sbatch"
    script.write_text(HAND_WRITTEN.format(wd=wd, launch=launch))
    job = slurm_cluster.run("sbatch", "--parsable", "-o", str(wd / "job.log"), str(script)).stdout.strip()
    deadline = time.monotonic() + 120
    state = ""
    while time.monotonic() < deadline:
        state = slurm_cluster.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%T").stdout.strip()
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        time.sleep(0.5)
    assert state == "COMPLETED", (wd / "job.log").read_text()
    result = json.loads((wd / "results" / "allreduce.json").read_text())
    assert result["world_size"] == 4
    assert sorted((r["host"], r["node_rank"]) for r in result["ranks"]) == [
        ("node1", 0),
        ("node1", 0),
        ("node2", 1),
        ("node2", 1),
    ]
