"""The plugin's own state folder (.snakemake/multinode) full (issue 38, part 3): a job script, record or code snapshot
that does not fit stops the job before sbatch (or cancels a job whose record failed after it), with a message naming
the file, the bytes needed and the bytes free, never a Python stack; a job's end that cannot be recorded fails the
job loudly. Small filesystems are tmpfs mounts the tests make and remove (root); the job script's own marker:
tests/process/contract/test_protocol.py; on the real cluster: tests/cluster/test_disk_full_cluster.py."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import EXIT_MARKER, StateFolders
from snakemake_executor_multinode.planning import snapshot
from snakemake_executor_multinode.planning.plan import RuleJob
from snakemake_executor_multinode.session import NotSubmitted, SubmitRefused
from snakemake_executor_multinode.util.private_files import StateWriteError, write_private
from snakemake_executor_multinode.watching.reattach import RunReason
from tests.helpers import FakeSlurm, fake_session, fill, needs_root, small_filesystem

FULL = r"no space left on device; (\d+) bytes needed \(([^)]*)\), (\d+) bytes free in ([^;\s]+)"


def Slurm() -> FakeSlurm:  # noqa: N802 (reads as the fake it builds)
    """sbatch hands out job ids from 41 and names its release; squeue and sacct know nothing."""
    ids = iter(range(41, 100))

    def sbatch(cmd: list[str]) -> tuple[int, str, str]:
        return (0, "slurm-wlm 22.05.8\n", "") if cmd == ["sbatch", "--version"] else (0, f"{next(ids)}\n", "")

    return FakeSlurm(sbatch=sbatch)


def enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_private_file_that_does_not_fit_names_itself_the_bytes_needed_and_free_and_leaves_the_old_one(tmp_path):
    needs_root()
    with small_filesystem(tmp_path / "fs", 64 << 10) as fs:
        path = fs / "record.json"
        write_private(path, "old\n")
        fill(fs)
        with pytest.raises(StateWriteError) as failed:
            write_private(path, "x" * 10000)
        assert str(failed.value) == (
            f"cannot write {path}: no space left on device; 10000 bytes needed (the file), 0 bytes free in {fs}"
        )
        assert isinstance(failed.value, OSError) and failed.value.errno == errno.ENOSPC  # old handlers still match
        assert path.read_text() == "old\n" and sorted(os.listdir(fs)) == ["filler", "record.json"]  # no temp left
    with pytest.raises(StateWriteError, match=r"^cannot write \S+/gone/r.json: No such file or directory$"):
        write_private(tmp_path / "gone" / "r.json", "x")  # any other failure: named, without the space figures


def test_a_job_whose_script_does_not_fit_in_the_state_folder_is_not_submitted_and_says_why(tmp_path):
    needs_root()
    with small_filesystem(StateFolders(tmp_path).root, 64 << 10) as state:
        fill(state)
        slurm = Slurm()
        s, _ = fake_session(tmp_path, slurm)
        plan = s.plan(RuleJob("train", {"nodes": 2, "own_launcher": True}, "true", key="0.1", outputs=("out.txt",)))
        with pytest.raises(NotSubmitted) as failed:
            s.submit(plan, ["out.txt"], RunReason())
        found = re.fullmatch(rf"rule 'train': not submitted: cannot write (\S+): {FULL}", str(failed.value))
        assert found, failed.value
        script, needed, how, free, where = found.groups()
        assert Path(script).parent == Path(where) and state in Path(script).parents
        assert (int(needed), how, int(free)) == (len(plan.script.encode()), "the file", 0)
        assert isinstance(failed.value, SubmitRefused)  # the adapter's one door for a job that did not go
        assert slurm.called("sbatch") == [["sbatch", "--version"]] and s.registry.mine() == []


def test_a_job_whose_record_fails_after_sbatch_is_cancelled_at_once(tmp_path, monkeypatch):
    slurm = Slurm()
    s, _ = fake_session(tmp_path, slurm)
    plan = s.plan(RuleJob("train", {"nodes": 2, "own_launcher": True}, "true", key="0.1", outputs=("out.txt",)))

    def full(*_a: object, **_kw: object) -> None:
        raise StateWriteError(tmp_path / "r.json", enospc(), 321)

    monkeypatch.setattr(s.registry, "submitted", full)
    with pytest.raises(NotSubmitted) as failed:
        s.submit(plan, ["out.txt"], RunReason())
    assert re.fullmatch(
        rf"rule 'train': SLURM job 41 cancelled: its record could not be written: cannot write \S+/r.json: {FULL}",
        str(failed.value),
    ), failed.value
    assert slurm.called("scancel") == [["scancel", "41"]]


def test_a_job_end_that_cannot_be_recorded_fails_the_job_saying_so(tmp_path, monkeypatch):
    s, _ = fake_session(tmp_path, Slurm())
    plan = s.plan(RuleJob("train", {"nodes": 2, "own_launcher": True}, "true", key="0.1", outputs=("out.txt",)))
    sub = s.submit(plan, ["out.txt"], RunReason())
    StateFolders(tmp_path).marker("41", EXIT_MARKER).write_text(f"0 0 {sub.job_name}\n")
    outcome = s.poll([(sub, "train")])["41"]
    assert outcome.success

    def full(*_a: object, **_kw: object) -> None:
        raise StateWriteError(tmp_path / "r.json", enospc(), 321)

    monkeypatch.setattr(s.registry, "ended", full)
    ended = s.end(sub, outcome)
    assert not ended.success
    assert re.fullmatch(
        rf"SLURM job 41 succeeded, but its end could not be recorded: cannot write \S+/r.json: {FULL}", ended.message
    ), ended.message


def test_a_code_snapshot_that_does_not_fit_says_the_bytes_of_code_not_yet_in_the_store(tmp_path):
    needs_root()
    (tmp_path / "train.py").write_text("#" * 20000 + "\n")
    with small_filesystem(StateFolders(tmp_path).root, 64 << 10) as state:
        fill(state)
        with pytest.raises(StateWriteError) as failed:
            snapshot.SnapshotStore(tmp_path, "train.py").freeze()
        found = re.fullmatch(rf"cannot write (\S+): {FULL}", str(failed.value))
        assert found, failed.value
        assert found.group(2, 3) == ("20001", "the code not yet in the store")
        assert not any(p.is_file() and p.name != "filler" for p in state.rglob("*"))  # no half object left


def test_the_adapter_says_a_state_folder_error_without_a_python_stack():
    from snakemake_executor_plugin_multinode import StateFolderError, refused

    err = refused(NotSubmitted("rule 'train': not submitted: cannot write x: no space left on device"))
    assert isinstance(err, StateFolderError) and str(err).startswith("rule 'train': not submitted")
    try:
        raise err
    except StateFolderError as caught:
        assert caught.__traceback__ is None  # what Snakemake prints the stack from
    assert type(refused(SubmitRefused("sbatch refused"))).__name__ == "WorkflowError"
