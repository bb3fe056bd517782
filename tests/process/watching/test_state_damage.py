"""Damaged state under .snakemake/multinode/ (issue 38): every reader, every damage (cut short, garbage bytes,
another JSON shape, another owner). The reader says what it left out (one line naming the file) and goes on, or,
where going on could run a job twice, stops before submitting and names the file; never a traceback.
The same on the real cluster, a whole rerun per case: tests/cluster/test_state_damage_cluster.py."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from snakemake_executor_multinode.cli.provenance import provenance_command
from snakemake_executor_multinode.contract import state_files
from snakemake_executor_multinode.contract.jobfiles import INDEX_DIR, PROVENANCE_DIR, RUNS_DIR, StateFolders
from snakemake_executor_multinode.contract.state_files import Damaged, StateError
from snakemake_executor_multinode.planning.snapshot import SnapshotStore
from snakemake_executor_multinode.session import Session, Settings
from snakemake_executor_multinode.slurm.client import JobState
from snakemake_executor_multinode.watching import clean, provenance, registry, status_view
from snakemake_executor_multinode.watching.job_status import JobStatus
from snakemake_executor_multinode.watching.registry import Index, Registry, Submission
from tests.helpers import Clock, FakeClient, committed_repo

OTHER_UID = 65534  # nobody


def truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def emptied(path: Path) -> None:
    path.write_bytes(b"")


def garbage(path: Path) -> None:
    path.write_bytes(bytes(range(128, 256)) * 2)  # no UTF-8


def other_json(path: Path) -> None:
    path.write_text('{"hello": ["not", "a", "record"]}\n')


def foreign(path: Path) -> None:
    os.chown(path, OTHER_UID, OTHER_UID)


DAMAGES: dict[str, Callable[[Path], None]] = {
    "truncated": truncated, "empty": emptied, "garbage": garbage, "other JSON": other_json, "wrong owner": foreign,
}  # fmt: skip


@pytest.fixture(params=list(DAMAGES))
def damage(request: pytest.FixtureRequest) -> tuple[str, Callable[[Path], None]]:
    if request.param == "wrong owner" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    return request.param, DAMAGES[request.param]


@pytest.fixture
def said() -> Iterator[list[str]]:
    lines: list[str] = []
    state_files.report_to(lines.append)
    yield lines
    state_files.report_to(None)


def sub(run: str, name: str, jobid: str | None = "7", at: float = 1.0, outputs=("out.txt",)) -> Submission:
    return Submission(run, "work", {}, outputs, name, 1, "s.sh", "l.log", jobid, submitted_at=at)


def only_line(said: list[str], path: Path) -> str:
    (line,) = said
    assert str(path) in line and "damaged state file" in line and "ignored:" in line, line
    return line


# --- the registry ---------------------------------------------------------------------------------------------
def test_a_damaged_record_is_left_out_with_one_line_naming_it(tmp_path, damage, said):
    _, hurt = damage
    Registry(tmp_path, "old").record(sub("old", "a"))
    Registry(tmp_path, "old").record(sub("old", "b", jobid="8", outputs=("b.txt",)))
    path = tmp_path / RUNS_DIR / "old" / "a.json"
    hurt(path)
    assert [s.job_name for s in registry.runs(tmp_path / RUNS_DIR)] == ["b"]
    assert list(status_view.run_table(tmp_path)) == ["old"]
    only_line(said, path)
    assert [p.name for p, _ in clean._records(tmp_path / RUNS_DIR)] == ["b.json"]  # said once per process


def test_a_damaged_index_entry_is_rebuilt_from_the_records_and_still_finds_the_running_job(tmp_path, damage, said):
    """Without the index's answer the rerun would submit a job that still runs: a duplicate."""
    _, hurt = damage
    Registry(tmp_path, "old").record(sub("old", "a", jobid="7", at=1.0))
    now = Registry(tmp_path, "now")
    (path,) = (tmp_path / INDEX_DIR).glob("*.json")
    hurt(path)
    found = now.latest_for(["out.txt"])
    assert found is not None and found.jobid == "7"
    assert "rebuilt from the run records (1 entries)" in only_line(said, path)
    assert json.loads(path.read_text())[0]["jobid"] == "7" and path.stat().st_uid == os.geteuid()  # repaired
    now.record(sub("now", "c", jobid="9", at=2.0))  # and written to again
    assert [e["jobid"] for e in json.loads(path.read_text())] == ["9", "7"]


def test_an_index_entry_damaged_while_a_record_is_added_keeps_the_other_runs_entry(tmp_path, damage, said):
    _, hurt = damage
    Registry(tmp_path, "old").record(sub("old", "a", jobid="7", at=1.0))
    (path,) = (tmp_path / INDEX_DIR).glob("*.json")
    hurt(path)
    Registry(tmp_path, "now").record(sub("now", "c", jobid="9", at=2.0))
    assert [e["jobid"] for e in json.loads(path.read_text())] == ["9", "7"]
    only_line(said, path)


def test_a_damaged_index_entry_with_a_damaged_record_stops_before_submitting_naming_both(tmp_path, said):
    Registry(tmp_path, "old").record(sub("old", "a", jobid="7"))
    now = Registry(tmp_path, "now")
    (index,) = (tmp_path / INDEX_DIR).glob("*.json")
    record = tmp_path / RUNS_DIR / "old" / "a.json"
    truncated(index)
    garbage(record)
    with pytest.raises(StateError) as err:
        now.latest_for(["out.txt"])
    assert str(index) in str(err.value) and str(record) in str(err.value) and "Remove" in str(err.value)


def test_a_foreign_lock_file_of_the_index_is_replaced(tmp_path, said):
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    Registry(tmp_path, "old").record(sub("old", "a"))
    lock = tmp_path / INDEX_DIR / ".lock"
    foreign(lock)
    Registry(tmp_path, "now").record(sub("now", "b", jobid="8", at=2.0))
    assert lock.stat().st_uid == os.geteuid()
    assert "replaced by a lock file of this user" in only_line(said, lock)


def test_an_index_drop_leaves_a_damaged_entry_for_the_next_reader_to_rebuild(tmp_path, said):
    Registry(tmp_path, "old").record(sub("old", "a"))
    (path,) = (tmp_path / INDEX_DIR).glob("*.json")
    garbage(path)
    Index(tmp_path / INDEX_DIR).drop({tmp_path / RUNS_DIR / "old" / "a.json"})
    assert path.exists()
    only_line(said, path)


def test_a_record_of_another_shape_is_no_record():
    good = json.loads(json.dumps(sub("r", "a").__dict__ | {"outputs": ["out.txt"]}))
    assert registry.submission(dict(good)).job_name == "a"
    assert registry.submission(dict(good, newer_field=1)).job_name == "a"  # a newer plugin's field: left out
    for bad in ([], "x", {}, dict(good, outputs="out.txt"), dict(good, jobid=7), dict(good, submitted_at="now")):
        with pytest.raises(ValueError, match="record"):
            registry.submission(bad)


# --- markers ----------------------------------------------------------------------------------------------------
MARKER_DAMAGES = {
    "empty": lambda p: p.write_text(""),
    "garbage": garbage,
    "not an exit code": lambda p: p.write_text("Segmentation fault\n"),
    "cut in the job name": lambda p: p.write_text("0 0 mn-run-w"),
    "wrong owner": foreign,
}


@pytest.mark.parametrize("how", list(MARKER_DAMAGES))
def test_a_damaged_exit_marker_is_left_out_and_slurm_says_how_the_job_ended(tmp_path, how, said):
    """A damaged marker read as a failure would make a rerun submit a job that succeeded."""
    if how == "wrong owner" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    client = FakeClient({"7": JobState("7", "COMPLETED", exit_code="0:0")})
    job_status = JobStatus(tmp_path, client, clock=Clock())
    job_status.expect("7", "mn-run-work")
    marker = tmp_path / "7.exit"
    marker.write_text("0 0 mn-run-work\n")
    MARKER_DAMAGES[how](marker)
    out = job_status.poll(["7"], force_sweep=True)["7"]
    assert out.finished and out.success and out.state is not None and out.state.state == "COMPLETED"
    assert "asked of SLURM" in only_line(said, marker)
    assert status_view._exit_marker(tmp_path.parent, "7") is None  # no marker there: nothing said


@pytest.mark.parametrize("suffix", [".failed-node", ".stalled", ".crashes", ".requeued"])
def test_a_damaged_marker_beside_a_failure_is_left_out_of_its_message(tmp_path, suffix, said):
    client = FakeClient({"7": JobState("7", "FAILED")}, live={"7": JobState("7", "FAILED", restarts=0)})
    job_status = JobStatus(tmp_path, client, clock=Clock())
    (tmp_path / "7.exit").write_text("1 0\n")
    garbage(tmp_path / f"7{suffix}")
    out = job_status.poll(["7"], force_sweep=True)["7"]
    assert out.finished and not out.success and "\ufffd" not in out.describe()
    assert not out.failed_node and not out.stalled and not out.crashes
    if suffix != ".requeued":  # read only while the job runs
        only_line(said, tmp_path / f"7{suffix}")


def test_status_leaves_a_damaged_exit_marker_out(tmp_path, said):
    folders = StateFolders(tmp_path)
    folders.state.mkdir(parents=True)
    garbage(folders.marker("7", ".exit"))
    assert status_view._exit_marker(tmp_path, "7") is None
    only_line(said, folders.marker("7", ".exit"))


# --- provenance -------------------------------------------------------------------------------------------------
def submitted(wd: Path) -> Path:
    record = provenance.submission(
        rule="train", wildcards={}, command="python train.py", script="#!/bin/bash\n", code={}, environment={},
        outputs=["results/model.pt"],
    )  # fmt: skip
    provenance.save_submission(wd, "mn-run-train", record)
    return wd / PROVENANCE_DIR / "jobs" / "mn-run-train.json"


def test_a_damaged_submission_half_leaves_the_outputs_without_a_record_and_the_result_stands(tmp_path, damage, said):
    _, hurt = damage
    hurt(submitted(tmp_path))
    assert provenance.finish(tmp_path, "mn-run-train", None, {"state": "success"}) is None
    assert "get no provenance record (the job's result stands)" in only_line(said, submitted_path(tmp_path))
    assert provenance.find(tmp_path, "results/model.pt") is None


def submitted_path(wd: Path) -> Path:
    return wd / PROVENANCE_DIR / "jobs" / "mn-run-train.json"


def test_multinode_provenance_names_a_damaged_output_record(tmp_path, damage, capsys):
    _, hurt = damage
    submitted(tmp_path)
    provenance.finish(tmp_path, "mn-run-train", None, {"state": "success"})
    path = provenance.record_path(tmp_path, "results/model.pt")
    hurt(path)
    with pytest.raises(Damaged):
        provenance.find(tmp_path, "results/model.pt")
    args = type("Args", (), {"start": None, "directory": tmp_path, "diff": False, "paths": ["results/model.pt"]})
    assert provenance_command(args) == 1
    err = capsys.readouterr().err
    assert str(path) in err and "damaged" in err


# --- code snapshots ---------------------------------------------------------------------------------------------
@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return committed_repo(
        tmp_path / "repo",
        {"scripts/train.py": "print('the real training')\n" * 20, ".gitignore": ".snakemake/\n"},
    )


def frozen(repo: Path) -> Path:
    snap = SnapshotStore(repo, "git").freeze()
    assert snap is not None
    return snap.root / "scripts" / "train.py"


@pytest.mark.parametrize("where", ["snapshot", "object"])
def test_a_damaged_frozen_file_is_replaced_before_a_job_runs_it(repo, damage, said, where):
    how, hurt = damage
    if how == "other JSON":
        pytest.skip("a script, no JSON")
    path = frozen(repo)
    (obj,) = [p for p in StateFolders(repo).objects.glob("*/*") if p.stat().st_ino == path.stat().st_ino]
    os.chmod(path, 0o600)  # read-only as stored: the damage writes it anyway (root or the owner)
    hurt(path if where == "snapshot" else obj)
    again = frozen(repo)  # a later run (a store of its own) uses the same snapshot
    assert again == path
    assert again.read_text() == (repo / "scripts" / "train.py").read_text()
    assert again.stat().st_uid == os.geteuid()
    (line,) = said
    assert str(path) in line and "replaced from" in line
    said.clear()
    frozen(repo)  # intact now: checked from the stat cache, nothing said
    assert said == []


def test_a_deleted_file_of_a_snapshot_is_put_back(repo, said):
    path = frozen(repo)
    path.unlink()
    assert frozen(repo).read_text() == (repo / "scripts" / "train.py").read_text()
    assert "missing" in said[0]


def test_a_damaged_stat_cache_is_left_out_and_the_code_hashed_anew(repo, damage, said):
    _, hurt = damage
    frozen(repo)
    cache = StateFolders(repo).objects / "stat-cache.json"
    hurt(cache)
    assert frozen(repo).read_text() == (repo / "scripts" / "train.py").read_text()
    assert "hashed anew" in only_line(said, cache)
    assert json.loads(cache.read_text()) and cache.stat().st_uid == os.geteuid()  # written again


# --- the state folders themselves -------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["a file", "wrong owner"])
def test_a_state_folder_that_is_no_folder_of_ours_stops_the_run_before_anything_is_submitted(tmp_path, how):
    if how == "wrong owner" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    folders = StateFolders(tmp_path)
    folders.root.mkdir(parents=True)
    if how == "a file":
        folders.index.write_text("garbage")
    else:
        folders.index.mkdir()
        os.chown(folders.index, OTHER_UID, OTHER_UID)
    with pytest.raises(StateError) as err:
        Session(Settings(), tmp_path, info=lambda _: None, warning=lambda _: None)
    assert str(folders.index) in str(err.value) and "Nothing was submitted" in str(err.value)
