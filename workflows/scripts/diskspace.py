"""A write that fails (a full disk above all) ends the training on every rank at once, with one message.

A checkpoint or a metrics line that cannot be written is said with the figures that matter: the path, the bytes the
write needed and the bytes free there (os.statvfs: f_bavail, what an unprivileged writer may use). ENOSPC (no space
left on device) and EDQUOT (disk quota exceeded) are full disks. torch.save's zip writer reports a failed write as a
RuntimeError without an errno ("unexpected pos ...", "PytorchStreamWriter failed writing file ..."): such an error
counts as a full disk where the filesystem had less than FULL_BELOW bytes free right after it.

Every rank must fail together, never hang in a collective that a failed rank will not join: `failures` (all ranks call
it at the same point, in place of a barrier) is one max all-reduce of an ok flag and, only when some rank failed, an
all-gather of what failed. A rank with a failure of its own waits at most AGREE_WAIT_S for the others: one of them may
be inside a collective of the plugin's own save (ZeRO and gemini gather while rank 0 writes) that waits for this
rank's part, which never comes. Past that it leaves alone (WriteFailed with agreed False); its exit makes torchrun,
and srun on the other nodes, end the rest.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
from pathlib import Path
from typing import Any

SPACE_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}
FULL_BELOW = 64 << 20  # bytes: a filesystem with less free right after a failed write of torch's is full
TORCH_WRITE_FAILURES = ("unexpected pos", "PytorchStreamWriter failed", "file write failed")
AGREE_WAIT_S = 60.0


class WriteFailed(Exception):
    """A write that failed; the message is the whole story (path, bytes needed and free). `agreed`: every rank raised
    it together (False: this rank leaves alone, the others may be inside a collective)."""

    def __init__(self, message: str, agreed: bool = True) -> None:
        super().__init__(message)
        self.agreed = agreed


def free_bytes(path: str | Path) -> int | None:
    """Bytes free for an unprivileged writer on the filesystem of `path` (its nearest existing folder); None where
    statvfs fails. (The plugin's util/private_files.py has its own: these scripts also run where the plugin is not
    installed, a container image.)"""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def space_errno(err: BaseException | None) -> int | None:
    """ENOSPC or EDQUOT where the error or one it was raised from carries it; None otherwise."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in SPACE_ERRNOS:
            return err.errno
        err = err.__cause__ or err.__context__
    return None


def disk_full(err: BaseException, free_after: int | None) -> bool:
    """The error is a full disk: an ENOSPC/EDQUOT, or torch's writer failing with less than FULL_BELOW bytes left."""
    if space_errno(err) is not None:
        return True
    torch_writer = isinstance(err, RuntimeError) and any(s in str(err) for s in TORCH_WRITE_FAILURES)
    return torch_writer and free_after is not None and free_after < FULL_BELOW


def reason(err: BaseException, full: bool) -> str:
    """What went wrong, in words: the full disk's name, or the error itself."""
    if full:
        code = space_errno(err)
        if code is not None:
            return SPACE_ERRNOS[code]
        # "[enforce fail at inline_container.cc:672] . unexpected pos 268416 vs 268308": torch's words, not its place
        return f"no space left on device (torch.save: {str(err).rsplit('] ', 1)[-1].lstrip('. ')})"
    if isinstance(err, OSError) and err.strerror:
        return f"{err.strerror}" + (f" ({err.filename})" if err.filename else "")
    return f"{type(err).__name__}: {err}"


def cannot_write(what: str, err: BaseException, needed: int, needed_how: str, where: Path) -> str:
    """The message of a write that failed: `what` (e.g. "the metrics file <path>"), why, and for a full disk the bytes
    it needed (`needed_how` says how that was counted) and the bytes free in `where`."""
    free = free_bytes(where)
    full = disk_full(err, free)
    message = f"cannot write {what}: {reason(err, full)}"
    if full:
        message += f"; {needed} bytes needed ({needed_how}), {_figure(free)} bytes free in {where}"
    return message


def replace_file(path: Path, text: str, what: str, needed_how: str) -> str | None:
    """Write `text` beside `path` and rename it there (a reader sees the old file or the new one). A write that
    fails leaves the old file and no temp file, and is said (cannot_write: `what` names the file); None: written."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        return cannot_write(f"{what} {path}", err, len(text.encode()), needed_how, path.parent)
    return None


def _figure(value: int | None) -> str:
    return "an unknown number of" if value is None else str(value)


def failures(group: Any, world: int, mine: Any | None) -> list[Any]:
    """Every rank calls this at the same point: what failed on every rank (each rank's `mine`, in rank order, those
    that are not None), [] where nothing did. Also a barrier. With a failure of its own a rank waits at most
    AGREE_WAIT_S for the others, then raises WriteFailed(str(mine), agreed=False) (module docstring)."""
    if world == 1:
        return [] if mine is None else [mine]
    import torch
    import torch.distributed as dist

    flag = torch.tensor([0 if mine is None else 1], dtype=torch.int32)
    work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group, async_op=True)
    if mine is None:
        work.wait()
    else:
        try:
            work.wait(timeout=datetime.timedelta(seconds=AGREE_WAIT_S))
        except RuntimeError as err:  # gloo: "Operation timed out!"
            raise WriteFailed(str(mine), agreed=False) from err
    if not flag.item():
        return []
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine, group=group)
    return [g for g in gathered if g is not None]


def agree(group: Any, world: int, mine: str | None) -> None:
    """`failures` for a write one rank makes (rank 0's metrics lines): every rank raises WriteFailed with the first
    failure's message, or none does."""
    failed = failures(group, world, mine)
    if failed:
        raise WriteFailed(str(failed[0]))
