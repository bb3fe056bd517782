"""A pending job is explained: Snakemake's log says once, in plain words with what to do, why a job waits (after
--multinode-pending-notice-seconds), and `multinode status` shows it under the table. The job is held at submission
(sbatch --hold through slurm_extra, SLURM's JobHeldUser), so the wait is the test's doing, not the clock's."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import Snakemake, slurm

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
