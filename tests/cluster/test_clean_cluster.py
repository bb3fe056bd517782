"""`multinode clean` beside a running Snakemake, on the real local SLURM cluster: the finished run's state goes, the
running job's state stays (it finishes and is reported as usual), outputs stay, and the next runs behave as if
nothing had been cleaned: nothing to do, or a deleted output runs anew."""

from __future__ import annotations

from pathlib import Path

from snakemake_executor_multinode.contract.jobfiles import StateFolders
from tests.helpers import Snakemake, jobs_from, lines, multinode, records, snakemake, wait_for

SNAKEFILE = """
rule first:
    output: "first.txt"
    shell: "echo one > {output}"

rule second:
    output: "second.txt"
    shell: "echo $SLURM_JOB_ID >> runs.txt; while [ ! -e release ]; do sleep 0.2; done; echo two > {output}"
"""


def state_files(wd: Path, jobid: str) -> list[str]:
    base = StateFolders(wd).root
    return sorted(str(p.relative_to(base)) for p in base.rglob(f"{jobid}.*") if p.is_file())


def test_clean_beside_a_running_job_keeps_its_state_and_the_next_runs_are_unchanged(slurm_cluster, tmp_path):
    wd = tmp_path / "wf"
    wd.mkdir()
    (wd / "Snakefile").write_text(SNAKEFILE)
    snakemake(wd, "first.txt")
    (done,) = [r["jobid"] for r in records(wd)]
    assert state_files(wd, done)  # its script and log
    run = Snakemake(wd, "second.txt")
    try:
        wait_for(lambda: lines(wd / "runs.txt"), "the second job running", 300)
        running = lines(wd / "runs.txt")[0]
        kept = state_files(wd, running)
        dry = multinode(wd, "clean", "--dry-run", check=False)
        assert dry.returncode == 0 and f"{done}.attempt1.log" in dry.stdout and running not in dry.stdout, dry.stdout
        assert state_files(wd, done)  # a dry run removes nothing
        cleaned = multinode(wd, "clean", check=False)
        assert cleaned.returncode == 0, cleaned.stderr
        assert "kept jobs: 1 queued or running" in cleaned.stdout, cleaned.stdout
        assert state_files(wd, done) == []
        assert state_files(wd, running) == kept
        assert [r["jobid"] for r in records(wd)] == [running]
        (wd / "release").touch()
        assert run.wait(300) == 0, run.text
    finally:
        run.stop()
    assert (wd / "first.txt").read_text() == "one\n" and (wd / "second.txt").read_text() == "two\n"
    assert lines(wd / "runs.txt") == [running]  # ran once
    # the next runs: nothing to do; a deleted output runs anew
    again = snakemake(wd, "first.txt", "second.txt")
    assert "Nothing to be done" in again.stdout + again.stderr
    (wd / "first.txt").unlink()
    snakemake(wd, "first.txt", "second.txt")
    assert (wd / "first.txt").read_text() == "one\n"
    assert jobs_from(slurm_cluster, wd) >= {running} and len(records(wd)) == 2
