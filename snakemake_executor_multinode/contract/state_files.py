"""Reading what earlier runs left under .snakemake/multinode/ without trusting it.

Any file there may have been cut short (a full disk, a node's crash during a copy), overwritten with garbage, or
left by another user (a run under sudo, a folder copied from a colleague). A reader never takes such a file for
what it should be: it is `Damaged`, and the reader says what it left out (`ignored`: one warning line naming the
file, what is wrong with it and what the run does instead) and goes on, or, where going on could run a job twice,
stops before submitting and names the file (`StateError`). Never a traceback.

"Wrong owner": a file (or state folder) not owned by the user who runs the plugin is not trusted, also for root,
whom no permission stops from reading it: its content is not ours to act on (another user's registry could make a
run adopt that user's job, another user's code snapshot would run as ours). Such a file is treated as damaged, said
once, and replaced by the run's own where the run writes it anyway.

Files the job itself appends to while it runs (its log, metrics, runs and replacements lines, node outputs) are
output, not state: read tolerantly (a line that does not parse is left out), shown as they are.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

Say = Callable[[str], None]


class Damaged(ValueError):
    """A state file that cannot be taken for what it should be: `why` says what is wrong with it."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why


class StateError(RuntimeError):
    """Damaged state that a run cannot go on with without risking a job twice: stop before submitting. The message
    names the file and what to do."""


def _stderr(line: str) -> None:
    print(f"multinode: {line}", file=sys.stderr)


_say: list[Say] = [_stderr]
_said: set[str] = set()
_lock = threading.Lock()


def report_to(say: Say | None) -> None:
    """Where `ignored` says what it left out (a run: Snakemake's log, as a warning); None: stderr again."""
    with _lock:
        _say[0] = say or _stderr
        _said.clear()


def ignored(err: Damaged, instead: str) -> None:
    """Say once per process and file what was left out: `<file>: <why>; ignored: <what the run does instead>`."""
    line = f"damaged state file {err.path}: {err.why}; ignored: {instead}"
    with _lock:
        if line in _said:
            return
        _said.add(line)
        say = _say[0]
    say(line)


def foreign(uid: int) -> str | None:
    """Why a file of owner `uid` is not trusted; None when it is the running user's."""
    me = os.geteuid()
    return None if uid == me else f"owned by uid {uid}, not by you (uid {me})"


def read_bytes(path: Path) -> bytes:
    """The file's bytes. FileNotFoundError when it is missing (no damage: there is none); Damaged when it is
    another user's, no regular file, or cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise Damaged(path, f"cannot be read ({err.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Damaged(path, "not a regular file")
        if why := foreign(st.st_uid):
            raise Damaged(path, why)
        try:
            return fh.read()
        except OSError as err:
            raise Damaged(path, f"cannot be read ({err.strerror})") from None


def read_text(path: Path) -> str:
    """The file as UTF-8 text; Damaged as `read_bytes`, and for bytes that are no text (garbage)."""
    data = read_bytes(path)
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise Damaged(path, f"not text (garbage bytes, {len(data)} bytes)") from None


def read_json(path: Path) -> Any:
    """The file's JSON; Damaged as `read_text`, for an empty file (cut short) and for text that is no JSON."""
    text = read_text(path)
    if not text.strip():
        raise Damaged(path, "empty (cut short)")
    try:
        return json.loads(text)
    except ValueError as err:
        raise Damaged(path, f"not valid JSON ({_json_why(err)}: cut short or overwritten)") from None


def _json_why(err: ValueError) -> str:
    if isinstance(err, json.JSONDecodeError):
        return f"{err.msg} at byte {err.pos}"
    return str(err)


# What each marker Snakemake's side reads holds (contract/jobfiles.py): anything else is damage.
_MARKER_FORMS = {
    ".exit": re.compile(r"-?\d+( \d+( \S+)?)?"),  # <exit code> <restart> <job name>
    ".failed-node": re.compile(r"[A-Za-z0-9][\w.-]*"),  # a host name
    ".requeued": re.compile(r"\d+ [^\n]*"),  # <next restart> <why>
    ".crashes": re.compile(r"\d+ -?\d+"),  # <runs> <exit code>
    ".stalled": re.compile(r"[^\n]+"),  # the watchdog's verdict, one line
}


def marker_text(path: Path, suffix: str) -> str:
    """A marker's text, stripped, checked against what its kind holds. FileNotFoundError when there is none;
    Damaged when it is cut short, garbage or another user's."""
    text = read_text(path).strip()
    form = _MARKER_FORMS.get(suffix)
    if not text:
        raise Damaged(path, "empty (cut short)")
    if form is not None and (not form.fullmatch(text) or not text.isprintable()):
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise Damaged(path, f"not a {suffix} marker ({shown!r})")
    return text
