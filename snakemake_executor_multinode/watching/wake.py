"""A status cycle that starts when a job's exit marker lands, not at the next tick of the cycle's clock.

The state folder is watched with Linux's inotify (libc through ctypes: no dependency); a marker that a job renames
into place, or writes and closes, ends the wait between two cycles at once. A wake only starts a cycle early: what
ended, and how, is still read from the markers (job_status.py), so nothing depends on the wake. Where there is no
inotify (another system, no watch left) or the folder's writes come from another host (NFS and its kind tell only the
host that wrote), the cycle comes on its clock as before. `poke()` ends the wait from another thread (the run's end).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import struct
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from snakemake_executor_multinode.contract.jobfiles import EXIT_MARKER, REQUEUE_MARKER

IN_CLOSE_WRITE, IN_MOVED_TO = 0x00000008, 0x00000080
IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name
NEWS = (EXIT_MARKER, REQUEUE_MARKER)  # markers whose arrival is news for the status cycle
MIN_GAP_S = 0.05  # a burst of markers (a job array's elements ending together) is read by one cycle


def _inotify(folder: Path) -> int | None:
    """An inotify descriptor watching `folder` for files renamed into it or closed after writing; None where the
    system has no inotify or refuses the watch."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols (libc among them): no ldconfig run
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    except (OSError, AttributeError):  # no inotify here
        return None
    if fd < 0:
        return None
    if libc.inotify_add_watch(fd, os.fsencode(folder), IN_CLOSE_WRITE | IN_MOVED_TO) < 0:
        os.close(fd)
        return None
    return fd


def names(data: bytes) -> Iterable[str]:
    """The file names of a read of inotify events."""
    at = 0
    while at + _EVENT.size <= len(data):
        _, _, _, length = _EVENT.unpack_from(data, at)
        raw = data[at + _EVENT.size : at + _EVENT.size + length]
        yield os.fsdecode(raw.rstrip(b"\0"))
        at += _EVENT.size + length


class Wake:
    """What ends the wait between two status cycles early: a marker of news in the state folder, or `poke()`."""

    def __init__(self, folder: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.folder = folder
        self.clock = clock
        self._watch: int | None = None
        self._poke_r: int | None = None
        self._poke_w: int | None = None
        self._closed = False
        self._last: float | None = None  # when the last wait ended: the last cycle's start

    def _open(self) -> None:
        """The watch and the poke pipe, at the first wait: a session that never waits (a test, `multinode check`)
        holds no descriptor."""
        if self._poke_r is None and not self._closed:
            self._watch = _inotify(self.folder)
            self._poke_r, self._poke_w = os.pipe()
            os.set_blocking(self._poke_r, False)

    @property
    def watching(self) -> bool:
        self._open()
        return self._watch is not None

    def poke(self) -> None:
        """End the current wait now (from any thread); nothing where no wait has begun."""
        if not self._closed and self._poke_w is not None:
            os.write(self._poke_w, b"x")

    def _read(self) -> bool:
        """Drain what is pending; whether a marker of news or a poke came."""
        news = False
        while self._watch is not None:
            try:
                data = os.read(self._watch, 65536)
            except BlockingIOError:
                break
            news = news or any(name.endswith(NEWS) for name in names(data))
        try:
            while self._poke_r is not None and os.read(self._poke_r, 4096):
                news = True
        except BlockingIOError:
            pass
        return news

    async def wait(self, seconds: float) -> None:
        """Wait `seconds`, or less: until a marker of news lands (or has landed since the last wait) or `poke()`
        is called, but never less than MIN_GAP_S after the last wait ended."""
        self._open()
        loop = asyncio.get_running_loop()
        deadline = self.clock() + seconds
        woke = asyncio.Event()
        fds = [fd for fd in (self._watch, self._poke_r) if fd is not None]
        for fd in fds:
            loop.add_reader(fd, woke.set)
        try:
            while (left := deadline - self.clock()) > 0:
                woke.clear()
                if self._read():
                    since = self.clock() - self._last if self._last is not None else MIN_GAP_S
                    await asyncio.sleep(max(0.0, min(MIN_GAP_S - since, left)))
                    break
                try:
                    await asyncio.wait_for(woke.wait(), left)
                except TimeoutError:
                    break
        finally:
            for fd in fds:
                loop.remove_reader(fd)
            self._last = self.clock()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for fd in (self._watch, self._poke_r, self._poke_w):
            if fd is not None:
                os.close(fd)
        self._watch = self._poke_r = self._poke_w = None
