"""Every output says how it was made: the submission's half and every run's lines, joined into a record per output,
with secrets never written; `multinode provenance` prints it and says what differs between two."""

from __future__ import annotations

import argparse
import json
import re
import stat
from pathlib import Path

import pytest

from snakemake_executor_multinode.cli.provenance import provenance_command
from snakemake_executor_multinode.contract.jobfiles import RUNS, JobFiles
from snakemake_executor_multinode.watching import provenance, report_files
from tests.helpers import PageTables


def submitted(tmp_path: Path, command: str = "python train.py", token: str = "s3cret", **code) -> None:
    record = provenance.submission(
        rule="train",
        wildcards={"size": "small"},
        command=command,
        script="#!/bin/bash\n",
        code={"snapshot": "abc", "commit": "c1", **code},
        environment={"env": {"WANDB_API_KEY": token, "HF_TOKEN": token, "OMP_PLACES": "cores"}, "modules": ["cuda"]},
        outputs=["results/model.pt"],
    )
    provenance.save_submission(tmp_path, "mn-run-train", record)


def runs_file(tmp_path: Path, *lines: dict) -> Path:
    path = JobFiles.of(tmp_path, "41", 1).runs
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_the_record_joins_the_submission_and_every_run_and_never_writes_a_secret(tmp_path):
    submitted(tmp_path)
    runs = runs_file(
        tmp_path,
        {"event": "start", "job": "41", "restart": 0, "nodes": "node[1-2]", "versions": {"torch": "2.13.0"}},
        {"event": "start", "job": "41", "restart": 1, "nodes": "node[2-3]", "versions": {"torch": "2.13.0"}},
        {"event": "end", "job": "41", "restart": 1, "exit": 0},
    )
    provenance.finish(tmp_path, "mn-run-train", runs, {"state": "success"})
    path = provenance.record_path(tmp_path, "results/model.pt")
    text = path.read_text()
    assert "s3cret" not in text  # the value of a secret-looking variable is never written
    record = json.loads(text)
    assert record["environment"]["env"] == {
        "WANDB_API_KEY": "<redacted>",
        "HF_TOKEN": "<redacted>",
        "OMP_PLACES": "cores",
    }
    assert [(r["restart"], r["nodes"]) for r in record["runs"] if r["event"] == "start"] == [
        (0, "node[1-2]"),
        (1, "node[2-3]"),
    ]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert provenance.find(tmp_path, "results/model.pt") == record
    assert provenance.find(tmp_path, str(tmp_path / "results/model.pt")) == record


def test_a_record_that_cannot_be_written_is_an_error_not_silence(tmp_path):
    submitted(tmp_path)
    (tmp_path / provenance.PROVENANCE_DIR / "outputs").write_text("a file where the folder should be")
    with pytest.raises(provenance.ProvenanceError, match="cannot write the provenance record"):
        provenance.finish(tmp_path, "mn-run-train", None, {"state": "success"})


def test_diff_says_what_differs_by_theme(tmp_path):
    a = tmp_path / "a"
    b = tmp_path / "b"
    submitted(a)
    submitted(b, command="python train.py --lr 1e-3", commit="c2")
    start = {"event": "start", "nodes": "node[1-2]", "versions": {"torch": "2.13.0"}}
    ra = provenance.finish(a, "mn-run-train", runs_file(a, start), {"state": "success"})
    rb = provenance.finish(b, "mn-run-train", runs_file(b, {**start, "nodes": "node[2-3]"}), {"state": "success"})
    lines = provenance.diff(ra, rb)
    assert "code: code.commit: 'c1' -> 'c2'" in lines
    assert "config: command: 'python train.py' -> 'python train.py --lr 1e-3'" in lines
    assert "nodes: nodes: 'node[1-2]' -> 'node[2-3]'" in lines
    assert not any(line.startswith("environment") for line in lines)
    assert provenance.diff(ra, ra) == []


def test_the_command_prints_the_record_of_an_output(tmp_path, capsys):
    submitted(tmp_path)
    provenance.finish(tmp_path, "mn-run-train", None, {"state": "success"})
    args = argparse.Namespace(paths=["results/model.pt"], diff=False, directory=tmp_path, start=None)
    assert provenance_command(args) == 0
    assert json.loads(capsys.readouterr().out)["rule"] == "train"
    missing = argparse.Namespace(paths=["other.pt"], diff=False, directory=tmp_path, start=None)
    assert provenance_command(missing) == 1 and "no record for other.pt" in capsys.readouterr().err


def test_a_runs_start_line_reads_versions_without_importing_torch(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "runs.jsonl"
    code = (
        "import sys, json, os\n"
        "from snakemake_executor_multinode.watching import provenance\n"
        "line = provenance.start_line({'SLURM_JOB_ID': '7', 'SLURM_RESTART_COUNT': '2'})\n"
        "print(json.dumps({'torch_imported': 'torch' in sys.modules, **line}))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    line = json.loads(run.stdout)
    assert line["torch_imported"] is False and line["versions"]["torch"] and line["restart"] == 2
    assert line["gpus"] == []  # no nvidia-smi here
    assert not out.exists()


def test_the_job_scripts_start_line_command_appends_one_line_without_the_parsers_imports(tmp_path):
    """`multinode provenance --start FILE` runs once per run of every job: it skips the command line's parser and
    the planning modules it imports."""
    import subprocess
    import sys

    runs = tmp_path / "x.runs.jsonl"
    runs.write_text('{"event": "end", "restart": 0}\n')
    code = (
        "import sys\n"
        "from snakemake_executor_multinode.cli.main import main\n"
        f"rc = main(['provenance', '--start', {str(runs)!r}])\n"
        "print(rc, 'snakemake_executor_multinode.cli.preview' in sys.modules)\n"
    )
    env = {"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split() == ["0", "False"]
    lines = [json.loads(line) for line in runs.read_text().splitlines()]
    assert [line["event"] for line in lines] == ["end", "start"] and lines[1]["job"] == "9"


# --- the start line without Python: a job that runs in the submitting side's environment ---------------------------


def planned(tmp_path: Path, resources: dict, profile: str | None = None):
    from snakemake_executor_multinode.planning.plan import Planner, RuleJob, plan_job
    from snakemake_executor_multinode.session import Settings

    settings = Settings()
    if profile is not None:
        (tmp_path / "profiles.yaml").write_text(f"default: own\nprofiles:\n  own:\n{profile}")
        settings = Settings(profile_file=str(tmp_path / "profiles.yaml"))
    return plan_job(RuleJob("shard", resources, "true"), Planner(settings, tmp_path, "run1"))


@pytest.mark.parametrize(
    "resources, profile, reads_versions",
    [
        ({}, None, False),  # a plain CPU job: the submitting side's environment, inherited
        ({"nodes": 1, "gpus": 1}, None, True),  # GPUs: nvidia-smi and the CUDA stack in the job
        ({}, "    venv: /opt/venv\n", True),
        ({}, "    conda: {env: train}\n", True),
        ({}, "    modules: [python/3.12]\n", True),
        ({}, "    setup: ['source /opt/site.sh']\n", True),
        ({}, "    env: {PYTHONPATH: /opt/lib}\n", True),
        ({}, "    env: {OMP_PLACES: cores}\n", False),  # a variable that changes no software
    ],
)
def test_only_a_job_with_gpus_or_software_of_its_own_reads_versions_in_the_job(
    tmp_path, resources, profile, reads_versions
):
    plan = planned(tmp_path, resources, profile)
    assert plan.versions_in_job is reads_versions
    assert f"if [ {int(reads_versions)} = 1 ]; then\n    multinode provenance --start" in plan.script


def run_start_of(tmp_path: Path, plan) -> tuple[list[dict], bool]:
    """The plan's job script run with bash up to the rule (the command: true), with a `multinode` stand-in that
    says whether it was called. Returns the runs file's lines and whether Python's start line ran."""
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    called = tmp_path / "multinode.called"
    for name, body in (("multinode", f"touch {called}; exit 1"), ("scontrol", "echo node7")):
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(plan.script)
    (tmp_path / plan.log_dir).mkdir(parents=True)  # as the session makes it before sbatch
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node7",
        "HOSTNAME": "the-submitting-host", "HOME": str(tmp_path),
    }  # fmt: skip
    subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, timeout=60, check=True)
    runs = next(tmp_path.rglob("*" + RUNS))
    return [json.loads(line) for line in runs.read_text().splitlines()], called.exists()


def test_a_plain_jobs_start_line_is_written_by_the_shell_alone_and_names_this_host(tmp_path):
    lines, python_ran = run_start_of(tmp_path, planned(tmp_path, {}))
    assert not python_ran
    start = lines[0]
    assert start["event"] == "start" and start["job"] == "42" and start["restart"] == 0 and start["nodes"] == "node7"
    assert start["host"] == Path("/proc/sys/kernel/hostname").read_text().strip() != "the-submitting-host"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}", start["time"])
    assert [line["event"] for line in lines] == ["start", "end"]


def test_a_gpu_jobs_start_line_is_read_in_the_job_and_a_failing_one_still_leaves_a_line(tmp_path):
    lines, python_ran = run_start_of(tmp_path, planned(tmp_path, {"nodes": 1, "gpus": 1}))
    assert python_ran  # the stand-in fails: the shell's line stands in for it
    assert [line["event"] for line in lines] == ["start", "end"] and lines[0]["job"] == "42"


def test_the_record_of_a_job_that_inherits_the_environment_holds_the_submitting_sides_versions(tmp_path):
    common = dict(rule="shard", wildcards={}, command="true", script="", code={}, environment={}, outputs=["out/0.txt"])
    inherited = provenance.submission(**common, inherited_versions=True)
    assert inherited["versions"] == provenance.versions() and inherited["versions"]["python"]
    assert "submitting side" in inherited["versions_from"]
    assert "versions" not in provenance.submission(**common)  # the job reads its own
    # --diff compares them as it compares a job's own
    other = {**inherited, "versions": {**inherited["versions"], "numpy": "0.0"}}
    assert any(line.startswith("environment: versions.numpy") for line in provenance.diff(inherited, other))


def made(workdir: Path, size: str, commit: str, nodes: str, torch: str) -> None:
    """The record of results/<size>.pt, written as a run writes it: the submission's half, then the job's end."""
    record = provenance.submission(
        rule="train",
        wildcards={"size": size},
        command=f"python train.py --size {size}",
        script="#!/bin/bash\n",
        code={"snapshot": "abc", "commit": commit},
        environment={"env": {"OMP_PLACES": "cores"}, "modules": ["cuda"]},
        outputs=[f"results/{size}.pt"],
    )
    provenance.save_submission(workdir, f"mn-run-train-{size}", record)
    runs = workdir / f"{size}.runs.jsonl"
    runs.write_text(json.dumps({"event": "start", "nodes": nodes, "versions": {"torch": torch}}) + "\n")
    provenance.finish(workdir, f"mn-run-train-{size}", runs, {"state": "success"})


def test_the_diff_command_prints_what_differs_between_two_outputs_theme_by_theme(tmp_path):
    """`multinode provenance --diff A B`, the installed command's module run as a user runs it, on two outputs'
    records: one line per difference, code first, then config, environment and nodes; none for equal records."""
    import subprocess
    import sys

    wd = tmp_path / "wf"
    made(wd, "small", commit="c1", nodes="node[1-2]", torch="2.13.0")
    made(wd, "large", commit="c2", nodes="node[2-3]", torch="2.13.1")

    def command(*args: str) -> subprocess.CompletedProcess:
        cli = [sys.executable, "-m", "snakemake_executor_multinode.cli", "provenance", *args]
        return subprocess.run(cli, cwd=tmp_path, capture_output=True, text=True, timeout=120)

    shown = command("--diff", "-d", str(wd), "results/small.pt", "results/large.pt")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [
        "code: code.commit: 'c1' -> 'c2'",
        "config: command: 'python train.py --size small' -> 'python train.py --size large'",
        "config: wildcards.size: 'small' -> 'large'",
        "environment: versions.torch: '2.13.0' -> '2.13.1'",
        "nodes: nodes: 'node[1-2]' -> 'node[2-3]'",
    ]
    same = command("--diff", "-d", str(wd), "results/small.pt", str(wd / "results/small.pt"))
    assert (same.returncode, same.stdout) == (0, "no difference in code, config, environment or nodes\n")
    missing = command("--diff", "-d", str(wd), "results/small.pt", "results/medium.pt")
    assert missing.returncode == 1 and "no record for results/medium.pt" in missing.stderr and not missing.stdout
    one = command("--diff", "-d", str(wd), "results/small.pt")
    assert one.returncode == 2 and "give two outputs with --diff" in one.stderr


def test_the_report_pages_provenance_table_has_a_row_per_output_and_says_which_have_no_record(tmp_path):
    submitted(tmp_path)  # train (size=small) -> results/model.pt
    start = {"event": "start", "job": "41", "nodes": "node[1-2]", "versions": {"python": "3.11.2", "torch": "2.13.0"}}
    runs = runs_file(tmp_path, {**start, "restart": 0}, {**start, "restart": 1, "nodes": "node[2-3]"})
    provenance.finish(tmp_path, "mn-run-train", runs, {"state": "success", "time": "2026-01-01T00:00:00+0000"})
    (table,) = PageTables(report_files.provenance_html(tmp_path, ["results/model.pt", "results/local.txt"])).tables
    assert table[0] == list(report_files.PROVENANCE_COLUMNS)
    assert table[1] == [
        "results/model.pt", "train (size=small)", "41 (2 run(s))", "node[2-3]", "snapshot abc, commit c1",
        "python 3.11.2, torch 2.13.0", "success 2026-01-01T00:00:00+0000",
    ]  # fmt: skip
    assert table[2][:2] == ["results/local.txt", "no record: not made by a job of this plugin"]


def test_a_summary_of_a_record_without_a_snapshot_counts_the_hashed_files_and_names_the_container(tmp_path):
    record = provenance.submission(
        rule="prep", wildcards={}, command="python prep.py", script="", code={"snapshot": None, "files": {"a": "1"}},
        environment={"container": {"image": "docker://x:1"}}, outputs=["o"], inherited_versions=True,
    )  # fmt: skip
    s = provenance.summary(record)
    assert (s.rule, s.jobs, s.nodes, s.ended) == ("prep", "- (0 run(s))", "-", "-")
    assert s.code == "1 file(s) the command names, hashed" and s.versions.endswith("; container docker://x:1")
    assert f"python {provenance.versions()['python']}" in s.versions
