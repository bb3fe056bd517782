"""Verified checkpoints (issue 38): a manifest of sizes and sha256 at save, fsync before the rename, verification at
resume (a damaged checkpoint is skipped, named, and the previous one used), pruning that counts verified ones only,
and the cost of both in the metrics events."""

from __future__ import annotations

import json
import os
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import checkpoint
import lm
import pytest
import torch.distributed as dist

from tests.helpers import REPO, load_script

from .helpers import TINY, assert_same_final_model, checkpoint_bytes, events, records, step_dir, train, truncate

STEPS, STOP, EVERY = 8, 6, 2
CFG: dict[str, Any] = {**TINY, "plugin": "torch_ddp", "steps": STEPS, "lr": 3e-3, "ckpt_every": EVERY, "keep_ckpts": 3}
SHARD = "model/pytorch_model-00001.bin"  # torch_ddp: the model's one shard (rank 0 writes it)
OPTIM_SHARD = "optimizer/pytorch_optim-00001.bin"
RANK1 = "ranks/rank00001.pt"  # rank 1's own file


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("straight")
    train(out, data_dir, CFG)
    return out


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """A run stopped at step 6 with checkpoints at 2, 4 and 6: each test damages its own copy."""
    out = tmp_path_factory.mktemp("stopped")
    train(out, data_dir, {**CFG, "stop_after": STOP})
    return out


def copy_of(stopped: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(stopped, out)
    return out


def empty(path: Path) -> None:
    path.write_bytes(b"")


def remove(path: Path) -> None:
    path.unlink()


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


# What is damaged, how, and the problem verify reports (from the file's saved size).
DAMAGES: dict[str, tuple[str, Callable[[Path], None], Callable[[int], str]]] = {
    "truncated_shard": (SHARD, truncate, lambda n: f"size {n // 2} != {n} (saved)"),
    "empty_file": (OPTIM_SHARD, empty, lambda n: f"size 0 != {n} (saved)"),
    "missing_rank_file": (RANK1, remove, lambda n: "missing"),
    "flipped_byte": (SHARD, flip_a_byte, lambda n: "checksum mismatch"),
}


# ---- With torchrun, 2 ranks on CPU (gloo): deterministic, so a resumed run's final model equals a straight one's ----
@pytest.mark.slow
def test_every_saved_checkpoint_has_a_manifest_of_all_its_files_and_verifies(stopped: Path) -> None:
    steps = [s for s, _ in checkpoint.complete_checkpoints(stopped / "ckpt")]
    assert steps == [2, 4, 6]
    for step in steps:
        path = step_dir(stopped, step)
        meta = json.loads((path / checkpoint.META).read_text())
        assert sorted(meta[checkpoint.FILES]) == checkpoint.data_files(path)
        assert {SHARD, OPTIM_SHARD, RANK1, "ranks/rank00000.pt", checkpoint.SCHEDULER} <= set(meta[checkpoint.FILES])
        assert checkpoint.verify(path) is None
    assert not list((stopped / "ckpt").glob(".tmp_*"))


@pytest.mark.slow
def test_a_checkpoint_is_as_large_as_the_estimate_the_disk_full_cluster_test_sizes_its_filesystem_by(
    stopped: Path,
) -> None:
    """tests/cluster/test_disk_full_cluster.py mounts 1.5 estimates: one checkpoint must fit and two must not."""
    size = checkpoint.tree_bytes(step_dir(stopped, EVERY))
    assert abs(size - checkpoint_bytes(CFG)) < 0.05 * size, (size, checkpoint_bytes(CFG))


def test_the_cost_of_fsync_manifest_and_verification_is_in_every_checkpoint_end_event(stopped: Path) -> None:
    ends = [e for e in events(stopped / "metrics.jsonl") if e["event"] == "checkpoint_end"]
    assert [e["step"] for e in ends] == [2, 4, 6]
    for e in ends:
        assert all(isinstance(e[k], float) and e[k] > 0 for k in ("fsync_s", "manifest_s", "verify_s")), e


@pytest.mark.slow
def test_the_cost_benchmark_summarizes_a_runs_events(stopped: Path) -> None:
    bench = load_script(REPO / "benchmarks" / "checkpoint_cost.py", "checkpoint_cost_under_test")
    ends = [e for e in events(stopped / "metrics.jsonl") if e["event"] == "checkpoint_end"]
    summary = bench.summarize(records(stopped / "metrics.jsonl"), 1000)
    assert summary["checkpoints"] == 3 and summary["checkpoint_bytes"] == 1000
    assert summary["verify_s"]["max"] == max(e["verify_s"] for e in ends)
    assert 0 < summary["fsync_share_of_save"] < 1
    assert "resume" not in summary  # the stopped run started fresh


@pytest.mark.slow
def test_the_cost_benchmark_runs_end_to_end_with_its_overrides(tmp_path: Path) -> None:
    """The benchmark's own run (train to half the steps, then resume to the end), small: what a GPU machine runs
    with a larger model through --set."""
    bench = load_script(REPO / "benchmarks" / "checkpoint_cost.py", "checkpoint_cost_end_to_end")
    out = tmp_path / "result.json"
    argv = ["--nproc", "1", "--ckpt-every", "2", "--num-docs", "40", "--work-dir", str(tmp_path)]
    argv += ["--set", json.dumps({"steps": 8}), "--out", str(out)]
    assert bench.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["config"]["steps"] == 8 and result["ranks"] == 1 and result["machine"]["gpu"] is None
    assert result["checkpoints"] == 4 and result["resume"]["verify_s"] > 0  # steps 2 and 4, resumed, 6 and 8
    assert result["command"] == "python benchmarks/checkpoint_cost.py " + shlex.join(argv)  # to run it again
    hashing = result["manifest_hashing"]  # one thread and train.py's threads, side by side on one checkpoint
    assert hashing["files"] >= 4 and hashing["threads"] == min(hashing["files"], len(os.sched_getaffinity(0)), 16)
    assert hashing["one_thread_s"] > 0 and hashing["threads_s"] > 0 and hashing["repeat"] == 3
    assert list(tmp_path.glob("ckpt-cost-*")) == []  # its work folder is removed


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_newest_checkpoint_is_skipped_naming_the_file_and_the_previous_one_gives_the_straight_model(
    damage: str, stopped: Path, straight: Path, tmp_path: Path, data_dir: Path
) -> None:
    out = copy_of(stopped, tmp_path)
    rel, apply, what = DAMAGES[damage]
    size = (step_dir(out, STOP) / rel).stat().st_size
    apply(step_dir(out, STOP) / rel)
    proc = train(out, data_dir, CFG)
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("checkpoint: skipping damaged")]
    assert skipped == [f"checkpoint: skipping damaged {step_dir(out, STOP)}: {rel}: {what(size)}"]
    assert f"resumed from {step_dir(out, STOP - EVERY)} at step {STOP - EVERY}" in proc.stdout
    resume = [e for e in events(out / "metrics.jsonl") if e["event"] == "resume"]
    assert [e["step"] for e in resume] == [STOP - EVERY]
    assert 0 < resume[0]["verify_s"] <= resume[0]["restore_s"]
    assert_same_final_model(straight, out)
    # The rerun saved step 6 again, over the damaged one: every checkpoint left verifies.
    assert all(checkpoint.verify(p) is None for _, p in checkpoint.complete_checkpoints(out / "ckpt"))


@pytest.mark.slow
def test_keep_ckpts_1_with_a_damaged_newest_checkpoint_never_leaves_no_verified_checkpoint(
    stopped: Path, straight: Path, tmp_path: Path, data_dir: Path
) -> None:
    out = copy_of(stopped, tmp_path)
    size = (step_dir(out, STOP) / SHARD).stat().st_size
    truncate(step_dir(out, STOP) / SHARD)
    # Resumes from 4 and saves 5; counting every complete checkpoint would keep only the damaged 6.
    proc = train(out, data_dir, {**CFG, "keep_ckpts": 1, "stop_after": 5})
    assert "checkpoint: skipping damaged" in proc.stdout
    left = {s: checkpoint.verify(p) for s, p in checkpoint.complete_checkpoints(out / "ckpt")}
    assert sorted(left) == [5, 6]
    assert left[5] is None and left[6] == f"{SHARD}: size {size // 2} != {size} (saved)"
    # And on to the end: the damaged 6 is skipped again, saved over, and only the newest verified one is kept.
    proc = train(out, data_dir, {**CFG, "keep_ckpts": 1})
    assert f"resumed from {step_dir(out, 5)} at step 5" in proc.stdout
    left = {s: checkpoint.verify(p) for s, p in checkpoint.complete_checkpoints(out / "ckpt")}
    assert left == {STEPS: None}
    assert_same_final_model(straight, out)


@pytest.mark.slow
def test_a_checkpoint_without_a_manifest_still_resumes_with_a_line_saying_it_could_not_be_verified(
    stopped: Path, straight: Path, tmp_path: Path, data_dir: Path
) -> None:
    out = copy_of(stopped, tmp_path)
    meta_path = step_dir(out, STOP) / checkpoint.META
    meta = json.loads(meta_path.read_text())
    del meta[checkpoint.FILES], meta[checkpoint.META_SHA]  # as an older train.py wrote it
    meta_path.write_text(json.dumps(meta, indent=1))
    proc = train(out, data_dir, CFG)
    assert f"checkpoint: {step_dir(out, STOP)} has {checkpoint.NO_MANIFEST}: it could not be verified" in proc.stdout
    assert f"resumed from {step_dir(out, STOP)} at step {STOP}" in proc.stdout
    assert_same_final_model(straight, out)


@pytest.mark.slow
def test_the_temp_folder_of_a_save_that_did_not_finish_is_removed_at_the_next_start_naming_it(
    stopped: Path, straight: Path, tmp_path: Path, data_dir: Path
) -> None:
    out = copy_of(stopped, tmp_path)
    # as a save killed while writing leaves it (a preemption's save at step 7): data files, no trainer.json, no rename
    tmp = out / "ckpt" / f"{checkpoint.TMP_PREFIX}{STOP + 1:08d}"
    shutil.copytree(step_dir(out, STOP), tmp, ignore=shutil.ignore_patterns(checkpoint.META, "ranks"))
    assert checkpoint.unfinished_saves(out / "ckpt") == [tmp]
    assert [s for s, _ in checkpoint.complete_checkpoints(out / "ckpt")] == [2, 4, 6]  # never taken for one
    proc = train(out, data_dir, CFG)
    assert f"checkpoint: removing {tmp}, the temp folder of a save that did not finish" in proc.stdout
    assert f"resumed from {step_dir(out, STOP)} at step {STOP}" in proc.stdout
    assert not tmp.exists() and checkpoint.unfinished_saves(out / "ckpt") == []  # step 7 is never saved again
    assert_same_final_model(straight, out)


# ---- Without torchrun: verify, choose and prune on hand-made checkpoints; the save's fsync order (world of 1) ----
def fake_checkpoint(root: Path, step: int, manifest: bool = True) -> Path:
    path = root / f"{checkpoint.CKPT_PREFIX}{step:08d}"
    (path / checkpoint.RANKS).mkdir(parents=True)
    (path / SHARD).parent.mkdir()
    (path / SHARD).write_bytes(bytes(range(256)) * 8)
    (path / RANK1).write_bytes(b"rank one " * 10)
    meta: dict[str, Any] = {"format": checkpoint.FORMAT, "step": step}
    if manifest:
        meta[checkpoint.FILES] = checkpoint.manifest(path)
        meta[checkpoint.META_SHA] = checkpoint.meta_sha256(meta)
    (path / checkpoint.META).write_text(json.dumps(meta))
    return path


def test_verify_names_the_file_and_what_is_wrong(tmp_path: Path) -> None:
    path = fake_checkpoint(tmp_path, 1)
    assert checkpoint.verify(path) is None
    for rel, apply, _ in DAMAGES.values():
        if not (path / rel).exists():
            continue
        saved = (path / rel).read_bytes()
        apply(path / rel)
        problem = checkpoint.verify(path)
        assert problem is not None and problem.startswith(f"{rel}: "), problem
        (path / rel).write_bytes(saved)
    assert checkpoint.verify(path) is None
    meta = json.loads((path / checkpoint.META).read_text())
    (path / checkpoint.META).write_text(json.dumps({**meta, "step": 2}))  # trainer.json itself altered
    assert checkpoint.verify(path) == f"{checkpoint.META}: checksum mismatch"
    (path / checkpoint.META).write_text("")
    assert (checkpoint.verify(path) or "").startswith(f"{checkpoint.META}: unreadable")
    (path / checkpoint.META).write_text("[]")
    assert checkpoint.verify(path) == f"{checkpoint.META}: not a JSON object"
    assert checkpoint.verify(fake_checkpoint(tmp_path, 2, manifest=False)) == checkpoint.NO_MANIFEST


def test_files_hash_on_several_threads_to_the_same_manifest_and_the_first_damaged_file_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = fake_checkpoint(tmp_path, 1)
    for i in range(6):  # shards of one folder, hashed at once
        (path / SHARD).with_name(f"extra-{i}.bin").write_bytes(bytes([i]) * 100_000)
    threads: list[int] = []
    real_pool = checkpoint.ThreadPoolExecutor
    monkeypatch.setattr(checkpoint, "ThreadPoolExecutor", lambda n: threads.append(n) or real_pool(n))
    files = checkpoint.manifest(path)
    assert files == checkpoint.manifest(path, threads=1)
    assert threads == [min(len(files), len(os.sched_getaffinity(0)), 16), 1]
    meta = {"format": checkpoint.FORMAT, "step": 1, checkpoint.FILES: files}
    (path / checkpoint.META).write_text(json.dumps({**meta, checkpoint.META_SHA: checkpoint.meta_sha256(meta)}))
    assert checkpoint.verify(path) is None
    for rel in list(files)[1:]:  # every file but the first altered, same size: the manifest's first of them named
        (path / rel).write_bytes(bytes(b ^ 1 for b in (path / rel).read_bytes()))
    assert checkpoint.verify(path) == f"{list(files)[1]}: checksum mismatch"


def local_checkpointer(root: Path, keep: int = 2) -> Any:
    ck = checkpoint.Checkpointer.__new__(checkpoint.Checkpointer)
    ck.root, ck.rank, ck.world, ck.keep, ck.verified, ck.save_cost = root, 0, 1, keep, set(), {}
    return ck


def test_choose_takes_the_newest_that_verifies_or_else_the_newest_without_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "a"
    fake_checkpoint(root, 2)
    fake_checkpoint(root, 4, manifest=False)
    remove(fake_checkpoint(root, 6) / RANK1)
    path, verify_s = local_checkpointer(root).choose()
    assert path == root / "step_00000004" and verify_s > 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"checkpoint: skipping damaged {root / 'step_00000006'}: {RANK1}: missing"
    assert out[1].startswith(f"checkpoint: {root / 'step_00000004'} has {checkpoint.NO_MANIFEST}")
    # A verified checkpoint newer than one without a manifest wins, without a line.
    root = tmp_path / "b"
    fake_checkpoint(root, 2, manifest=False)
    fake_checkpoint(root, 4)
    assert local_checkpointer(root).choose()[0] == root / "step_00000004"
    assert capsys.readouterr().out == ""
    # Nothing verifies: a fresh start, said so.
    root = tmp_path / "c"
    empty(fake_checkpoint(root, 2) / SHARD)
    assert local_checkpointer(root).choose()[0] is None
    assert "no checkpoint in" in capsys.readouterr().out


def test_pruning_counts_verified_checkpoints_only(tmp_path: Path) -> None:
    for step in (2, 4):
        fake_checkpoint(tmp_path, step)
    truncate(fake_checkpoint(tmp_path, 6) / SHARD)
    ck = local_checkpointer(tmp_path, keep=1)
    chosen, _ = ck.choose()  # 6 is damaged: 4 is the resume point, and the one verified checkpoint
    assert chosen == tmp_path / "step_00000004"
    ck._prune()
    assert [s for s, _ in checkpoint.complete_checkpoints(tmp_path)] == [4, 6]  # 2 goes, 4 (verified) stays
    ck.verified.add(fake_checkpoint(tmp_path, 5))  # a newer one has verified: now 4 may go
    ck._prune()
    assert [s for s, _ in checkpoint.complete_checkpoints(tmp_path)] == [5, 6]


class FakeBooster:
    """Writes a model shard and index, an optimizer shard, the scheduler: as the Booster's sharded save does."""

    def save_model(self, model: Any, path: str, shard: bool) -> None:
        Path(path).mkdir()
        (Path(path) / "pytorch_model-00001.bin").write_bytes(b"m" * 1000)
        (Path(path) / "pytorch_model.bin.index.json").write_text("{}")

    def save_optimizer(self, optimizer: Any, path: str, shard: bool) -> None:
        Path(path).mkdir()
        (Path(path) / "pytorch_optim-00001.bin").write_bytes(b"o" * 2000)

    def save_lr_scheduler(self, scheduler: Any, path: str) -> None:
        Path(path).write_bytes(b"s")


def test_every_file_and_folder_is_fsynced_before_the_rename_and_the_parent_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, Path]] = []
    real_fsync, real_replace = checkpoint.fsync_path, checkpoint.os.replace

    def fsync(path: Path) -> None:
        calls.append(("fsync", Path(path)))
        real_fsync(path)

    def replace(src: Any, dst: Any) -> None:
        calls.append(("replace", Path(src)))
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint, "fsync_path", fsync)
    monkeypatch.setattr(checkpoint.os, "replace", replace)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        cfg = lm.merge_config({"plugin": "torch_ddp", "keep_ckpts": 2})
        ck = checkpoint.Checkpointer(FakeBooster(), None, None, None, tmp_path / "ckpt", cfg, 1)
        final = ck.save(checkpoint.TrainState(step=3))
    finally:
        dist.destroy_process_group()
    tmp = tmp_path / "ckpt" / ".tmp_step_00000003"
    assert checkpoint.verify(final) is None
    at = calls.index(("replace", tmp))
    before = {p for kind, p in calls[:at] if kind == "fsync"}
    written = {tmp / rel for rel in (*checkpoint.data_files(final), checkpoint.META)}
    folders = {tmp, tmp / checkpoint.MODEL, tmp / checkpoint.OPTIMIZER, tmp / checkpoint.RANKS}
    assert written | folders <= before, sorted(written | folders - before)
    assert ("fsync", tmp_path / "ckpt") in calls[at + 1 :]
    assert set(ck.save_cost) == {"fsync_s", "manifest_s", "verify_s"}
