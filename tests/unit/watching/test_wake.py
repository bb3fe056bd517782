"""The wait between two status cycles ends when a job's exit marker lands or the run ends (watching/wake.py), not when
its seconds are up; without inotify it is the plain wait it was. Every wait here is given an hour: a wake that does
not come would hang until the test's own hang guard (HANG_S) fails it."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import EXIT_MARKER, REQUEUE_MARKER, STALL_MARKER, marker
from snakemake_executor_multinode.watching import wake as wake_module
from snakemake_executor_multinode.watching.wake import Wake

HOUR = 3600.0
HANG_S = 60.0  # only stops a hang: a wake that works ends the hour's wait at once


def wait(w: Wake, seconds: float = HOUR) -> None:
    async def run() -> None:
        await asyncio.wait_for(w.wait(seconds), HANG_S)

    asyncio.run(run())


def land(state: Path, job: str, suffix: str = EXIT_MARKER) -> None:
    """As the job script writes its marker: a temporary file, then renamed into place."""
    path = marker(state, job, suffix)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"0 0 mn-{job}\n")
    os.replace(tmp, path)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    folder = tmp_path / "state"
    folder.mkdir()
    return folder


def test_an_exit_marker_that_lands_ends_the_wait(state):
    w = Wake(state)
    assert w.watching
    threading.Timer(0.2, land, (state, "42")).start()
    wait(w)
    w.close()


def test_a_marker_that_landed_during_the_cycle_ends_the_next_wait(state):
    w = Wake(state)
    assert w.watching  # as after the run's first wait
    land(state, "42")  # while no wait runs: the cycle about to start may not have seen it
    wait(w)
    w.close()


def test_only_exit_and_requeue_markers_are_news(state):
    w = Wake(state)
    assert w.watching
    (state / "42.exit.tmp").write_text("0 0 x\n")  # the marker's temporary name, before its rename
    marker(state, "42", STALL_MARKER).write_text("stalled\n")
    (state / "unrelated.txt").write_text("x")
    assert not w._read()
    land(state, "42", REQUEUE_MARKER)
    assert w._read()
    land(state, "43")
    assert w._read()
    assert not w._read()  # read once
    w.close()


def test_poke_ends_the_wait_from_another_thread(state):
    w = Wake(state)
    assert w.watching  # opened (a session opens it at its first wait; one that never waits holds no descriptor)
    threading.Timer(0.2, w.poke).start()
    wait(w)
    w.close()
    w.close()  # the run's end may close twice
    w.poke()  # and a poke after it is nothing


def test_without_inotify_the_wait_is_its_seconds_and_poke_still_ends_it(state, monkeypatch):
    monkeypatch.setattr(wake_module, "_inotify", lambda folder: None)
    w = Wake(state)
    assert not w.watching
    threading.Timer(0.2, land, (state, "42")).start()
    wait(w, 0.5)  # returns: its seconds are up (the marker is read by the next cycle, as before)
    threading.Timer(0.2, w.poke).start()
    wait(w)
    w.close()


def test_a_folder_that_cannot_be_watched_leaves_the_plain_wait(tmp_path):
    w = Wake(tmp_path / "no-such-folder")
    assert not w.watching
    w.poke()
    wait(w)
    w.close()


def test_a_wake_that_never_waited_holds_no_descriptor(state):
    before = len(os.listdir("/proc/self/fd"))
    wakes = [Wake(state) for _ in range(50)]  # as the unit tests' sessions, or `multinode check`
    for w in wakes:
        w.poke()  # no wait to end: nothing
    assert len(os.listdir("/proc/self/fd")) == before
    for w in wakes:
        w.close()


def test_event_names_are_read_from_inotify_records():
    record = wake_module._EVENT.pack(1, wake_module.IN_MOVED_TO, 0, 16) + b"42.exit".ljust(16, b"\0")
    record += wake_module._EVENT.pack(1, wake_module.IN_CLOSE_WRITE, 0, 0)  # an event on the folder itself: no name
    assert list(wake_module.names(record)) == ["42.exit", ""]
