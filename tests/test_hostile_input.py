"""Hostile values (wildcards, profile values, settings) reach the job script inert: they neither end a line nor run
anything, and the #SBATCH block stays exactly what the rule asked for. The worst of them is submitted for real."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from snakemake_executor_multinode.planning.environment import EnvProfileError
from snakemake_executor_multinode.planning.plan import Planner, RuleJob
from snakemake_executor_multinode.planning.quoting import shell_quote
from snakemake_executor_multinode.planning.settings import Settings, SettingsError

HOSTILE = [
    "plain",
    "a b",
    "new\nline",
    "x\n#SBATCH --nodes=3\ntouch PWNED",
    "$(touch PWNED)",
    "`touch PWNED`",
    "'; touch PWNED; '",
    '"; touch PWNED; "',
    "\\\n touch PWNED",
    "tab\there\rcr",
]


def planned(tmp_path: Path, value: str):
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(yaml.safe_dump({"profiles": {"hostile": {"env": {"TOKEN": value}}}}))
    planner = Planner(Settings(env_profiles=str(profiles)), tmp_path, "run1")
    job = RuleJob(
        "train", {"nodes": 2, "env_profile": "hostile"}, 'printf %s "$TOKEN" > token.txt', wildcards={"sample": value}
    )
    return planner.plan(job)


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_wildcards_and_profile_values_stay_inert(tmp_path, value):
    script = planned(tmp_path, value).script
    benign = planned(tmp_path, "plain").script
    sbatch = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert [re.sub(r"=.*", "", line) for line in sbatch] == [
        re.sub(r"=.*", "", line) for line in benign.splitlines() if line.startswith("#SBATCH")
    ]
    assert "#SBATCH --nodes=2" in sbatch and "#SBATCH --nodes=3" not in sbatch
    path = tmp_path / "job.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    # every value stays one word on its own line: nothing adds a line to the script
    assert f"export TOKEN={shell_quote(value)}\n" in script
    assert script.count("\n") == benign.count("\n")
    assert (
        subprocess.run(["bash", "-c", f"printf %s {shell_quote(value)}"], capture_output=True).stdout == value.encode()
    )
    title = script.splitlines()[1]
    assert title.startswith("# Snakemake rule train sample=") and "\n" not in title


def test_a_profile_value_no_shell_can_carry_is_refused_naming_the_key(tmp_path):
    with pytest.raises(EnvProfileError, match=r"profiles.hostile: a value holds a NUL character"):
        planned(tmp_path, "a\x00b")


def test_a_logdir_that_would_break_the_sbatch_block_is_refused():
    for bad in ("logs\n#SBATCH --nodes=9", "my logs", "/abs/../x y", "$(id)"):
        with pytest.raises(SettingsError, match="--multinode-logdir"):
            Planner(Settings(logdir=bad), Path("/w"), "r")


@pytest.mark.cluster
def test_the_worst_values_submitted_for_real_run_nothing_and_arrive_literally(slurm_cluster, tmp_path):
    value = "x\n#SBATCH --nodes=3\n$(touch PWNED) `touch PWNED2` '; touch PWNED3; '"
    plan = planned(tmp_path, value)
    plan.log_path("x").parent.mkdir(parents=True)
    script = tmp_path / "job.sh"
    script.write_text(plan.script)
    script.chmod(0o600)
    job = slurm_cluster.run("sbatch", "--parsable", str(script), cwd=tmp_path).stdout.strip()
    deadline_state = ""
    for _ in range(600):
        deadline_state = slurm_cluster.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%T").stdout.strip()
        if deadline_state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        subprocess.run(["sleep", "0.2"])
    assert deadline_state == "COMPLETED"
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
