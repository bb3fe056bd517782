"""See the run, on the real local SLURM cluster: `multinode status` during and after a run (a normal one, and an
--immediate-submit one after Snakemake exited), progress lines in Snakemake's output, `multinode cancel` of one run
beside another, and the efficiency report checked against sacct.

Jobs that must be seen running wait for a release file the test creates; the test waits for events (a line of
Snakemake's output, a state in the status table). The timeouts only stop hangs: no verdict depends on how long
anything takes.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import StateFolders
from snakemake_executor_multinode.slurm import formats
from snakemake_executor_multinode.slurm.client import ACTIVE_STATES
from snakemake_executor_multinode.watching import status_view
from tests.helpers import background, copied_workflow, multinode, snakemake, wait_for

pytestmark = pytest.mark.cluster


def table(wd: Path, *args: str) -> dict[str, list[str]]:
    """`multinode status` as {rule label: the row's cells}, the columns split where the header's are (the table
    ends at the first empty line: why pending jobs wait follows)."""
    lines = multinode(wd, "status", *args).stdout.splitlines()
    header = lines[1]
    starts = [header.index(name) for name in header.split()]
    rows = {}
    for line in lines[2 : lines.index("") if "" in lines else None]:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        rows[cells[0]] = cells
    return rows


def cell(row: list[str], column: str) -> str:
    return row[["RULE", "JOBID", "STATE", "NODESxGPUS", "ELAPSED/LIMIT", "RESTARTS", "PROGRESS", "LOG"].index(column)]


def sacct(cl, jobid: str, *fields: str, steps: bool = False) -> dict[str, str]:
    """The job's line in sacct; with `steps`, from a query with its steps (whose TotalCPU then counts the steps': with
    -X sacct leaves them out)."""
    out = cl.run("sacct", *([] if steps else ["-X"]), "-n", "-P", "-j", jobid, "-o", ",".join(fields)).stdout
    return dict(zip(fields, out.splitlines()[0].split("|"), strict=True)) if out.strip() else {}


def test_status_and_progress_lines_while_a_normal_run_trains_and_after_it_ended(slurm_cluster, tmp_path):
    wd = copied_workflow("watch", tmp_path)
    with background(wd, "--multinode-progress-seconds", "1", jobs=2) as sm:
        # The training wrote three metrics lines and waits: Snakemake's output says where it is, once.
        _, line = sm.wait_line("train (SLURM job", "step 3/10")
        assert "loss 4.7 184k tok/s ETA" in line
        rows = table(wd)
        train = rows["train"]
        assert cell(train, "STATE") == "RUNNING" and cell(train, "NODESxGPUS") == "2x2"
        assert cell(train, "PROGRESS").startswith("step 3/10 loss 4.7 184k tok/s ETA ")
        assert cell(train, "ELAPSED/LIMIT").endswith("/0:30:00") and cell(train, "RESTARTS") == "0"
        assert (wd / cell(train, "LOG")).is_file()
        jobid = cell(train, "JOBID")
        # what slurmctld says (sacct may still say PENDING: slurmdbd lags, which is why status asks squeue first)
        assert slurm_cluster.run("squeue", "-h", "-j", jobid, "-o", "%T %D").stdout.split() == ["RUNNING", "2"]
        (wd / "release").touch()
        assert sm.proc.wait(timeout=300) == 0, sm.text
        assert len(sm.matching("step 3/10")) == 1  # the step did not move: nothing more was said about it
    run_id = status_view.resolve_run(status_view.run_table(wd), "latest")
    rows = table(wd, "--run", run_id)
    assert {rule: cell(row, "STATE") for rule, row in rows.items()} == {"train": "COMPLETED", "evaluate": "COMPLETED"}
    assert cell(rows["train"], "PROGRESS") == "step 10/10 loss 4 184k tok/s"  # the last line, no ETA once ended
    assert cell(rows["evaluate"], "NODESxGPUS") == "1x0" and cell(rows["train"], "JOBID") == jobid


def test_status_of_an_immediate_submit_run_after_snakemake_exited(slurm_cluster, tmp_path):
    wd = copied_workflow("watch", tmp_path)
    snakemake(wd, "--immediate-submit", "--notemp", timeout=600)  # submits the chain and exits

    def training() -> dict[str, list[str]] | None:
        rows = table(wd)
        train = rows["train"]
        return rows if cell(train, "STATE") == "RUNNING" and cell(train, "PROGRESS").startswith("step 3") else None

    rows = wait_for(training, "the training running with its metrics")
    assert set(rows) == {"train", "evaluate"}
    assert cell(rows["evaluate"], "STATE") == "PENDING (Dependency)"  # afterok on the training
    said = multinode(wd, "status").stdout
    assert f"job {cell(rows['evaluate'], 'JOBID')}: Dependency: waiting for the jobs it depends on to finish" in said
    (wd / "release").touch()

    def ended() -> dict[str, list[str]] | None:
        rows = table(wd)
        return rows if not any(cell(r, "STATE").split()[0] in ACTIVE_STATES for r in rows.values()) else None

    rows = wait_for(ended, "both jobs ended")
    assert [cell(r, "STATE") for r in rows.values()] == ["COMPLETED", "COMPLETED"]
    assert (wd / "results" / "evaluated.txt").read_text() == "trained\n"


def test_cancel_of_one_run_leaves_another_runs_jobs_alone(slurm_cluster, tmp_path):
    wd = copied_workflow("watch", tmp_path)
    snakemake(wd, "--immediate-submit", "--notemp", "results/wait_a.txt", timeout=600)
    snakemake(wd, "--immediate-submit", "--notemp", "results/wait_b.txt", timeout=600)
    run_a, run_b = status_view.run_table(wd)
    job_a = status_view.run_table(wd)[run_a][0].jobid
    job_b = status_view.run_table(wd)[run_b][0].jobid
    assert job_a and job_b
    out = multinode(wd, "cancel", "--run", run_a).stdout
    assert out.strip() == f"run {run_a}: cancelled SLURM job(s) {job_a}"
    wait_for(lambda: cell(table(wd, "--run", run_a)["wait[name=a]"], "STATE") == "CANCELLED", "run A's job cancelled")
    assert cell(table(wd, "--run", run_b)["wait[name=b]"], "STATE").split()[0] in ("PENDING", "RUNNING")
    (wd / "release_b").touch()
    wait_for(lambda: cell(table(wd, "--run", run_b)["wait[name=b]"], "STATE") == "COMPLETED", "run B's job done")
    # --all: both runs, oldest first, from one query
    text = multinode(wd, "status", "--all").stdout
    assert text.index(f"run {run_a}") < text.index(f"run {run_b}")
    assert (
        multinode(wd, "cancel", "--run", run_b).stdout.strip()
        == f"run {run_b}: no job queued or running (1 job(s) ended)"
    )


def test_efficiency_report_of_a_cpu_spin_an_idle_job_and_a_gpu_job_against_sacct(slurm_cluster, tmp_path):
    wd = copied_workflow("watch", tmp_path)
    proc = snakemake(wd, "--multinode-efficiency-report", "efficiency", timeout=600)
    run_id = status_view.resolve_run(status_view.run_table(wd), "latest")
    assert f"efficiency of run {run_id}: 3 job(s)" in proc.stderr
    csv_path = StateFolders(wd).reports / f"{run_id}.csv"
    assert csv_path.is_file() and csv_path.with_suffix(".md").is_file()
    lines = list(csv.DictReader(io.StringIO(csv_path.read_text())))
    jobs = {line["rule"]: line for line in lines if line["scope"] == "job"}
    rules = {line["rule"]: line for line in lines if line["scope"] == "rule"}
    assert set(jobs) == {"spin", "idle", "gpu"}
    # Every figure is sacct's own arithmetic.
    for rule, line in jobs.items():
        rec = sacct(
            slurm_cluster, line["jobid"], "State", "ElapsedRaw", "TotalCPU", "AllocCPUS", "AllocTRES", steps=True
        )
        assert line["state"] == rec["State"] == "COMPLETED", rule
        assert int(line["elapsed_s"]) == int(rec["ElapsedRaw"]) and line["limit_s"] == "600"
        total_cpu = formats.cpu_seconds(rec["TotalCPU"])
        assert float(line["cpu_s"]) == pytest.approx(total_cpu, abs=0.05)
        efficiency = total_cpu / (int(rec["ElapsedRaw"]) * int(rec["AllocCPUS"]))
        assert float(line["cpu_efficiency"]) == pytest.approx(efficiency, abs=1e-3)
        gpus = int(formats.tres_map(rec["AllocTRES"]).get("gres/gpu", "0"))
        assert float(line["gpu_hours"]) == pytest.approx(gpus * int(rec["ElapsedRaw"]) / 3600, abs=1e-4)
    # A job of known size: the spin used >= 4 CPU-seconds (it measured them itself), all of them in the job.
    cpu, wall = map(float, (wd / "results" / "spin.txt").read_text().split())
    assert cpu >= 4 and float(jobs["spin"]["cpu_s"]) >= cpu
    # Near 100% vs near 0%, with wide bounds. 100% of what the host gave: the sandbox's 12 "CPUs" share this
    # machine's cores with other test sessions, so a spinning process gets `share` of a core (1.0 on an idle host,
    # 0.2 was seen at load 10); the job's start and end, outside the spin, lower it further.
    share = cpu / wall
    assert float(jobs["spin"]["cpu_efficiency"]) > 0.5 * share
    assert float(jobs["idle"]["cpu_efficiency"]) < 0.05  # sleeping: (almost) none of its 2 CPUs
    assert jobs["gpu"]["gpus_per_node"] == "2" and float(rules["gpu"]["gpu_hours"]) > 0
    # seconds of a 10-minute limit: every rule is told to ask for less time; the idle rule for fewer CPUs too
    assert all("runtime=5" in rules[r]["suggestion"] for r in rules)
    assert "cpus_per_task=1" in rules["idle"]["suggestion"] and "cpus_per_task" not in rules["spin"]["suggestion"]
    # `multinode report` afterwards: the same figures again, printed and written
    before = csv_path.read_text()
    out = multinode(wd, "report", "--run", run_id).stdout
    assert f"# Efficiency of run {run_id}" in out and "| idle |" in out
    assert csv_path.read_text() == before
