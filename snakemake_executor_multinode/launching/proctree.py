"""This node's processes as /proc shows them: whose child each is, and what a process's environment says. The
labeller reads the ranks torchrun gave its workers there, and the progress watchdog finds the workers whose stacks it
takes."""

from __future__ import annotations

import os
from pathlib import Path

Environ = dict[bytes, bytes]


def children() -> dict[int, list[int]]:
    """Every process's children, from one pass over /proc (ppid is the 4th field of /proc/<pid>/stat)."""
    found: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                ppid = int(Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            found.setdefault(ppid, []).append(int(entry.name))
    return found


def environ(pid: int) -> Environ:
    """The environment a process started with (OSError: gone, or not ours to read)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(kv.split(b"=", 1) for kv in raw.split(b"\0") if b"=" in kv)


def descendants(top: int) -> list[int]:
    """Every process below `top`, parents before their children (one pass over /proc)."""
    tree, found, todo = children(), [], [top]
    while todo:
        for pid in tree.get(todo.pop(0), []):
            found.append(pid)
            todo.append(pid)
    return found
