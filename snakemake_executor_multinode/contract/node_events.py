"""What happened to a job's nodes, in one typed record with one reader: a training node replaced by a spare, a node
that failed its node check, a node named a straggler (warned, or replaced).

The launcher appends one JSON line per event to the job's replacements file (jobfiles.REPLACEMENTS: the first run's,
beside its log, every run of the job appends to it). Everything that asks what happened reads it here: the job
script (`multinode node-events --replaced FILE` decides whether the job may requeue itself), `multinode status`, the
report and the notices. A warning is an event of its own kind, so it can never be read as a replacement.

This record decides recovery, so it never fails silently: a write that fails raises NodeEventError (the launcher
says it in the job's log and takes the safe path), and a line the reader cannot parse makes the answer unknown, never
"nothing happened".
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.util.private_files import StateWriteError

REPLACED = "replaced"  # a training node dropped after a failed step, a spare in its place
CHECK_FAILED = "check_failed"  # a node that failed its node check (node_check.py): its spare, or "" (none took it)
STRAGGLER = "straggler"  # a node named slower than the others (straggler.py): warned, or ended for a spare
KINDS = (REPLACED, CHECK_FAILED, STRAGGLER)


class NodeEventError(Exception):
    """An event that could not be recorded, or a record that cannot be read: `message` says which and why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class NodeEvent:
    """One event. `spare`: the spare that took the node's place ("" for none); `action` (a straggler): warn or
    replace; `figure`/`median`/`measure`: the straggler's own figure, the others' median and what was measured."""

    kind: str
    node: str
    why: str = ""
    spare: str = ""
    relaunch: int = 0
    action: str = ""
    figure: float | None = None
    median: float | None = None
    measure: str = ""
    job: str = ""
    time: str = ""

    @property
    def dropped(self) -> bool:
        """The node left the training for the rest of the job (replaced, or failed its check)."""
        return self.kind in (REPLACED, CHECK_FAILED)

    @property
    def spare_took_over(self) -> bool:
        """A spare now trains in the node's place."""
        return self.dropped and bool(self.spare)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"job": self.job, "event": self.kind, "node": self.node}
        if self.dropped:
            out |= {"spare": self.spare, "why": self.why, "relaunch": self.relaunch}
        else:
            out |= {"figure": self.figure, "median": self.median, "measure": self.measure}
            out |= {"action": self.action, "why": self.why}
        return out | {"time": self.time}

    def describe(self) -> str:
        """'node2 -> node3 (does not answer)', 'node3 (failed its node check: ...)' for a node no spare took,
        'node2 straggler (5.0x the others' busy s/step; warn)'."""
        if self.dropped:
            return f"{self.node}{f' -> {self.spare}' if self.spare else ''} ({self.why})"
        if self.figure is not None and self.median:
            return f"{self.node} straggler ({self.figure / self.median:.1f}x the others' {self.measure}; {self.action})"
        return f"{self.node} straggler ({self.action})"


def _event(raw: Any) -> NodeEvent:
    """One line's event; ValueError for a line that is no event this module writes."""
    if not isinstance(raw, Mapping) or raw.get("event") not in KINDS or not isinstance(raw.get("node"), str):
        raise ValueError("not a node event")

    def number(key: str) -> float | None:
        value = raw.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    relaunch = raw.get("relaunch", 0)
    return NodeEvent(
        kind=raw["event"],
        node=raw["node"],
        why=str(raw.get("why", "")),
        spare=str(raw.get("spare") or ""),
        relaunch=relaunch if isinstance(relaunch, int) else 0,
        action=str(raw.get("action", "")),
        figure=number("figure"),
        median=number("median"),
        measure=str(raw.get("measure", "")),
        job=str(raw.get("job", "")),
        time=str(raw.get("time", "")),
    )


@dataclass(frozen=True)
class NodeHistory:
    """A job's node events, in order; `damaged`: lines that are no event (cut short, overwritten): what they said
    is unknown."""

    events: tuple[NodeEvent, ...] = ()
    damaged: tuple[int, ...] = ()  # their line numbers, from 1

    @property
    def dropped(self) -> list[NodeEvent]:
        return [e for e in self.events if e.dropped]

    @property
    def spare_replaced(self) -> bool | None:
        """Whether a spare took a node's place in this job; None when the record is damaged and no complete line
        says so (unknown: the caller takes the safe path)."""
        if any(e.spare_took_over for e in self.events):
            return True
        return None if self.damaged else False

    def describe(self) -> str:
        """Every event said, '; '-joined; "" without any."""
        return "; ".join(e.describe() for e in self.events)


def read(path: Path) -> NodeHistory:
    """The job's node events. A missing file is a job where nothing happened to a node; a file that exists but
    cannot be read raises NodeEventError."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return NodeHistory()
    except OSError as err:
        raise NodeEventError(f"cannot read the node events {path}: {err.strerror or err}") from err
    events, damaged = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            events.append(_event(json.loads(line)))
        except ValueError:
            damaged.append(number)
    return NodeHistory(tuple(events), tuple(damaged))


def read_of_log(log: str | Path) -> NodeHistory:
    """The node events of the job whose first log is `log` (status and report); a record that cannot be read is an
    empty history there, said by the job's own log."""
    try:
        return read(JobFiles.from_log(log).replacements) if log else NodeHistory()
    except NodeEventError:
        return NodeHistory()


def append(path: Path, event: NodeEvent) -> None:
    """One line for `event`, stamped with the time where it has none; NodeEventError when it cannot be written
    (a full disk names the bytes needed and free)."""
    if not event.time:
        stamped = datetime.now().astimezone().isoformat(timespec="seconds")
        event = NodeEvent(**{**event.__dict__, "time": stamped})
    line = json.dumps(event.to_json()) + "\n"
    try:
        with open(path, "a") as fh:
            fh.write(line)
    except OSError as err:
        cause = StateWriteError(path, err, len(line.encode()), "a node event")
        raise NodeEventError(f"cannot record '{event.describe()}': {cause.message}") from err


# `multinode node-events --replaced FILE`: the job script's question, answered by exit code.
ANSWER_YES, ANSWER_NO, ANSWER_UNKNOWN = 0, 1, 2


def main(argv: Sequence[str]) -> int:
    """`--replaced FILE`: 0 when a spare took a node's place in the job, 1 when none did, 2 (said on stderr) when
    the record cannot be read or is damaged: the job script then takes the safe path."""
    if len(argv) != 2 or argv[0] != "--replaced":
        print("usage: multinode node-events --replaced FILE", file=sys.stderr)
        return ANSWER_UNKNOWN
    path = Path(argv[1])
    try:
        history = read(path)
    except NodeEventError as err:
        print(err.message, file=sys.stderr)
        return ANSWER_UNKNOWN
    if history.spare_replaced is None:
        lines = ", ".join(str(n) for n in history.damaged)
        print(f"the node events {path} are damaged (line {lines}): whether a spare replaced a node is unknown",
              file=sys.stderr)  # fmt: skip
        return ANSWER_UNKNOWN
    return ANSWER_YES if history.spare_replaced else ANSWER_NO
