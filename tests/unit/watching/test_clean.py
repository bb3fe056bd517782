"""`multinode clean` removes what finished jobs left, never what a queued or running job needs nor an output."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import (
    EXIT_MARKER,
    INDEX_DIR,
    LOGS_DIR,
    STATE_DIR,
    JobFiles,
    StateFolders,
    log_stem,
    marker,
)
from snakemake_executor_multinode.watching import clean
from snakemake_executor_multinode.watching.registry import Registry, Submission

DAY = 86400.0
NOW = 1000 * DAY


def job(wd: Path, run: str, jobid: str, outputs=("out.txt",), ended: str | None = "success", at: float = NOW - 40 * DAY,
        rule: str = "work") -> Submission:  # fmt: skip
    """A submission as a run leaves it: record, script, log, node file, metrics, exit marker."""
    logdir = StateFolders(wd).logs / f"rule_{rule}" / "_"
    logdir.mkdir(parents=True, exist_ok=True)
    files = JobFiles.of(logdir, jobid, 1)
    for path in (files.script, files.log, files.node_out("node1"), files.metrics):
        path.write_text("x" * 100)
    (wd / STATE_DIR).mkdir(parents=True, exist_ok=True)
    marker(wd / STATE_DIR, jobid, EXIT_MARKER).write_text("0 0 name\n")
    sub = Submission(run, rule, {}, tuple(outputs), f"mn-{run}-{jobid}", 1, str(files.script), str(files.log), jobid,
                     submitted_at=at, ended=ended, ended_at=None if ended is None else at + 60)  # fmt: skip
    return Registry(wd, run).record(sub)


def files_of(wd: Path, jobid: str) -> list[Path]:
    return sorted(StateFolders(wd).logs.rglob(log_stem(jobid, 1) + ".*"))


def nothing_runs(ids: list[str]) -> set[str]:
    return set()


def run_clean(wd: Path, active=nothing_runs, older_than: float = 0.0, keep_failed: bool = False) -> clean.CleanPlan:
    cleaning = clean.plan(wd, older_than, keep_failed, active, now=NOW)
    clean.apply(wd, cleaning)
    return cleaning


def test_a_finished_jobs_record_script_logs_markers_and_index_entry_go(tmp_path):
    job(tmp_path, "old", "11")
    assert Registry(tmp_path, "next").latest_for(["out.txt"]) is not None
    cleaning = run_clean(tmp_path)
    assert files_of(tmp_path, "11") == []
    assert not (tmp_path / STATE_DIR / "11.exit").exists()
    assert not list(StateFolders(tmp_path).runs.glob("*/*.json"))
    assert Registry(tmp_path, "next").latest_for(["out.txt"]) is None  # the index forgot it too
    assert not (StateFolders(tmp_path).logs / "rule_work").exists()  # empty folders go
    assert cleaning.size >= 400


def test_a_job_slurm_holds_as_queued_or_running_keeps_everything(tmp_path):
    job(tmp_path, "old", "11")
    running = job(tmp_path, "now", "12", outputs=("b.txt",), ended=None)
    before = files_of(tmp_path, "12")
    cleaning = run_clean(tmp_path, active=lambda ids: {"12"} & set(ids))
    assert files_of(tmp_path, "12") == before and (tmp_path / STATE_DIR / "12.exit").exists()
    assert Registry(tmp_path, "next").latest_for(["b.txt"]) == running  # a rerun still reattaches to it
    assert files_of(tmp_path, "11") == [] and cleaning.kept == {"queued or running": 1}


def test_when_slurm_does_not_answer_every_job_no_run_saw_end_is_kept(tmp_path):
    job(tmp_path, "now", "12", ended=None)
    cleaning = run_clean(tmp_path, active=lambda ids: None)
    assert len(files_of(tmp_path, "12")) == 4 and "SLURM did not answer" in cleaning.note


def test_older_than_and_keep_failed_keep_what_they_name(tmp_path):
    job(tmp_path, "young", "21", outputs=("y.txt",), at=NOW - 2 * DAY)
    job(tmp_path, "failed", "22", outputs=("f.txt",), ended="failed")
    job(tmp_path, "old", "23", outputs=("o.txt",))
    run_clean(tmp_path, older_than=30 * DAY, keep_failed=True)
    assert files_of(tmp_path, "21") and files_of(tmp_path, "22") and not files_of(tmp_path, "23")


def test_a_file_an_adopted_job_shares_with_a_kept_record_stays(tmp_path):
    earlier = job(tmp_path, "a", "31", ended=None)
    Registry(tmp_path, "b").adopt(earlier)  # run b reattached to the job, which still runs
    run_clean(tmp_path, active=lambda ids: {"31"} & set(ids))
    assert len(files_of(tmp_path, "31")) == 4


def test_a_declared_output_is_never_removed_even_where_a_log_would_be(tmp_path):
    metrics = JobFiles.of(LOGS_DIR / "rule_work" / "_", "41", 1).metrics  # as the workflow names it: relative
    job(tmp_path, "old", "41", outputs=(str(metrics),))
    run_clean(tmp_path)
    assert [p.name for p in files_of(tmp_path, "41")] == [metrics.name]


def test_snapshots_no_kept_job_names_go_with_the_objects_only_they_held(tmp_path):
    base = StateFolders(tmp_path).root
    (base / "objects/ab").mkdir(parents=True)
    shared, only_old = base / "objects/ab/shared", base / "objects/ab/only-old"
    shared.write_text("s")
    only_old.write_text("o")
    for name, objs in (("a" * 64, [shared, only_old]), ("b" * 64, [shared])):
        (base / "snapshots" / name).mkdir(parents=True)
        for obj in objs:
            os.link(obj, base / "snapshots" / name / obj.name)
    old_stamp = NOW - 40 * DAY
    for p in [*base.rglob("*")]:
        os.utime(p, (old_stamp, old_stamp))
    job(tmp_path, "old", "51")
    kept = job(tmp_path, "now", "52", outputs=("b.txt",), ended=None)
    Path(kept.script).write_text(f"cd {base / 'snapshots' / ('b' * 64)}\n")
    run_clean(tmp_path, active=lambda ids: {"52"} & set(ids))
    assert sorted(p.name for p in (base / "snapshots").iterdir()) == ["b" * 64]
    assert shared.exists() and not only_old.exists()


@pytest.mark.parametrize("text", ["soon", "-3d", "30 parsecs"])
def test_an_unreadable_older_than_is_refused_naming_the_option(text):
    with pytest.raises(clean.CleanError, match=r"--older-than .*: a duration such as 30d, 12h or 90m, or 0"):
        clean.older_than_seconds(text)


def test_durations_read_as_snakemake_writes_them():
    assert [clean.older_than_seconds(t) for t in ("0", "90m", "12h", "30d")] == [0, 5400, 43200, 30 * DAY]


def test_the_index_lock_file_is_not_an_entry(tmp_path):
    job(tmp_path, "old", "61")
    assert [p.name for p in (tmp_path / INDEX_DIR).iterdir() if p.suffix == ".json"]
    run_clean(tmp_path)
    assert [p.name for p in (tmp_path / INDEX_DIR).iterdir()] == [".lock"]


def test_a_job_arrays_script_goes_with_its_last_element(tmp_path):
    first, second = job(tmp_path, "old", "70_0"), job(tmp_path, "old", "70_1", outputs=("b.txt",), ended=None)
    rule_dir = Path(first.log).parent.parent
    driver = rule_dir / "mn-old-70_0-array2.sh"
    driver.write_text("#!/bin/bash\n")
    for sub in (first, second):
        Path(sub.log).with_name(f"{sub.job_name}.sh").write_text("element\n")
        Registry(tmp_path, "old").record(replace(sub, array=driver.stem))
    run_clean(tmp_path, active=lambda ids: {"70_1"} & set(ids))  # the second element still runs
    assert driver.exists() and not files_of(tmp_path, "70_0") and files_of(tmp_path, "70_1")
    assert not (Path(first.log).parent / f"{first.job_name}.sh").exists()
    run_clean(tmp_path)
    assert not driver.exists() and not files_of(tmp_path, "70_1")
