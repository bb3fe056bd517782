"""A training job's progress, from the last line of its metrics file: `step 1200/20000 loss 2.31 184k tok/s ETA 3h10m`.

The convention (protocol.METRICS_FILE_VAR): the job script exports $MULTINODE_METRICS_FILE, a path beside the job's
log; a training writes its metrics there as JSON lines, or makes that path a link to its own metrics file (as
workflows/scripts/train.py does). Keys read, all optional but `step`: `steps` (the total), `loss`, `tokens_per_s`,
`time` (Unix seconds when the line was written), `tokens` (cumulative), `step_ms`, `elapsed` (training seconds),
`mfu` (model FLOPs utilisation, a fraction: 0.474 is shown as `mfu 47.4%`; null when the training cannot tell).
The ETA's time per step, best first: the wall clock between the last few lines (`time`: what the run really takes,
checkpoints and logging included), tokens per step over tokens_per_s, the last step's step_ms, elapsed / step.
Nothing here asks SLURM: progress is one read of the file's tail, on the shared filesystem.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snakemake_executor_multinode.contract.jobfiles import JobFiles

TAIL_BYTES = 16384  # a metrics line is a few hundred bytes; the tail holds the last complete ones
WINDOW = 6  # lines whose wall clock gives the rate: five log intervals


@dataclass(frozen=True)
class Progress:
    step: int
    steps: int | None = None  # the total, when the training says it
    loss: float | None = None
    tokens_per_s: float | None = None
    seconds_per_step: float | None = None
    mfu: float | None = None  # a fraction of the GPUs' peak

    @property
    def eta_s(self) -> float | None:
        if self.steps is None or self.seconds_per_step is None or self.step > self.steps:
            return None
        return (self.steps - self.step) * self.seconds_per_step

    def describe(self, eta: bool = True) -> str:
        parts = [f"step {self.step}" + (f"/{self.steps}" if self.steps else "")]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.3g}")
        if self.tokens_per_s is not None:
            parts.append(f"{human(self.tokens_per_s)} tok/s")
        if self.mfu is not None:
            parts.append(f"mfu {100 * self.mfu:.1f}%")
        if eta and (left := self.eta_s):  # none at the last step
            parts.append(f"ETA {duration(left)}")
        return " ".join(parts)


def read_tail(path: Path, limit: int) -> bytes | None:
    """The file's last `limit` bytes (None: it cannot be read), without reading the rest: logs grow for days."""
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - limit))
            return fh.read()
    except OSError:
        return None


def last_records(path: Path, count: int = WINDOW) -> list[dict[str, Any]]:
    """The last `count` complete step lines of the file, oldest first (a line being written is skipped)."""
    tail = read_tail(path, TAIL_BYTES)
    if tail is None:
        return []  # no metrics (yet), or a link to a file the training has not created
    lines = tail.split(b"\n")
    found: list[dict[str, Any]] = []
    for line in reversed(lines[:-1] if not tail.endswith(b"\n") else lines):
        if len(found) == count:
            break
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the first line of the tail may be cut; a writer may not have flushed the whole line
        if isinstance(record, dict) and "event" not in record:  # an event (a checkpoint, a resume) is no step line
            found.append(record)
    return found[::-1]


def _number(record: Mapping[str, Any], key: str) -> float | None:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _wall_clock_rate(records: Sequence[Mapping[str, Any]]) -> float | None:
    """Seconds per step between consecutive lines that carry `time`, the median over the window: one checkpoint
    pause, or the gap of a requeue, does not rule it. None without two such lines."""
    rates = []
    for a, b in zip(records, records[1:], strict=False):
        t0, t1, s0, s1 = _number(a, "time"), _number(b, "time"), _number(a, "step"), _number(b, "step")
        if t0 is not None and t1 is not None and s0 is not None and s1 is not None and s1 > s0 and t1 >= t0:
            rates.append((t1 - t0) / (s1 - s0))
    return statistics.median(rates) if rates else None


def _seconds_per_step(record: Mapping[str, Any], earlier: Sequence[Mapping[str, Any]]) -> float | None:
    if (wall := _wall_clock_rate([*earlier, record])) is not None:
        return wall
    step = _number(record, "step") or 0
    tokens, tps = _number(record, "tokens"), _number(record, "tokens_per_s")
    if tokens and tps and step > 0:  # the rate of the last interval, as the training measured it
        return tokens / step / tps
    if (step_ms := _number(record, "step_ms")) is not None:
        return step_ms / 1000
    if (elapsed := _number(record, "elapsed")) is not None and step > 0:
        return elapsed / step
    return None


def parse(record: Mapping[str, Any], earlier: Sequence[Mapping[str, Any]] = ()) -> Progress | None:
    """The progress a metrics line says; `earlier` lines (oldest first) give the wall-clock rate."""
    step = _number(record, "step")
    if step is None:
        return None
    total = _number(record, "steps")
    per_step = _seconds_per_step(record, earlier)
    return Progress(
        int(step),
        int(total) if total else None,
        _number(record, "loss"),
        _number(record, "tokens_per_s"),
        per_step,
        _number(record, "mfu"),
    )


def read(path: Path) -> Progress | None:
    records = last_records(path)
    return parse(records[-1], records[:-1]) if records else None


def for_log(log: str | Path | None) -> Progress | None:
    """The progress of the job whose first log is `log` (its metrics file lies beside it)."""
    return read(JobFiles.from_log(log).metrics) if log else None


def human(value: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= limit:
            scaled = value / limit
            return f"{scaled:.1f}{suffix}" if scaled < 10 else f"{scaled:.0f}{suffix}"
    return f"{value:.0f}"


def duration(seconds: float) -> str:
    """3h10m, 12m05s, 2d03h, 10m, 14d: at most two units, the way an ETA or a time limit is read (a second unit of 0
    is left out). The one duration format of the plugin."""
    s = int(round(seconds))
    days, rest = divmod(s, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    for big, unit, small, small_unit in (
        (days, "d", hours, "h"),
        (hours, "h", minutes, "m"),
        (minutes, "m", secs, "s"),
    ):
        if big:
            return f"{big}{unit}{small:02d}{small_unit}" if small else f"{big}{unit}"
    return f"{secs}s"


class ProgressLines:
    """Progress lines for Snakemake's output while jobs run: at most one per job per `interval` seconds, and only when
    its step moved. The file is read only when a job's line is due, so a status cycle costs nothing in between."""

    def __init__(self, interval: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self._next: dict[str, float] = {}  # job -> when its file is read next
        self._step: dict[str, int] = {}  # job -> the step of its last line

    def line(self, jobid: str, label: str, log: str | Path | None) -> str | None:
        if self.interval <= 0 or not log:
            return None
        now = self.clock()
        if now < self._next.get(jobid, -math.inf):
            return None
        self._next[jobid] = now + self.interval
        progress = for_log(log)
        if progress is None or self._step.get(jobid) == progress.step:
            return None
        self._step[jobid] = progress.step
        return f"{label} (SLURM job {jobid}): {progress.describe()}"
