"""--multinode-notify on the real local SLURM cluster: a recording command (it appends each notice from its stdin to a
file) hears a two-node job start, be requeued by an admin (`scontrol requeue`, the test's doing), start again and
finish, a failing job start and fail (--keep-going), and the run's end, in that order per job, each once. A notify
command that does not exist stops the run before anything is submitted. The test waits for notices (the file), never
for a duration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import Snakemake, records, snakemake, squeue_states, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.one_release]  # the plugin's own events; no SLURM release differs

WAIT_FOR = "while [ ! -e release ]; do sleep 0.2; done"  # the job's only way on: the test creates `release`
SNAKEFILE = f"""
rule all:
    input: "out.txt", "broken.txt"

rule work:
    output: "out.txt"
    resources: nodes=2, own_launcher=True
    shell: "{WAIT_FOR}; echo done > {{output}}"

rule broken:
    output: "broken.txt"
    shell: "echo failing on purpose; exit 3"
"""


def notices(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def events_of(path: Path, rule: str) -> list[str]:
    return [n["event"] for n in notices(path) if n["rule"] == rule]


def test_the_notify_command_hears_each_jobs_events_once_in_order_and_the_runs_end(slurm_cluster, tmp_path):
    wd = tmp_path / "wf"
    wd.mkdir()
    (wd / "Snakefile").write_text(SNAKEFILE)
    told = tmp_path / "notices.jsonl"
    record = tmp_path / "record-notice"
    record.write_text(f"#!/bin/bash\ncat >> {told}\n")
    record.chmod(0o755)
    run = Snakemake(wd, "--keep-going", "--multinode-notify", str(record), "--multinode-sweep-seconds", "2", jobs=2)
    try:
        wait_for(lambda: events_of(told, "work") == ["started"], "the notice of the two-node job's start", 300,
                 proc=run.proc)  # fmt: skip
        job = notices(told)[[n["rule"] for n in notices(told)].index("work")]["job"]
        assert squeue_states(slurm_cluster, [job]) == {job: "RUNNING"}
        slurm_cluster.run("scontrol", "requeue", job)  # an admin, before maintenance
        wait_for(lambda: events_of(told, "work") == ["started", "requeued", "started"], "the requeue and the restart",
                 300, proc=run.proc)  # fmt: skip
        (wd / "release").touch()
        rc = run.wait(300)
    finally:
        (wd / "release").touch()
        run.stop()
    assert rc != 0, run.text  # the broken rule failed; --keep-going finished the rest
    got = notices(told)
    assert events_of(told, "work") == ["started", "requeued", "started", "finished"], got
    assert events_of(told, "broken") == ["started", "failed"], got
    assert got[-1]["event"] == "run_finished" and [n["event"] for n in got].count("run_finished") == 1, got
    assert got[-1]["reason"] == "1 job(s) finished, 1 failed" and got[-1]["job"] is None
    work = [n for n in got if n["rule"] == "work"]
    assert {n["job"] for n in work} == {job}  # one SLURM job throughout: the requeue was no new submission
    nodes = work[0]["nodes"]
    assert nodes and all(n["nodes"] == nodes for n in (work[1], work[3])), work
    assert "requeued (" in work[1]["reason"] and "restart 1" in work[1]["reason"]
    assert work[0]["reason"] == "first run" and work[2]["reason"] == "restart 1"
    assert Path(work[0]["log"]).is_file() and Path(work[2]["log"]).is_file() and work[0]["log"] != work[2]["log"]
    assert "[multinode] exit 143" in Path(work[0]["log"]).read_text()  # the first run's own log
    broken = [n for n in got if n["rule"] == "broken"]
    assert "job script exit 3" in broken[1]["reason"] and "failing on purpose" in Path(broken[1]["log"]).read_text()
    assert all(n["run"] == got[0]["run"] for n in got)  # one run's notices
    assert not run.matching("failures of the command"), run.text  # the command never failed: no warning


def test_a_notify_command_that_does_not_exist_stops_the_run_before_anything_is_submitted(tmp_path):
    """The session refuses it at its start, before it plans a job or asks SLURM anything: no cluster needed."""
    wd = tmp_path / "wf"
    wd.mkdir()
    (wd / "Snakefile").write_text(SNAKEFILE)
    proc = snakemake(wd, "--multinode-notify", "no-such-notifier --channel x", check=False, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "--multinode-notify='no-such-notifier --channel x': no command 'no-such-notifier'" in out, out
    assert "Traceback" not in out, out
    assert records(wd) == []  # nothing was submitted
