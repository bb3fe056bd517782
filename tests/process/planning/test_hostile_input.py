"""Hostile values (wildcards, profile values, settings) reach the job script inert: they neither end a line nor run
anything, and the #SBATCH block stays exactly what the rule asked for. The worst of them is submitted for real in
tests/cluster/test_hostile_input_cluster.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from snakemake_executor_multinode.planning.environment import EnvProfileError
from snakemake_executor_multinode.planning.plan import Planner
from snakemake_executor_multinode.planning.quoting import shell_quote
from snakemake_executor_multinode.session import Settings, SettingsError
from tests.helpers import hostile_plan

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


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_wildcards_and_profile_values_stay_inert(tmp_path, value):
    script = hostile_plan(tmp_path, value).script
    benign = hostile_plan(tmp_path, "plain").script
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
        hostile_plan(tmp_path, "a\x00b")


def test_a_logdir_that_would_break_the_sbatch_block_is_refused():
    for bad in ("logs\n#SBATCH --nodes=9", "my logs", "/abs/../x y", "$(id)"):
        with pytest.raises(SettingsError, match="--multinode-logdir"):
            Planner(Settings(logdir=bad), Path("/w"), "r")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (Settings(crash_loop_runs=-1), r"--multinode-crash-loop-runs=-1: 0 \(no bound\) or more runs"),
        (Settings(crash_loop_seconds=0), r"--multinode-crash-loop-seconds=0: more than 0 seconds"),
        (Settings(crash_loop_seconds=-5.0), r"--multinode-crash-loop-seconds=-5.0: more than 0 seconds"),
        (Settings(gpu_sample_seconds=-1), r"--multinode-gpu-sample-seconds=-1: 0 \(no sampling\) or more seconds"),
    ],
)
def test_a_setting_below_its_range_is_refused_naming_the_setting(settings, message):
    with pytest.raises(SettingsError, match=message):
        Planner(settings, Path("/w"), "r")
