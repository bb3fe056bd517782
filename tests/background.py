"""Snakemake in the background for cluster tests: a reader thread collects its output line by line, so a test waits
for a line as an event (never for a duration), and `stop()` (Ctrl-C: Snakemake cancels its jobs) leaves nothing
running on the shared cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_for(check: Callable[[], T], what: str, timeout: float = 180, interval: float = 0.2) -> T:
    """Poll until `check()` gives something true and return it; the timeout only stops a hang."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(interval)
    return found


class Snakemake:
    """`snakemake --executor multinode` in the background; a reader thread collects its output line by line (and
    copies it to <tmp>/snakemake-<n>.out) so that the test can wait for a line as an event."""

    count = 0

    def __init__(self, workdir: Path, *args: str, jobs: int = 1, command: Sequence[str] | None = None) -> None:
        """`command` replaces `snakemake --executor multinode --jobs J --latency-wait 5` (a workflow profile's run)."""
        Snakemake.count += 1
        self.workdir = workdir
        self.copy = workdir.parent / f"snakemake-{Snakemake.count}.out"
        base = [
            sys.executable,
            "-m",
            "snakemake",
            "--executor",
            "multinode",
            "--jobs",
            str(jobs),
            "--latency-wait",
            "5",
        ]
        self.proc = subprocess.Popen(
            [*(command if command is not None else base), *args],
            cwd=workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=os.environ | {"PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[tuple[float, str]] = []  # (time.monotonic() when read, line)
        self._eof = False
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.copy.open("w") as copy:
            for line in self.proc.stdout:
                copy.write(line)
                copy.flush()
                with self._changed:
                    self.lines.append((time.monotonic(), line.rstrip("\n")))
                    self._changed.notify_all()
        with self._changed:
            self._eof = True
            self._changed.notify_all()

    @property
    def text(self) -> str:
        with self._changed:
            return "\n".join(line for _, line in self.lines)

    def matching(self, *words: str) -> list[tuple[float, str]]:
        with self._changed:
            return [(t, line) for t, line in self.lines if all(w in line for w in words)]

    def wait_line(self, *words: str, timeout: float = 180) -> tuple[float, str]:
        """The first output line that contains every word, and when the reader got it."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for t, line in self.lines:
                    if all(w in line for w in words):
                        return t, line
                if self._eof:
                    self.proc.wait()
                    raise AssertionError(
                        f"snakemake ended (exit {self.proc.returncode}) without a line with {words}:\n{self.text}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no line with {words} within {timeout:.0f} s:\n{self.text}")
                self._changed.wait(min(left, 1.0))

    def wait(self, timeout: float = 300) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as err:
            raise AssertionError(f"snakemake still running after {timeout:.0f} s:\n{self.text}") from err
        self._reader.join(timeout=30)
        return rc

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Ctrl-C if still running (Snakemake cancels its jobs), then make sure it is gone."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=30)


@contextmanager
def background(workdir: Path, *args: str, **kw) -> Iterator[Snakemake]:
    """Snakemake in the background for the block; stopped (Ctrl-C) if the block leaves it running."""
    sm = Snakemake(workdir, *args, **kw)
    try:
        yield sm
    finally:
        sm.stop()


@contextmanager
def cpu_saturated(extra: int = 1) -> Iterator[list[int]]:
    """One busy loop per core plus `extra`, for the block (a shared login node or CI runner); stopped by pid."""
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range((os.cpu_count() or 1) + extra)
    ]
    try:
        yield [p.pid for p in loops]
    finally:
        for p in loops:
            p.kill()
            p.wait()
