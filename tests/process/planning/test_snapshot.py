"""The code a job runs is frozen at submission: a content-addressed snapshot of the files git tracks (uncommitted
changes included), the command's paths to them rewritten into it, outputs left where Snakemake expects them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from snakemake_executor_multinode.planning import snapshot
from snakemake_executor_multinode.planning.snapshot import (
    REUSE_S,
    SnapshotError,
    SnapshotStore,
    hashes,
    manifest,
    named_files,
    rewrite,
    unfrozen,
)
from tests.helpers import committed_repo


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A workflow repository: a training script and its sibling module, committed."""
    return committed_repo(
        tmp_path / "repo",
        {
            "scripts/train.py": "import lm\nprint(lm.VERSION)\n",
            "scripts/lm.py": "VERSION = 'v1'\n",
            ".gitignore": ".snakemake/\nresults/\n",
        },
    )


def test_the_snapshot_mirrors_the_tracked_files_with_their_uncommitted_changes(repo):
    (repo / "scripts" / "lm.py").write_text("VERSION = 'v2, not committed'\n")
    (repo / "scripts" / "scratch.py").write_text("untracked\n")
    snap = SnapshotStore(repo, "git").freeze()
    assert snap is not None and snap.commit and snap.uncommitted
    assert (snap.root / "scripts" / "lm.py").read_text() == "VERSION = 'v2, not committed'\n"
    assert not (snap.root / "scripts" / "scratch.py").exists()  # git does not track it
    assert snap.files == {".gitignore", "scripts/train.py", "scripts/lm.py"}


def test_an_edit_after_submission_does_not_reach_the_snapshot_and_unchanged_files_cost_nothing_twice(repo):
    store = SnapshotStore(repo, "git")
    first = store.freeze()
    assert first is not None and store.freeze() == first  # nothing changed: the same snapshot
    (repo / "scripts" / "lm.py").write_text("VERSION = 'v3'\n")
    store._last_at -= REUSE_S  # the next submission comes later than the reuse window
    second = store.freeze()
    assert second is not None and second.digest != first.digest
    assert (first.root / "scripts" / "lm.py").read_text() == "VERSION = 'v1'\n"  # the submitted code, still there
    assert (second.root / "scripts" / "lm.py").read_text() == "VERSION = 'v3'\n"
    a, b = (s.root / "scripts" / "train.py" for s in (first, second))
    assert a.stat().st_ino == b.stat().st_ino  # one object, hard-linked into both
    assert a.stat().st_mode & 0o222 == 0


def test_the_same_code_in_a_new_run_is_the_same_snapshot(repo):
    first = SnapshotStore(repo, "git").freeze()
    again = SnapshotStore(repo, "git").freeze()  # a new run: stat cache from disk, same digest, same folder
    assert first is not None and again is not None and (again.digest, again.root) == (first.digest, first.root)


def test_paths_to_frozen_files_are_rewritten_relative_or_absolute_outputs_never(repo):
    snap = SnapshotStore(repo, "git").freeze()
    assert snap is not None
    command = (
        f"python scripts/train.py --lm {repo}/scripts/lm.py --out results/model.pt "
        "&& cat scripts/lm.py > scripts/copy.txt"
    )
    out = rewrite(command, snap, repo, keep=["results/model.pt", "scripts/copy.txt"])
    assert out == (
        f"python {snap.root}/scripts/train.py --lm {snap.root}/scripts/lm.py --out results/model.pt "
        f"&& cat {snap.root}/scripts/lm.py > scripts/copy.txt"
    )
    # a frozen file that is also an output of the job stays where Snakemake expects it
    assert rewrite("touch scripts/lm.py", snap, repo, keep=["scripts/lm.py"]) == "touch scripts/lm.py"


def test_the_frozen_script_imports_its_frozen_sibling(repo):
    snap = SnapshotStore(repo, "git").freeze()
    assert snap is not None
    (repo / "scripts" / "lm.py").write_text("VERSION = 'edited while the job waited'\n")
    command = rewrite("python3 scripts/train.py", snap, repo)
    run = subprocess.run(["bash", "-c", command], cwd=repo, capture_output=True, text=True, check=True)
    assert run.stdout == "v1\n"


def test_an_untracked_script_the_command_names_is_reported_not_frozen(repo):
    (repo / "scripts" / "new.py").write_text("print('new')\n")
    snap = SnapshotStore(repo, "git").freeze()
    assert snap is not None
    assert unfrozen("python scripts/new.py scripts/train.py", snap, repo) == [repo / "scripts" / "new.py"]


def test_without_git_nothing_is_frozen_and_the_named_files_are_checked(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("print(1)\n")
    store = SnapshotStore(tmp_path, "git")
    assert store.freeze() is None
    asked = []
    monkeypatch.setattr(snapshot, "_git", lambda *a: asked.append(a))
    assert store.freeze() is None and asked == []  # a burst of plans (every job of a run) asks git once
    store._last_at -= REUSE_S
    assert store.freeze() is None and asked  # later it asks again: a repository may have been made meanwhile
    assert SnapshotStore(tmp_path, "off").freeze() is None
    files = named_files("python train.py --out out.txt", tmp_path, keep=["out.txt"])
    assert files == [tmp_path / "train.py"]
    check = tmp_path / "code.sha256"
    check.write_text(manifest(hashes(files)))
    assert subprocess.run(["sha256sum", "--quiet", "-c", str(check)], capture_output=True).returncode == 0
    (tmp_path / "train.py").write_text("print(2)\n")
    changed = subprocess.run(["sha256sum", "--quiet", "-c", str(check)], capture_output=True, text=True)
    assert changed.returncode != 0 and f"{tmp_path / 'train.py'}: FAILED" in changed.stdout


def test_a_record_the_job_writes_is_not_code_so_a_restart_after_it_grew_still_resumes(tmp_path):
    """`--metrics m.jsonl` names a file the training appends to: hashed, every requeue would stop with exit 86."""
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "m.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "data.bin").write_bytes(b"\0" * 8)
    (tmp_path / "cfg.yaml").write_text("lr: 1\n")
    (tmp_path / "run").write_text("#!/bin/sh\n")
    command = "python train.py --metrics m.jsonl --data data.bin --config cfg.yaml && ./run"
    assert named_files(command, tmp_path) == [tmp_path / n for n in ("train.py", "cfg.yaml", "run")]


def test_a_list_of_paths_is_frozen_without_git(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print(1)\n")
    snap = SnapshotStore(tmp_path, "code").freeze()
    assert snap is not None and snap.commit is None and snap.files == {"code/train.py"}
    assert rewrite("python code/train.py", snap, tmp_path) == f"python {snap.root}/code/train.py"


@pytest.mark.parametrize(
    "setting, said",
    [(" , ", "names nothing"), ("../elsewhere", "is outside the workflow folder"), ("missing.py", "does not exist")],
)
def test_a_bad_setting_is_refused_naming_the_setting_and_the_path(tmp_path, setting, said):
    (tmp_path.parent / "elsewhere").mkdir(exist_ok=True)
    with pytest.raises(SnapshotError, match=rf"--multinode-snapshot.*{said}"):
        SnapshotStore(tmp_path, setting)
