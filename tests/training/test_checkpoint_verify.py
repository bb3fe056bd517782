"""Verified checkpoints (issue 38): a manifest of sizes and sha256 at save, fsync before the rename, verification at
resume (a damaged checkpoint is skipped, named, and the previous one used), pruning that counts verified ones only,
and the cost of both in the metrics events."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import background_save
import checkpoint
import lm
import pytest
import torch.distributed as dist

from tests.helpers import REPO, complete_lines, load_script, wait_for

from .helpers import (
    ENV,
    HANG_S,
    SCRIPTS,
    TINY,
    assert_same_final_model,
    checkpoint_bytes,
    events,
    records,
    step_dir,
    torchrun_argv,
    train,
    train_argv,
    truncate,
)

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
def straight_sync(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """The straight run with synchronous saves (ckpt_async false): today's save, for comparison."""
    out = tmp_path_factory.mktemp("straight_sync")
    train(out, data_dir, {**CFG, "ckpt_async": False})
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
        assert meta["step"] == step  # the state of the save, whenever its second half wrote it
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


COSTS = ("fsync_s", "manifest_s", "verify_s")


def test_the_cost_of_fsync_manifest_and_verification_is_in_every_checkpoint_written_event(stopped: Path) -> None:
    """ckpt_async (the default): checkpoint_end closes the stall (the host-memory copy, snapshot_s); the second half's
    cost comes with checkpoint_written, said inside the next save's stall, or the last save's own (stop_after)."""
    marks = [(e["event"], e["step"]) for e in events(stopped / "metrics.jsonl")]
    assert marks == [
        ("checkpoint_begin", 2), ("checkpoint_end", 2),
        ("checkpoint_begin", 4), ("checkpoint_written", 2), ("checkpoint_end", 4),
        ("checkpoint_begin", 6), ("checkpoint_written", 4), ("checkpoint_written", 6), ("checkpoint_end", 6),
    ]  # fmt: skip
    for e in events(stopped / "metrics.jsonl"):
        if e["event"] == "checkpoint_end":
            assert isinstance(e["snapshot_s"], float) and e["snapshot_s"] > 0 and not set(COSTS) & set(e), e
        if e["event"] == "checkpoint_written":
            assert all(isinstance(e[k], float) and e[k] > 0 for k in (*COSTS, "write_s", "background_s")), e
            assert e["background_s"] >= e["write_s"] + sum(e[k] for k in COSTS) * 0.99, e  # the parts of the whole
            assert isinstance(e["waited_s"], float) and e["waited_s"] >= 0, e


@pytest.mark.slow
def test_synchronous_saves_write_the_same_files_and_say_their_cost_in_checkpoint_end(
    straight: Path, straight_sync: Path
) -> None:
    """The asynchronous save writes what the synchronous one writes, byte for byte: every checkpoint's manifest (sizes
    and sha256 of every file but trainer.json) is the same, and so is the final model."""
    for step in (4, 6, 8):  # keep_ckpts 3
        files = [json.loads((step_dir(run, step) / checkpoint.META).read_text())[checkpoint.FILES]
                 for run in (straight, straight_sync)]  # fmt: skip
        assert files[0] == files[1], step
    assert_same_final_model(straight, straight_sync)
    marks = [(e["event"], e["step"]) for e in events(straight_sync / "metrics.jsonl")]
    assert marks == [(kind, step) for step in (2, 4, 6, 8) for kind in ("checkpoint_begin", "checkpoint_end")]
    for e in events(straight_sync / "metrics.jsonl"):
        if e["event"] == "checkpoint_end":
            assert all(isinstance(e[k], float) and e[k] > 0 for k in COSTS) and "snapshot_s" not in e, e


@pytest.mark.slow
def test_the_cost_benchmark_summarizes_a_runs_events(stopped: Path, straight_sync: Path) -> None:
    bench = load_script(REPO / "benchmarks" / "checkpoint_cost.py", "checkpoint_cost_under_test")
    recs = records(stopped / "metrics.jsonl")  # async: saves at 2, 4 and 6, the last (stop_after) whole
    summary = bench.summarize(recs, 1000)
    assert summary["ckpt_async"] and summary["checkpoints"] == 3 and summary["checkpoint_bytes"] == 1000
    begin = {e["step"]: e["wall"] for e in recs if e.get("event") == "checkpoint_begin"}
    stall = {e["step"]: e["wall"] - begin[e["step"]] for e in recs if e.get("event") == "checkpoint_end"}
    assert summary["stall_s"]["max"] == round(max(stall[2], stall[4]), 6)  # the launch's last save is apart
    assert summary["final_stall_s"]["max"] == round(stall[6], 6)
    written = [e for e in recs if e.get("event") == "checkpoint_written"]
    assert summary["verify_s"]["max"] == max(e["verify_s"] for e in written)
    assert summary["background_s"]["max"] == max(e["background_s"] for e in written)
    assert 0 < summary["fsync_share_of_save"] < 1 and summary["step_ms"] > 0
    assert "resume" not in summary  # the stopped run started fresh
    sync = bench.summarize(records(straight_sync / "metrics.jsonl"), 1000)  # saves at 2, 4, 6 and 8 (the last)
    assert not sync["ckpt_async"] and sync["checkpoints"] == 4 and "snapshot_s" not in sync
    ends = [e for e in events(straight_sync / "metrics.jsonl") if e["event"] == "checkpoint_end"]
    assert sync["verify_s"]["max"] == max(e["verify_s"] for e in ends)


@pytest.mark.slow
def test_the_cost_benchmark_runs_both_modes_end_to_end_with_its_overrides(tmp_path: Path) -> None:
    """The benchmark's own run (per mode: train to half the steps, then resume to the end), small: what a GPU
    machine runs with a larger model through --set."""
    bench = load_script(REPO / "benchmarks" / "checkpoint_cost.py", "checkpoint_cost_end_to_end")
    out = tmp_path / "result.json"
    argv = ["--nproc", "1", "--ckpt-every", "2", "--num-docs", "40", "--work-dir", str(tmp_path)]
    argv += ["--set", json.dumps({"steps": 8}), "--out", str(out)]
    assert bench.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["config"]["steps"] == 8 and result["ranks"] == 1 and result["machine"]["gpu"] is None
    assert list(result["modes"]) == ["sync", "async"]  # side by side, in this order
    for mode, summary in result["modes"].items():
        assert summary["ckpt_async"] == (mode == "async")
        # steps 2 and 4 (the first launch's last), resumed, 6 and 8 (the second's last)
        assert summary["checkpoints"] == 4 and summary["resume"]["verify_s"] > 0
        assert summary["stall_s"]["max"] > 0 and summary["final_stall_s"]["max"] > 0
    assert result["stall_ratio"] == round(
        result["modes"]["async"]["stall_s"]["mean"] / result["modes"]["sync"]["stall_s"]["mean"], 4
    )
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


PAUSED_WRITE = """
import os, sys, time
sys.path.insert(0, {scripts!r})
import background_save
import train

_write = background_save.Capture.write


def write(self, writing):
    if self.folder.name == {tmp!r} and os.environ["RANK"] == "1":
        with open({paused!r} + ".tmp", "w") as fh:
            fh.write(f"{{os.getpid()}}\\n")
        os.replace({paused!r} + ".tmp", {paused!r})
        while True:  # until the test's SIGKILL
            time.sleep(1)
    return _write(self, writing)


background_save.Capture.write = write
sys.exit(train.main())
"""


@pytest.mark.slow
def test_a_rank_killed_while_its_save_is_written_in_the_background_resumes_from_the_complete_checkpoint_before(
    straight: Path, tmp_path: Path, data_dir: Path
) -> None:
    """ckpt_async: the save of step 4 stalls the training only for its host-memory copy. A wrapper of train.py holds
    rank 1's background writer of step 4 (before its first file) and writes its pid; the training goes on to the next
    save, 6, which waits for step 4's write. Then rank 1 is killed by pid: torchrun ends the run. The next start
    removes step 4's temp folder, naming it, resumes from step 2 (the complete checkpoint before) and ends with the
    straight run's model; the steps after 2 are superseded (lost)."""
    out, paused = tmp_path / "run", tmp_path / "paused"
    tmp = out / "ckpt" / f"{checkpoint.TMP_PREFIX}{4:08d}"
    wrapper = tmp_path / "paused_write.py"
    wrapper.write_text(PAUSED_WRITE.format(scripts=str(SCRIPTS), tmp=tmp.name, paused=str(paused)))
    proc = subprocess.Popen(torchrun_argv(wrapper, *train_argv(out, data_dir, CFG)), env=ENV, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:

        def waiting() -> bool:  # the event: step 4's write held on rank 1, and the next save (6) has begun
            begun = [e["step"] for e in complete_lines(out / "metrics.jsonl") if e.get("event") == "checkpoint_begin"]
            return paused.exists() and 6 in begun

        wait_for(waiting, "step 6's save waiting for step 4's background write", HANG_S)
        recs = complete_lines(out / "metrics.jsonl")
        assert [r["step"] for r in recs if "event" not in r] == [1, 2, 3, 4, 5, 6]  # it trained on meanwhile
        assert [(r["event"], r["step"]) for r in recs if r.get("event") == "checkpoint_end"] == [
            ("checkpoint_end", 2), ("checkpoint_end", 4)]  # fmt: skip
        assert not step_dir(out, 4).exists() and tmp.is_dir() and not (tmp / checkpoint.META).exists()
        os.kill(int(paused.read_text()), signal.SIGKILL)  # the fault
        output, _ = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, output[-3000:]
    assert [s for s, _ in checkpoint.complete_checkpoints(out / "ckpt")] == [2]
    rerun = train(out, data_dir, CFG)
    assert f"checkpoint: removing {tmp}, the temp folder of a save that did not finish" in rerun.stdout
    assert f"resumed from {step_dir(out, 2)} at step 2" in rerun.stdout
    assert [r["step"] for r in events(out / "metrics.jsonl") if r["event"] == "superseded"] == [3, 4, 5, 6]
    assert not tmp.exists()
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


def test_an_asynchronous_save_records_the_state_it_was_given_not_the_trainings_state_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second half writes trainer.json after the training has gone on: it must hold the step, tokens and elapsed
    of the save, not those of the TrainState the training keeps changing (the second half is held until then)."""
    go = threading.Event()
    real_write = background_save.Capture.write

    def held(capture: Any, writing: Any) -> None:
        assert go.wait(HANG_S)
        real_write(capture, writing)

    monkeypatch.setattr(background_save.Capture, "write", held)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        cfg = lm.merge_config({"plugin": "torch_ddp", "keep_ckpts": 2})
        ck = checkpoint.Checkpointer(FakeBooster(), None, None, None, tmp_path / "ckpt", cfg, 1)
        state = checkpoint.TrainState(step=3, tokens=30, elapsed=1.5)
        final = ck.save(state)
        state.step, state.tokens, state.elapsed = 4, 40, 2.0  # the training's next step
        go.set()
        ck.wait()
    finally:
        dist.destroy_process_group()
    meta = json.loads((final / checkpoint.META).read_text())
    assert (meta["step"], meta["tokens"], meta["elapsed"]) == (3, 30, 1.5)


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


@pytest.mark.parametrize("asynchronous", [True, False], ids=["async", "sync"])
def test_every_file_and_folder_is_fsynced_before_the_rename_and_the_parent_after_it(
    asynchronous: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
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
        cfg = lm.merge_config({"plugin": "torch_ddp", "keep_ckpts": 2, "ckpt_async": asynchronous})
        ck = checkpoint.Checkpointer(FakeBooster(), None, None, None, tmp_path / "ckpt", cfg, 1)
        final = ck.save(checkpoint.TrainState(step=3))
        done = ck.wait()
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
    if asynchronous:
        assert set(ck.save_cost) == {"snapshot_s"} and done is not None
        assert set(done.cost) == {"write_s", "fsync_s", "manifest_s", "verify_s", "background_s", "waited_s"}
    else:
        assert set(ck.save_cost) == {"fsync_s", "manifest_s", "verify_s"} and done is None
