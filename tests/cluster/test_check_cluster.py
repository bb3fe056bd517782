"""Bad input is refused before the first submission, and `multinode check` / `multinode preview --rule` say so
without running anything: on the real local SLURM cluster (5 nodes in partition `gpu`, the default, and in `urgent`,
which preempts it; accounting on).

Each bad case is given to a real `snakemake --executor multinode` run (upstream rule fine, downstream rule bad: the
run stops before the upstream job is submitted) and to `multinode check` with the same arguments (same message,
exit 1, nothing submitted)."""

from __future__ import annotations

import os
import pwd
import re
import subprocess
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import StateFolders
from tests.helpers import ANY_FIRST_SCRIPT, multinode, snakemake

pytestmark = pytest.mark.cluster

USER = pwd.getpwuid(os.getuid()).pw_name
SNAKEFILE = """
SHARDS = range(int(config.get("shards", 2)))

rule all:
    input: "down.txt", "py.txt"

rule up:
    output: "up/{i}.txt"
    resources: runtime=10
    shell: "echo {wildcards.i} > {output}"

rule down:
    input: expand("up/{i}.txt", i=SHARDS)
    output: "down.txt"
    resources: nodes=2, gpus=2, cpus_per_task=2, runtime=30, env_profile="ethernet", own_launcher=True
    shell: "cat {input} > {output}"

rule py:
    input: "up/0.txt"
    output: "py.txt"
    run:
        open(output[0], "w").write("py")
"""


@pytest.fixture
def wd(tmp_path: Path) -> Path:
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    return tmp_path


def submitted_from(cl, wd: Path) -> set[str]:
    """Jobs SLURM knows (queue and accounting) that were submitted from `wd`: other engineers' jobs on the shared
    cluster do not count. `sbatch --test-only` makes none."""
    where = str(wd.resolve())
    queue = cl.run("squeue", "-h", "-t", "all", "-o", "%i|%Z").stdout
    acct = cl.run("sacct", "-X", "-n", "-P", "-S", "now-1hours", "-o", "JobIDRaw,WorkDir").stdout
    return {line.split("|")[0] for line in (queue + acct).splitlines() if line.split("|")[1:] == [where]}


def errors_of(check: subprocess.CompletedProcess) -> list[str]:
    return [line.removeprefix("error: ") for line in check.stderr.splitlines() if line.startswith("error: ")]


def assert_no_stack(text: str) -> None:
    assert "Traceback" not in text and not re.search(r'^\s*File "', text, re.M), text


BAD = {
    "nodes": (
        ["--set-resources", "down:nodes=9"],
        "rule 'down': resource nodes=9 is invalid: partition 'gpu' has 5 nodes (SLURM: Node count specification "
        "invalid)",
    ),
    "partition": (
        ["--set-resources", "down:slurm_partition=nosuch"],
        "rule 'down': resource slurm_partition='nosuch' is invalid: no such partition; partitions: gpu, urgent (SLURM: "
        "Invalid partition name specified)",
    ),
    "account": (
        ["--set-resources", "down:slurm_account=nosuchacct"],
        f"rule 'down': resource slurm_account='nosuchacct' is invalid: user '{USER}' cannot charge it (SLURM "
        f"accounting); accounts {USER} can charge: ",
    ),
    "partition-setting": (
        ["--multinode-partition", "nosuch"],
        "rules 'up', 'down', 'py': resource slurm_partition='nosuch' is invalid: no such partition; partitions: gpu, "
        "urgent; "
        "set by --multinode-partition (SLURM: Invalid partition name specified)",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_downstream_rule_stops_the_run_before_anything_is_submitted(slurm_cluster, wd, case):
    args, message = BAD[case]
    run = snakemake(wd, *args, check=False)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert message in out
    assert_no_stack(out)
    assert submitted_from(slurm_cluster, wd) == set()
    assert not (wd / "up").exists() and not list(StateFolders(wd).root.rglob("*.sh"))

    check = multinode(wd, "check", *args, check=False)
    assert check.returncode == 1, check.stdout + check.stderr
    [error] = errors_of(check)
    assert error.startswith(message) and error in out  # word for word what the run said
    assert_no_stack(check.stdout + check.stderr)
    assert "nothing submitted" in check.stdout
    assert submitted_from(slurm_cluster, wd) == set()


def test_an_option_of_another_slurm_release_is_refused_before_anything_is_submitted_naming_the_release(
    slurm_cluster, wd
):
    """--segment (24.11: jobs in segments of a topology/block cluster) is no option of 22.05's sbatch. On 22.05 the
    run stops before its first submission and `multinode check` says so, naming the release it found; on 24.11 the
    option is known and the job is taken."""
    version = slurm_cluster.run("sbatch", "--version").stdout.split()[-1]
    args = ["--set-resources", "down:slurm_extra='--segment=1'"]
    check = multinode(wd, "check", *args, check=False)
    if version.startswith("22.05"):
        message = (
            "rule 'down': resource slurm_extra='--segment=1' is invalid: --segment is not an sbatch option "
            f"(sbatch {version})"
        )
        assert check.returncode == 1, check.stdout + check.stderr
        assert errors_of(check) == [message]
        run = snakemake(wd, *args, check=False)
        assert run.returncode != 0 and message in run.stdout + run.stderr
        assert submitted_from(slurm_cluster, wd) == set()
    else:
        assert check.returncode == 0, check.stdout + check.stderr
        assert f"SLURM {version} asked about 3 resource shapes" in check.stdout


def test_check_prints_one_line_per_rule_and_submits_nothing(slurm_cluster, wd):
    check = multinode(wd, "check", check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    lines = check.stdout.splitlines()
    assert lines[:3] == [
        "up (2 jobs): 1 node, no GPU, partition gpu (default), 10m, env none",
        "down: 2 nodes x 2 GPUs, partition gpu (default), 30m, env ethernet",
        "py: 1 node, no GPU, partition gpu (default), the partition's time limit, env none",
    ]
    assert re.fullmatch(
        r"multinode check: OK; 4 jobs planned, SLURM \d+\.\d+\.\d+ asked about 3 resource shapes \(sbatch --test-only, "
        r"[0-9.]+ s\); nothing submitted",
        lines[3],
    )
    # a missing partition is a warning that names the cluster's default
    assert (
        "warning: rules 'up', 'down', 'py': no partition (resource slurm_partition or --multinode-partition): SLURM "
        "uses its default partition 'gpu'" in check.stderr
    )
    assert_no_stack(check.stderr)
    assert submitted_from(slurm_cluster, wd) == set()
    assert not (wd / "up").exists() and not list((wd / ".snakemake").glob("tmp.*"))
    assert not list(StateFolders(wd).runs.glob("*"))  # no record of a run that submitted nothing


def test_check_honours_snakemakes_arguments_as_snakemake_does(slurm_cluster, wd):
    # `snakemake -n` habits: targets, --config, --set-resources, -n itself
    check = multinode(
        wd, "check", "down.txt", "-n", "--config", "shards=3", "--set-resources", "down:gpus=1", check=False
    )
    assert check.returncode == 0, check.stderr
    assert check.stdout.splitlines()[:2] == [
        "up (3 jobs): 1 node, no GPU, partition gpu (default), 10m, env none",
        "down: 2 nodes x 1 GPU, partition gpu (default), 30m, env ethernet",
    ]
    assert "py:" not in check.stdout  # not needed for the target
    # a workflow profile with plugin settings and nested set-resources
    profile = wd / "profiles" / "site"
    profile.mkdir(parents=True)
    (profile / "config.yaml").write_text(
        "multinode-partition: gpu\nmultinode-env-profile: debug\nset-resources:\n  down:\n    nodes: 3\n"
    )
    check = multinode(wd, "check", "--workflow-profile", "profiles/site", "up/1.txt", "down.txt", check=False)
    assert check.returncode == 0, check.stderr
    assert check.stdout.splitlines()[:2] == [
        "up (2 jobs): 1 node, no GPU, partition gpu, 10m, env debug",
        "down: 3 nodes x 2 GPUs, partition gpu, 30m, env ethernet",
    ]
    assert "no partition" not in check.stderr
    # a bad plan (request validation) is reported like the run reports it, with every other rule still listed
    check = multinode(wd, "check", "--set-resources", "down:cpus_per_task=1", check=False)
    assert check.returncode == 1
    assert errors_of(check) == [
        "rule 'down': resource cpus_per_task=1 is invalid: must be at least gpus=2: each GPU process needs one CPU or "
        "more"
    ]
    assert check.stdout.startswith("up (2 jobs): ")
    # arguments Snakemake cannot read: its reason, no stack
    check = multinode(wd, "check", "--set-resources", "down:gpus=1", "down.txt", check=False)
    assert check.returncode == 1 and "the Snakemake arguments are not valid: ValueError" in check.stderr
    assert_no_stack(check.stderr)
    assert submitted_from(slurm_cluster, wd) == set()


def normalized(script: str, rule: str) -> str:
    """The script without what names the submission: its job name, and its experiment (MULTINODE_RUN_ID, derived
    from the Snakemake run: a preview is another run than the one that submits)."""
    found = re.search(r"MULTINODE_RUN_ID=([0-9a-f]+)", script)
    script = script.replace(found[1], "RUNID") if found else script
    return re.sub(rf"mn-\w+-{rule}-\S+", "JOBNAME", script)


def test_preview_prints_the_script_the_run_submits(slurm_cluster, wd):
    preview = multinode(wd, "preview", "--rule", "down", check=False)
    assert preview.returncode == 0, preview.stderr
    inner = multinode(wd, "preview", "--rule", "py", "-s", "Snakefile", check=False)
    assert inner.returncode == 0, inner.stderr
    several = multinode(wd, "preview", "--rule", "up", "--wildcards", "i=1", check=False)
    assert several.returncode == 0 and "echo 1 > up/1.txt" in several.stdout
    assert submitted_from(slurm_cluster, wd) == set() and not (wd / "up").exists()

    run = snakemake(wd, "down.txt", "py.txt", check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SLURM uses its default partition 'gpu'" in run.stderr  # the run warns as the check does
    [kept] = (StateFolders(wd).logs / "rule_down/_").glob(ANY_FIRST_SCRIPT)
    assert normalized(preview.stdout, "down") == normalized(kept.read_text(), "down")
    # A run: block starts Snakemake inside the job: the preview shows that real command. Snakemake's own command
    # line differs between processes (a temporary folder, the order of set-valued options), the rest is identical.
    [kept] = (StateFolders(wd).logs / "rule_py/_").glob(ANY_FIRST_SCRIPT)
    command = re.compile(r"^bash -c .* &$", re.M)  # the job script runs the rule's command in the background
    [previewed] = command.findall(inner.stdout)
    assert "-m snakemake" in previewed and "--target-jobs" in previewed and "'py:'" in previewed
    assert command.sub("CMD", normalized(inner.stdout, "py")) == command.sub("CMD", normalized(kept.read_text(), "py"))
    # nothing left to do: the check says so
    check = multinode(wd, "check", "down.txt", "py.txt", check=False)
    assert check.returncode == 0 and "nothing to be done" in check.stdout


def test_preview_names_what_it_cannot_show(slurm_cluster, wd):
    missing = multinode(wd, "preview", "--rule", "nope", check=False)
    assert missing.returncode == 2
    assert "multinode preview: rule 'nope' is not in the workflow; rules: all, down, py, up" in missing.stderr
    local = multinode(wd, "preview", "--rule", "all", check=False)
    assert local.returncode == 2 and "no job script" in local.stderr
    assert_no_stack(missing.stderr + local.stderr)
