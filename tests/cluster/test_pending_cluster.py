"""A pending job is explained: Snakemake's log says once, in plain words with what to do, why a job waits (after
--multinode-pending-notice-seconds), and `multinode status` shows it under the table. Every wait is the test's doing,
not the clock's: a job held at submission (sbatch --hold through slurm_extra, SLURM's JobHeldUser), a node drained
for it (ReqNodeNotAvail), the partition's time limit lowered under it (PartitionTimeLimit). A failed dependency
never leaves a job waiting. The reasons the sandbox cannot make (association and QOS limits: it enforces none) are
tested from recorded squeue lines (tests/unit/slurm/test_reasons.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import Snakemake, jobs_from, slurm, snakemake, wait_for

SNAKEFILE = """
rule held:
    output: "out.txt"
    resources: slurm_extra="--hold"
    shell: "echo released > {output}"
"""


def test_a_held_job_is_explained_in_the_log_and_in_status_then_runs_once_released(slurm_cluster, tmp_path):
    wd = tmp_path / "wf"
    wd.mkdir()
    (wd / "Snakefile").write_text(SNAKEFILE)
    run = Snakemake(wd, "--multinode-pending-notice-seconds", "1", "--multinode-sweep-seconds", "2")
    try:
        _, line = run.wait_line("is waiting: JobHeldUser", timeout=180)
        job = line.split("SLURM job ")[1].split()[0]
        assert f"held by you (scontrol hold); `scontrol release {job}` lets it start" in line
        status = subprocess.run(
            [sys.executable, "-m", "snakemake_executor_multinode.cli", "status"], cwd=wd, capture_output=True,
            text=True, check=True,
        ).stdout  # fmt: skip
        assert "why they wait:" in status and f"job {job}: JobHeldUser: held by you" in status, status
        slurm(slurm_cluster, "scontrol", "release", job)
        assert run.wait(300) == 0, run.text
    finally:
        run.stop()
    assert len(run.matching("is waiting:")) == 1  # said once
    assert (wd / "out.txt").read_text() == "released\n"


def status(wd: Path) -> str:
    return subprocess.run(
        [sys.executable, "-m", "snakemake_executor_multinode.cli", "status"], cwd=wd, capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip


def test_a_job_that_needs_a_drained_node_says_so_and_runs_once_the_node_is_back(slurm_cluster, tmp_path):
    node = slurm_cluster.spec.node_name(slurm_cluster.spec.nodes - 1)
    wd = tmp_path / "wf"
    wd.mkdir()
    (wd / "Snakefile").write_text(
        f'rule pinned:\n    output: "out.txt"\n    resources: nodelist="{node}"\n    shell: "hostname > {{output}}"\n'
    )
    slurm(slurm_cluster, "scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=pending-reason-test")
    run = Snakemake(wd, "--multinode-pending-notice-seconds", "1", "--multinode-sweep-seconds", "2")
    try:
        _, line = run.wait_line("is waiting: ReqNodeNotAvail", timeout=180)
        assert "a node it needs is down, drained or reserved; `sinfo -R` says why" in line
        assert "ReqNodeNotAvail" in status(wd)
        slurm(slurm_cluster, "scontrol", "update", f"NodeName={node}", "State=RESUME")
        assert run.wait(300) == 0, run.text
    finally:
        slurm_cluster.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
        run.stop()
    assert (wd / "out.txt").read_text().strip() == node


def test_a_job_longer_than_its_partition_now_allows_is_explained_and_runs_once_the_limit_is_back(
    slurm_cluster, tmp_path
):
    """The job is submitted (held) under the partition's limit; the admin then lowers the partition's MaxTime below
    the job's runtime (EnforcePartLimits refuses such a job at submission; an earlier one waits)."""
    partition = slurm_cluster.spec.partition
    wd = tmp_path / "wf"
    wd.mkdir()
    (wd / "Snakefile").write_text(
        'rule long:\n    output: "out.txt"\n    resources: runtime=30, slurm_extra="--hold"\n'
        '    shell: "echo ran > {output}"\n'
    )
    run = Snakemake(wd, "--multinode-pending-notice-seconds", "1", "--multinode-sweep-seconds", "2")
    try:
        _, line = run.wait_line("is waiting: JobHeldUser", timeout=180)
        job = line.split("SLURM job ")[1].split()[0]
        slurm(slurm_cluster, "scontrol", "update", f"PartitionName={partition}", "MaxTime=10")
        slurm(slurm_cluster, "scontrol", "release", job)
        wanted = f"job {job}: PartitionTimeLimit: its runtime is longer than the partition allows"
        shown = wait_for(lambda: wanted in (text := status(wd)) and text, "status explaining PartitionTimeLimit", 120)
        assert "lower runtime, or choose a partition with a longer limit" in shown
        slurm(slurm_cluster, "scontrol", "update", f"PartitionName={partition}", "MaxTime=INFINITE")
        assert run.wait(300) == 0, run.text
    finally:
        slurm_cluster.run("scontrol", "update", f"PartitionName={partition}", "MaxTime=INFINITE", check=False)
        run.stop()
    assert (wd / "out.txt").read_text() == "ran\n"


CHAIN_THAT_FAILS = """
rule all:
    input: "b.txt"
rule a:
    output: "a.txt"
    shell: "exit 1"
rule b:
    input: "a.txt"
    output: "b.txt"
    shell: "cp {input} {output}"
"""


def test_a_job_whose_dependency_failed_never_runs_and_status_shows_it_ended(slurm_cluster, tmp_path):
    """--immediate-submit: Snakemake hands SLURM both jobs (b after a, afterok) and leaves; a fails, so b can never
    start. SLURM 22.05 cancels such a job itself (slurmctld's _kill_dependent) instead of leaving it pending with
    DependencyNeverSatisfied, so nothing waits forever; where a site keeps it pending, the status sweep fails it
    (tests/unit/watching/test_job_status.py). Snakemake's own run ends cleanly even when a's failure comes while it
    is still submitting: it counted the job done at submission, so the plugin reports no outcome (once, a KeyError
    in Snakemake's scheduler)."""
    wd = tmp_path / "wf"
    wd.mkdir()
    (wd / "Snakefile").write_text(CHAIN_THAT_FAILS)
    snakemake(wd, "--immediate-submit", "--notemp")
    try:

        def ended() -> str:
            lines = status(wd).splitlines()  # the table: up to the first empty line (other sections follow)
            rows = [line.split() for line in lines[: lines.index("") if "" in lines else None]]
            states = {row[0]: row[2] for row in rows if len(row) > 2 and row[0] in ("a", "b")}
            return states if states.get("b") in ("CANCELLED", "FAILED") else ""

        states = wait_for(ended, "b ended by SLURM", 180)
        assert states == {"a": "FAILED", "b": "CANCELLED"}
        assert not (wd / "b.txt").exists()
    finally:
        left = jobs_from(slurm_cluster, wd)
        if left:
            slurm_cluster.run("scancel", *sorted(left), check=False)
