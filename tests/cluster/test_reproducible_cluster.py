"""A job runs the code it was submitted with, and its output says how it was made (docs/reproducibility.md).

A 2-node job waits for the pre-time-limit signal (tests/workflows/timelimit: its worker does nothing until SIGUSR2;
the test sends it as SLURM's --signal does, with `scancel --signal=USR2`), checkpoints, and the job script requeues
it. Between the submission and the restart the test edits the worker's code: the restart must run the submitted
version (frozen in a snapshot), and the output's provenance record must name it. With nothing frozen, the restart
stops naming the changed file instead of resuming with other code.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from snakemake_executor_multinode.contract.jobfiles import JobFiles, StateFolders
from tests.helpers import (
    ANY_FIRST_SCRIPT,
    Snakemake,
    copied_workflow,
    jobs_from,
    slurm,
    timelimit_ranks_waiting,
    wait_for,
)


def workflow(tmp_path: Path, git: bool) -> Path:
    wd = copied_workflow("timelimit", tmp_path)
    worker = wd / "worker.py"
    worker.write_text(
        worker.read_text().replace('print(\n        f"worker rank', 'print(\n        f"code v1, worker rank')
    )
    if git:
        (wd / ".gitignore").write_text(".snakemake/\nresults/\n")
        for args in (
            ["init", "-q"],
            ["add", "."],
            ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "v1"],
        ):
            subprocess.run(["git", "-C", str(wd), *args], check=True, capture_output=True)
    return wd


def edit_the_code(wd: Path) -> None:
    worker = wd / "worker.py"
    worker.write_text(worker.read_text().replace("code v1,", "code v2 (edited while the job ran),"))


def run_until_signalled(cl, wd: Path, *args: str) -> tuple[Snakemake, str, Path]:
    """Snakemake in the background; returns once both ranks wait for the signal, the code was edited and the
    signal sent: (Snakemake, job id, the job's first log)."""
    sm = Snakemake(wd, *args, jobs=1)
    logdir = StateFolders(wd).logs / "rule_train"
    script = wait_for(lambda: next(logdir.rglob(ANY_FIRST_SCRIPT), None), "the submitted job script", 120, sm.proc)
    job = script.name.split(".")[0]
    assert jobs_from(cl, wd) == {job}
    wait_for(lambda: timelimit_ranks_waiting(wd), "both ranks ready", 300, sm.proc)
    edit_the_code(wd)
    slurm(cl, "scancel", "--signal=USR2", job)
    return sm, job, JobFiles.of(script.parent, job, 1).log


def test_a_requeued_job_resumes_with_the_code_it_was_submitted_with_and_its_output_says_so(slurm_cluster, tmp_path):
    wd = workflow(tmp_path, git=True)
    sm, job, first = run_until_signalled(slurm_cluster, wd)
    assert sm.wait(600) == 0, sm.text
    rerun = JobFiles.from_log(first).restart(1).log.read_text()
    assert "[multinode] requeued; the next run resumes" in first.read_text()
    for rank in (0, 1):
        assert f"code v1, worker rank {rank}: resumed from checkpoint" in rerun  # the submitted code
    assert "code v2" not in rerun
    script = JobFiles.from_log(first).script.read_text()
    assert "/.snakemake/multinode/snapshots/" in script and "# Code: snapshot " in script
    # the record of the output names the snapshot, the commit, both runs of the job and where they ran
    shown = subprocess.run(
        [sys.executable, "-m", "snakemake_executor_multinode.cli", "provenance", "results/done.json"],
        cwd=wd, capture_output=True, text=True, check=True,
    )  # fmt: skip
    record = json.loads(shown.stdout)
    head = subprocess.run(["git", "-C", str(wd), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert record["code"]["commit"] == head and record["code"]["uncommitted"] is None
    assert record["code"]["snapshot"] in script
    assert record["rule"] == "train"
    assert record["command"].endswith("\nmultinode torchrun worker.py results/done.json results/ckpt")
    starts = [r for r in record["runs"] if r["event"] == "start"]
    ends = [r for r in record["runs"] if r["event"] == "end"]
    assert [(r["job"], r["restart"]) for r in starts] == [(job, 0), (job, 1)]
    assert [r["exit"] for r in ends] == [0]  # the requeued run hands over without an end of its own
    assert all(r["versions"]["torch"] and r["versions"]["snakemake-executor-plugin-multinode"] for r in starts)
    assert starts[0]["nodes"] and record["ended"]["state"] == "success"
    mode = StateFolders(wd).provenance.stat().st_mode & 0o777
    assert mode == 0o700


def test_with_nothing_frozen_a_restart_whose_code_changed_stops_naming_the_file(slurm_cluster, tmp_path):
    wd = workflow(tmp_path, git=False)
    sm, job, first = run_until_signalled(slurm_cluster, wd, "--multinode-snapshot", "off")
    assert sm.wait(600) != 0
    rerun = JobFiles.from_log(first).restart(1).log.read_text()
    assert "[multinode] not resuming: the code changed since the job was submitted:" in rerun
    assert f"{wd / 'worker.py'}: FAILED" in rerun
    assert "resumed from checkpoint" not in rerun and "[multinode] exit 86," in rerun
    said = sm.text
    assert f"SLURM job {job} failed" in said and "job script exit 86" in said
    assert not (wd / "results" / "done.json").exists()
