"""The training's metrics file ($MULTINODE_METRICS_FILE) as the launcher reads it while a step runs: only the lines
written since the launch began, whole lines only. The straggler check (busy times) and the stall watchdog (the
training's pace) read it, each with a tail of its own; the watchdog also tails the node files this way, until the
training's first line (stall.LaunchStart)."""

from __future__ import annotations

import os
from pathlib import Path


class MetricsTail:
    """New complete lines of the metrics file, read from where the last call stopped. A file replaced or cut shorter
    (a resumed training rewrites it, keeping the old lines) is read again from its start: the caller tells this
    launch's lines by their time."""

    def __init__(self, path: Path | None) -> None:
        self.path, self.partial = path, b""
        self.offset, self.inode = size(path), _inode(path)

    def lines(self) -> list[str]:
        if self.path is None:
            return []
        try:
            with open(self.path, "rb") as fh:
                inode, end = os.fstat(fh.fileno()).st_ino, fh.seek(0, 2)
                if inode != self.inode or end < self.offset:
                    self.inode, self.offset, self.partial = inode, 0, b""
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        self.offset += len(data)
        *done, self.partial = (self.partial + data).split(b"\n")
        return [raw.decode(errors="replace") for raw in done]


def size(path: Path | None) -> int:
    """A file's size now; 0 for none, or one that cannot be read (it is read from its start once it can)."""
    try:
        return path.stat().st_size if path else 0
    except OSError:
        return 0


def _inode(path: Path | None) -> int:
    try:
        return path.stat().st_ino if path else 0
    except OSError:
        return 0
