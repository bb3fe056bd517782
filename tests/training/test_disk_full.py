"""A full disk under the training (issue 38, part 3): a checkpoint or a metrics line that does not fit fails the
training on every rank at once with one message naming the path, the bytes needed and the bytes free; the previous
checkpoint and the metrics file's whole lines stay. Small filesystems are tmpfs mounts the tests make and remove
(root); the 2-rank cases are two processes on gloo with a fake Booster (save_ranks.py). The same on the real cluster,
through train.py and Snakemake: tests/cluster/test_disk_full_cluster.py."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import checkpoint
import diskspace
import lm
import pytest
import torch
import torch.distributed as dist
import train

from tests.helpers import fill, needs_root, resize, small_filesystem, wait_for

from .helpers import ENV

NEEDED = re.compile(r"(?:at least )?(\d+) bytes needed \(([^)]*)\), (\d+) bytes free in ([^;\s]+)")


def enospc(path: str = "") -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path or None)


def test_a_full_disk_is_told_apart_from_other_failures_and_said_by_its_name() -> None:
    assert diskspace.disk_full(enospc("/x"), None) and diskspace.reason(enospc(), True) == "no space left on device"
    quota = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
    assert diskspace.disk_full(quota, 10**12) and diskspace.reason(quota, True) == "disk quota exceeded"
    # torch.save's zip writer loses the errno: a full disk where almost nothing is left right after it
    torch_full = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    assert diskspace.disk_full(torch_full, 0) and not diskspace.disk_full(torch_full, 10**12)
    assert diskspace.reason(torch_full, True) == "no space left on device (torch.save: unexpected pos 576 vs 534)"
    try:  # a full disk under another error (a library's own wrapper)
        try:
            raise enospc("/x/y")
        except OSError as inner:
            raise RuntimeError("save failed") from inner
    except RuntimeError as outer:
        assert diskspace.disk_full(outer, None)
    denied = PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/x/y")
    assert not diskspace.disk_full(denied, 0) and diskspace.reason(denied, False) == "Permission denied (/x/y)"
    message = diskspace.cannot_write("the metrics file /m/x.jsonl", enospc(), 312, "the line", Path("/"))
    assert NEEDED.search(message) and message.startswith("cannot write the metrics file /m/x.jsonl: no space left")
    assert diskspace.cannot_write("f", denied, 3, "the line", Path("/")) == "cannot write f: Permission denied (/x/y)"


def test_a_metrics_line_that_does_not_fit_is_cut_off_again_and_said_with_the_bytes_needed_and_free(
    tmp_path: Path,
) -> None:
    needs_root()
    with small_filesystem(tmp_path / "fs", 64 << 10) as fs:
        metrics = fs / "metrics.jsonl"
        assert train.append_metrics(str(metrics), {"step": 1, "loss": 3.0}) is None
        fill(fs)
        line = {"step": 2, "loss": 2.5, "pad": "x" * 5000}  # more than the first page has left
        message = train.append_metrics(str(metrics), line)
        assert message is not None and message.startswith(f"cannot write the metrics file {metrics}: no space left")
        needed, how, free, where = NEEDED.search(message).groups()  # type: ignore[union-attr]
        assert (int(needed), how, where) == (len(json.dumps(line)) + 1, "the line", str(fs))
        assert int(free) < int(needed)
        assert metrics.read_text() == json.dumps({"step": 1, "loss": 3.0}) + "\n"  # whole lines only


class FakeBooster:
    """The Booster's sharded save, each file through torch.save (torch's own writer: its errors lose the errno)."""

    def save_model(self, model: Any, path: str, shard: bool) -> None:
        Path(path).mkdir()
        torch.save({"w": torch.ones(8192)}, Path(path) / "pytorch_model-00001.bin")

    def save_optimizer(self, optimizer: Any, path: str, shard: bool) -> None:
        Path(path).mkdir()
        torch.save({"m": torch.ones(16384)}, Path(path) / "pytorch_optim-00001.bin")

    def save_lr_scheduler(self, scheduler: Any, path: str) -> None:
        torch.save({}, path)


@contextmanager
def one_rank(tmp_path: Path) -> Iterator[None]:
    """A gloo process group of this process alone, for the block."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def one_rank_checkpointer(root: Path, asynchronous: bool) -> checkpoint.Checkpointer:
    cfg = lm.merge_config({"plugin": "torch_ddp", "keep_ckpts": 1, "ckpt_async": asynchronous})
    return checkpoint.Checkpointer(FakeBooster(), None, None, None, root, cfg, 1)


def save(ck: checkpoint.Checkpointer, step: int) -> Path:
    """A save, whole: an asynchronous one's second half waited for (its failure raises from the wait, as the next
    save or the exit raises it in train.py)."""
    final = ck.save(checkpoint.TrainState(step=step))
    ck.wait()
    return final


# The same failure, the same message: in the save (sync), or in its second half, raised by the wait (async), where
# the file being written is known by name (the sync save knows the folder the plugin's IO was writing).
MODES = pytest.mark.parametrize("asynchronous", [True, False], ids=["async", "sync"])
WRITING = {True: "optimizer/pytorch_optim-00001.bin", False: "optimizer/"}


@MODES
def test_a_checkpoint_that_does_not_fit_fails_naming_it_with_the_bytes_needed_and_free_and_the_previous_stays(
    asynchronous: bool, tmp_path: Path
) -> None:
    """One process: the first checkpoint fits; the filesystem is then shrunk to hold it and half another (as a
    keep_ckpts 1 run needs room for two: the old one stays until the new one verifies), and the second save fails
    inside torch.save, whose error carries no errno."""
    needs_root()
    with one_rank(tmp_path), small_filesystem(tmp_path / "ckpt", 4 << 20) as root:
        ck = one_rank_checkpointer(root, asynchronous)
        first = save(ck, 1)
        size = checkpoint.tree_bytes(first)
        st = os.statvfs(root)
        resize(root, (st.f_blocks - st.f_bfree) * st.f_frsize + size // 2)
        final = ck.save(checkpoint.TrainState(step=2)) if asynchronous else None  # only copied: nothing fails yet
        with pytest.raises(diskspace.WriteFailed) as failed:
            ck.wait() if asynchronous else ck.save(checkpoint.TrainState(step=2))
        assert final is None or not final.exists()
        message = str(failed.value)
        assert failed.value.agreed
        assert message.startswith(
            f"cannot save checkpoint {root / 'step_00000002'}: no space left on device (torch.save: "
        ), message
        assert f"(rank 0, writing {WRITING[asynchronous]})" in message  # the model's shard fitted
        needed, how, free, where = NEEDED.search(message).groups()  # type: ignore[union-attr]
        assert (int(needed), how, where) == (size, "the size of the previous checkpoint, step_00000001", str(root))
        assert 0 < int(free) < size
        assert message.endswith(f"the partial save was removed; the previous checkpoint {first} is kept")
        assert sorted(p.name for p in root.iterdir()) == ["step_00000001"]  # no temp dir left taking space
        assert checkpoint.verify(first) is None


@MODES
def test_a_first_checkpoint_that_does_not_fit_says_at_least_what_was_written(
    asynchronous: bool, tmp_path: Path
) -> None:
    needs_root()
    with one_rank(tmp_path), small_filesystem(tmp_path / "ckpt", 48 << 10) as root:
        ck = one_rank_checkpointer(root, asynchronous)
        with pytest.raises(diskspace.WriteFailed) as failed:
            save(ck, 1)
        message = str(failed.value)
        assert "at least" in message and "(written before it failed; no earlier checkpoint to size it)" in message
        assert message.endswith("the partial save was removed; there is no earlier checkpoint"), message
        assert list(root.iterdir()) == []


def run_ranks(
    tmp_path: Path, fault: str, wait_for_rank1: bool, mode: str = "sync"
) -> tuple[list[Any], list[subprocess.Popen]]:
    """save_ranks.py as ranks 0 and 1: each rank's result (None: not written) once rank 0's is, and rank 1's if
    waited for."""
    script = Path(__file__).with_name("save_ranks.py")
    result = tmp_path / "result"
    init, ckpt = str(tmp_path / "init"), str(tmp_path / "ckpt")
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), init, ckpt, fault, mode, str(result)],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for r in (0, 1)
    ]
    files = [Path(f"{result}.rank{r}.json") for r in (0, 1)]
    for r in (0, 1) if wait_for_rank1 else (0,):
        wait_for(lambda r=r: files[r].exists() or procs[r].poll() is not None, f"rank {r}'s result", 300)
        assert files[r].exists(), procs[r].communicate()[0]
    return [json.loads(f.read_text()) if f.exists() else None for f in files], procs


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_one_ranks_full_disk_fails_the_save_on_every_rank_at_once_with_one_message(mode: str, tmp_path: Path) -> None:
    """Rank 1's own file of step 2 does not fit; rank 0 wrote its part and waits at the phase's agreement (where a
    barrier would have waited for a rank that never came): both raise the same message, rank 0 removed the temp dir.
    async: the file fails in the save's second half, beside the training; both ranks raise it from the wait (the next
    save's, or the exit's)."""
    results, procs = run_ranks(tmp_path, "rank1_full", wait_for_rank1=True, mode=mode)
    try:
        assert results[0] is not None and results[1] is not None, results
        # agreed on both: neither waited out the agreement (AGREE_WAIT_S) for the other
        assert results[0]["message"] == results[1]["message"] and results[0]["agreed"] and results[1]["agreed"]
        message = results[0]["message"]
        ckpt = tmp_path / "ckpt"
        assert message.startswith(
            f"cannot save checkpoint {ckpt / 'step_00000002'}: no space left on device (rank 1, writing "
            "ranks/rank00001.pt)"
        ), message
        assert NEEDED.search(message).group(2) == "the size of the previous checkpoint, step_00000001"  # type: ignore[union-attr]
        assert sorted(p.name for p in ckpt.iterdir()) == ["step_00000001"]
    finally:
        stop(procs)


def test_a_rank_whose_peers_wait_in_a_collective_of_the_plugins_save_leaves_alone_after_the_wait(
    tmp_path: Path,
) -> None:
    """Rank 0's shard does not fit while rank 1 waits inside the plugin's save for rank 0 (a gather): rank 0 waits
    AGREE_WAIT_S (3 s here) at the agreement, then raises alone (agreed False), having removed the temp dir; its
    exit is what ends rank 1 under torchrun (here its collective fails once rank 0 is gone, or the test ends it)."""
    started = time.monotonic()
    results, procs = run_ranks(tmp_path, "rank0_alone", wait_for_rank1=False)
    try:
        assert results[0] is not None, results
        assert results[0]["agreed"] is False and results[0]["seconds"] >= 3, results  # it waited out AGREE_WAIT_S
        assert results[0]["message"].startswith(
            f"cannot save checkpoint {tmp_path / 'ckpt' / 'step_00000002'}: no space left on device (rank 0, writing "
            "model/pytorch_model-00001.bin)"
        ), results
        assert not (tmp_path / "ckpt" / ".tmp_step_00000002").exists()
        assert time.monotonic() - started < 300
    finally:
        stop(procs)


def test_a_preempt_file_that_cannot_be_written_is_an_error_naming_it_not_a_silent_exit_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the file the job script would not requeue, and the job would end "successfully" at a checkpoint: the
    training fails instead, naming the file (here its folder is a file; a full disk says the bytes as well)."""
    (tmp_path / "state").write_text("")
    monkeypatch.setenv("MULTINODE_PREEMPT_FILE", str(tmp_path / "state" / "42.preempted"))
    with pytest.raises(diskspace.WriteFailed) as failed:
        train.write_preempt_file(5)
    assert str(failed.value) == (
        f"cannot write the preempt file {tmp_path / 'state' / '42.preempted'}: File exists "
        f"({tmp_path / 'state'}); checkpointed step 5, but the job is not requeued"
    )
