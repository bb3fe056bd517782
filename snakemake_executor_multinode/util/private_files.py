"""Files the plugin writes for a later reader (a status cycle, another run, a job): whole or not at all, and
readable by the owner only (job scripts carry profile values such as tokens; records name hosts and commands).

A write that fails is a StateWriteError naming the file; on a full disk (ENOSPC, or EDQUOT: a spent quota) also the
bytes it needed and the bytes free there (os.statvfs: f_bavail, what an unprivileged writer may use). It is an
OSError with the cause's errno, so code that handled a failed write before handles this one."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

SPACE_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}


def free_bytes(path: Path) -> int | None:
    """Bytes free for an unprivileged writer on the filesystem of `path` (its nearest existing folder); None where
    statvfs fails."""
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def no_space(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in SPACE_ERRNOS


class StateWriteError(OSError):
    """A file of the plugin's state that could not be written (`what` says what it holds)."""

    def __init__(self, path: Path, cause: OSError, needed: int, what: str = "the file") -> None:
        super().__init__(cause.errno, cause.strerror)
        self.path, self.needed = path, needed
        self.full = no_space(cause)
        self.free = free_bytes(path.parent) if self.full else None
        if self.full:
            free = "an unknown number of" if self.free is None else str(self.free)
            self.message = (
                f"cannot write {path}: {SPACE_ERRNOS[cause.errno or 0]}; {needed} bytes needed ({what}), {free} bytes "
                f"free in {path.parent}"
            )
        else:
            self.message = f"cannot write {path}: {cause.strerror or cause}"

    def __str__(self) -> str:
        return self.message


def state_write_error(path: Path, err: OSError, needed: int, what: str = "the file") -> StateWriteError:
    """`err` as a StateWriteError naming `path` (one already is: kept)."""
    return err if isinstance(err, StateWriteError) else StateWriteError(path, err, needed, what)


def write_private(path: Path, text: str) -> None:
    """Write under a temporary name of this writer's own (two runs may write one file), then rename: a reader sees
    the old file or the new one, never half of one. A failure leaves the old file and no temporary one, and is a
    StateWriteError."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as err:
        raise state_write_error(path, err, len(text.encode())) from err
