"""The worst hostile values, submitted for real: nothing runs, the value arrives byte for byte, the job gets the
nodes it asked for, and the value is in no SLURM view of the job (without a cluster: tests/process/planning/
test_hostile_input.py)."""

from __future__ import annotations

import os
import stat

import pytest

from tests.helpers import END_STATES, hostile_plan, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.one_release]


def test_the_worst_values_submitted_for_real_run_nothing_and_arrive_literally(slurm_cluster, tmp_path):
    value = "x\n#SBATCH --nodes=3\n$(touch PWNED) `touch PWNED2` '; touch PWNED3; '"
    plan = hostile_plan(tmp_path, value)
    plan.log_path("x").parent.mkdir(parents=True)
    script = tmp_path / "job.sh"
    script.write_text(plan.script)
    script.chmod(0o600)
    job = slurm_cluster.run("sbatch", "--parsable", str(script), cwd=tmp_path).stdout.strip()
    state = wait_for(
        lambda: (
            (s := slurm_cluster.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%T").stdout.strip()) in END_STATES
            and s
        ),
        f"the end of job {job}",
        120,
    )
    assert state == "COMPLETED"
    assert (tmp_path / "token.txt").read_text() == value  # the profile value, byte for byte
    assert not list(tmp_path.rglob("PWNED*"))
    nodes = slurm_cluster.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%D").stdout.strip()
    assert nodes == "2"  # the injected #SBATCH line did not count
    # the value is in no SLURM view of the job and in no process's command line
    views = [
        slurm_cluster.run("scontrol", "show", "job", job).stdout,
        slurm_cluster.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%all").stdout,
    ]
    assert not any("touch PWNED3" in v for v in views)
    assert stat.S_IMODE(os.stat(script).st_mode) == 0o600
