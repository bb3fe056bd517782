"""Reruns run again: what Snakemake asks to rerun after a finished run is submitted anew, never "reattached" to the
old job (docs/evidence.md, the rerun table; the killed-Snakemake rows, which do adopt, are in
test_faults_cluster.py).

One finished run of a small pipeline (3 shard jobs -> a 2-node job -> a summary) is made once; each test copies its
folder (outputs, Snakemake's metadata, the plugin's registry) and reruns it the way a user would. Every job appends
its key to jobs.txt ($MULTINODE_JOB_KEY: its SLURM job id, or <array>_<task> for the shards, which go as one job
array), so the jobs that ran are counted from the jobs themselves, and the registry says which
were submitted and which adopted.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import Cluster, records, snakemake

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.one_release, pytest.mark.snakemake8]

PIPELINE = """
SHARDS = ["a", "b", "c"]

rule all:
    input: expand("out/shards/{s}.txt", s=SHARDS), "out/summary.txt"

rule shard:
    input: "data/{s}.in"
    output: "out/shards/{s}.txt"
    shell: "echo $MULTINODE_JOB_KEY >> jobs.txt; cat {input} > {output}"

rule probe:
    input: expand("out/shards/{s}.txt", s=SHARDS)
    output: "out/probe.txt"
    resources: nodes=2, own_launcher=True
    shell: "echo $MULTINODE_JOB_KEY >> jobs.txt; srun hostname | sort > {output}; cat {input} >> {output}"

rule summary:
    input: "out/probe.txt"
    output: "out/summary.txt"
    params: greeting=config.get("greeting", "hello")
    shell: "echo $MULTINODE_JOB_KEY >> jobs.txt; echo {params.greeting} > {output}; cat {input} >> {output}"
"""
OUTPUTS = ["out/shards/a.txt", "out/shards/b.txt", "out/shards/c.txt", "out/probe.txt", "out/summary.txt"]


@dataclass
class Rerun:
    proc: subprocess.CompletedProcess
    submitted: dict[str, str]  # rule (with wildcards) -> SLURM job id, submitted anew by the rerun
    adopted: list[str]  # job ids the rerun adopted
    ran: list[str]  # job ids that ran (written by the jobs themselves)

    @property
    def text(self) -> str:
        return self.proc.stdout + self.proc.stderr


def ran(wd: Path) -> list[str]:
    path = wd / "jobs.txt"
    return path.read_text().split() if path.exists() else []


def key(rec: dict) -> str:
    return rec["rule"] + "".join(f"[{v}]" for v in rec["wildcards"].values())


@pytest.fixture(scope="module")
def finished_run(slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A pipeline folder after one successful run: the folder and rule -> SLURM job id of that run."""
    wd = tmp_path_factory.mktemp("finished") / "wf"
    (wd / "data").mkdir(parents=True)
    for s in "abc":
        (wd / "data" / f"{s}.in").write_text(f"shard {s}\n")
    (wd / "Snakefile").write_text(PIPELINE)
    proc = snakemake(wd, jobs=3, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jobs = {key(r): r["jobid"] for r in records(wd)}
    assert len(jobs) == 5 and sorted(ran(wd)) == sorted(jobs.values())
    assert all(r["ended"] == "success" for r in records(wd))  # the run recorded that it saw every job end
    return wd, jobs


@pytest.fixture
def pipeline(finished_run: tuple[Path, dict[str, str]], tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the finished run's folder (mtimes kept, so Snakemake sees it exactly as it was)."""
    base, jobs = finished_run
    wd = tmp_path / "wf"
    shutil.copytree(base, wd, symlinks=True)
    return wd, jobs


def rerun(wd: Path, *args: str) -> Rerun:
    before = {(r["run_id"], r["job_name"]) for r in records(wd)}
    already = len(ran(wd))
    proc = snakemake(wd, *args, jobs=3, timeout=600, check=False)
    new = [r for r in records(wd) if (r["run_id"], r["job_name"]) not in before]
    return Rerun(
        proc,
        submitted={key(r): r["jobid"] for r in new if r["adopted_from"] is None},
        adopted=[r["jobid"] for r in new if r["adopted_from"] is not None],
        ran=ran(wd)[already:],
    )


def assert_reran(result: Rerun, wd: Path, old: dict[str, str], expected: set[str]) -> None:
    """Exactly `expected` ran again as new SLURM jobs, nothing was adopted, every output exists, and the log says
    why each old job was not taken."""
    assert result.proc.returncode == 0, result.text
    assert set(result.submitted) == expected, result.text
    assert sorted(result.ran) == sorted(result.submitted.values())  # each new job ran once
    assert not set(result.submitted.values()) & set(old.values())  # new job ids
    assert result.adopted == [] and "reattached" not in result.text
    for job in expected:
        assert f"not reattaching to SLURM job {old[job]} of run" in result.text, result.text
    for output in OUTPUTS:
        assert (wd / output).exists(), output


def test_a_deleted_output_runs_its_job_and_what_follows_anew(pipeline):
    wd, old = pipeline
    (wd / "out/shards/a.txt").unlink()
    result = rerun(wd)
    assert_reran(result, wd, old, {"shard[a]", "probe", "summary"})
    assert f"SLURM job {old['shard[a]']} of run" in result.text and "its end (success) was reported" in result.text


def test_forceall_on_one_target_runs_that_job_anew(pipeline):
    wd, old = pipeline
    result = rerun(wd, "-F", "out/shards/b.txt")
    assert_reran(result, wd, old, {"shard[b]"})


def test_forcerun_of_the_multinode_rule_runs_it_and_what_follows_anew(pipeline):
    wd, old = pipeline
    result = rerun(wd, "-R", "probe", "--", "all")
    assert_reran(result, wd, old, {"probe", "summary"})
    assert (wd / "out/probe.txt").read_text().count("node") == 2  # both nodes of the new allocation answered


def test_forceall_runs_every_job_anew(pipeline):
    wd, old = pipeline
    result = rerun(wd, "--forceall")
    assert_reran(result, wd, old, set(old))


def test_a_changed_config_value_runs_the_job_that_uses_it_anew(pipeline):
    wd, old = pipeline
    result = rerun(wd, "--config", "greeting=hi")
    assert_reran(result, wd, old, {"summary"})
    assert (wd / "out/summary.txt").read_text().startswith("hi\n")


def test_a_changed_input_file_runs_its_job_and_what_follows_anew(pipeline):
    wd, old = pipeline
    (wd / "data/c.in").write_text("shard c, second edition\n")
    result = rerun(wd)
    assert_reran(result, wd, old, {"shard[c]", "probe", "summary"})
    assert "shard c, second edition" in (wd / "out/summary.txt").read_text()


def test_a_finished_pipeline_rerun_does_nothing_and_submits_nothing(pipeline):
    wd, old = pipeline
    result = rerun(wd)
    assert result.proc.returncode == 0 and "Nothing to be done" in result.text, result.text
    assert result.submitted == {} and result.adopted == [] and result.ran == []


def test_provenance_diff_of_two_outputs_of_the_run_names_what_made_them_differ(pipeline):
    """`multinode provenance --diff` on the records the run wrote: two shards of one rule (elements of one job array)
    differ in their wildcard, theme by theme, never in their software environment; an output against itself in
    nothing."""
    wd, _old = pipeline
    cmd = [sys.executable, "-m", "snakemake_executor_multinode.cli", "provenance", "--diff"]
    shown = subprocess.run([*cmd, "out/shards/a.txt", "out/shards/b.txt"], cwd=wd, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "config: wildcards.s: 'a' -> 'b'" in lines, lines
    themes = [line.split(":")[0] for line in lines]
    order = ["code", "config", "environment", "nodes"]
    assert "environment" not in themes and themes == sorted(themes, key=order.index), lines
    same = subprocess.run([*cmd, "out/summary.txt", "out/summary.txt"], cwd=wd, capture_output=True, text=True)
    assert same.stdout == "no difference in code, config, environment or nodes\n", same.stderr
