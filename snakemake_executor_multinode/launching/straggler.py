"""Stragglers named: the node whose ranks stay slower than the others' (issue 37), on the head node, per step.

In synchronous data-parallel training every rank does the same number of steps: steps per second and output rate
are equal on every node, because the fast ranks wait for the slow one in the collectives. What differs is each
rank's BUSY time per step, the time it computes rather than waits. The training reports it in its metrics file
($MULTINODE_METRICS_FILE, docs/training-contract.md) as the key `busy_s` of a step line, or of an event line

    {"event": "ranks", "step": S, "wall": T, "busy_s": {"<node>": seconds per step, ...}}

(per node, the mean over its ranks since the previous such line; workflows/scripts/train.py puts it on its step
lines, where no reader of step lines minds an extra key).

Where the metrics file holds no such line, each node's output rate stands in: the lines its ranks wrote (the
labeller's node file, JobFiles.node_out) per SAMPLE_S, read as seconds per line. That fits asynchronous work whose
ranks are not in lockstep (sharded inference printing one line per item); lockstep training without the event
shows equal rates, so nothing is named there. A sample is compared only when every node wrote at least MIN_LINES
lines in it: a training whose rank 0 alone prints would otherwise name every quiet node.

A node is slow when its figure is more than `factor` times the median of the other nodes' figures; it is named
once it has stayed slow, at every evaluation, for `window_s` seconds (a normal evaluation, or an inconclusive
sample, starts the window again). Named: one log line with the figures and a "straggler" line in the job's
replacements file (`multinode status` shows it). on_straggler warn: nothing more, the training goes on. replace,
with a spare left: `due` tells the launcher to end the step with the node blamed, and it relaunches on the
survivors plus the spare from the last checkpoint (spares.py); without a spare it only warns, and says so.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from snakemake_executor_multinode.contract import node_events, protocol
from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.launching import spares

EVENT = "ranks"  # the metrics event with each node's busy time per step
ON_STRAGGLER = ("warn", "replace")
DEFAULT_FACTOR = 1.5
DEFAULT_WINDOW_S = 120.0
TICK_S = 1.0  # how often `due` reads the files
SAMPLE_S = 10.0  # the output-rate fallback: one comparison of the nodes' line counts this often
MIN_LINES = 5  # ... made only when every node wrote at least this many lines in the sample
WALL_SLACK_S = 2.0  # clocks of a cluster's nodes agree this well
WHAT = node_events.STRAGGLER  # how the launcher's Failure and the log line begin, and the node event's kind


@dataclass(frozen=True)
class Settings:
    on_straggler: str = "warn"
    factor: float = DEFAULT_FACTOR
    window_s: float = DEFAULT_WINDOW_S

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """The job script's variables (planning validated them); a hand-written script's unset or odd values fall
        back to the defaults rather than end a training."""
        on = env.get(protocol.ON_STRAGGLER_VAR, "warn")
        return cls(
            on if on in ON_STRAGGLER else "warn",
            _number(env.get(protocol.STRAGGLER_FACTOR_VAR, ""), DEFAULT_FACTOR, low=1.0),
            _number(env.get(protocol.STRAGGLER_WINDOW_VAR, ""), DEFAULT_WINDOW_S, low=0.0),
        )


def _number(text: str, default: float, low: float) -> float:
    try:
        value = float(text)
    except ValueError:
        return default
    return value if value > low and value < float("inf") else default


@dataclass(frozen=True)
class RanksEvent:
    wall: float | None  # when the training wrote it (Unix seconds), where it says
    busy: dict[str, float]  # busy seconds per step by node (short host names)


def ranks_event(line: str) -> RanksEvent | None:
    """The busy times of a metrics line (a step line or a "ranks" event) that has them; None for any other line.
    Figures that are no positive finite number are left out."""
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    if not isinstance(rec, dict) or rec.get("event", EVENT) != EVENT or not isinstance(rec.get("busy_s"), dict):
        return None
    busy = {str(node).split(".")[0]: float(v) for node, v in rec["busy_s"].items() if _positive(v)}
    return RanksEvent(float(rec["wall"]) if _positive(rec.get("wall")) else None, busy)


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < float("inf")


def slow_nodes(figures: Mapping[str, float], factor: float) -> dict[str, float]:
    """The nodes whose figure (seconds per unit of progress) exceeds `factor` times the median of the other nodes'
    figures, each with that median. Fewer than two nodes: none (nothing to compare with)."""
    slow = {}
    for node, value in figures.items():
        others = [v for n, v in figures.items() if n != node]
        if others and value > factor * (median := statistics.median(others)):
            slow[node] = median
    return slow


class LineRates:
    """The fallback: lines each node's ranks wrote, counted from the node files as they grow."""

    def __init__(self, paths: Mapping[str, Path]) -> None:
        self.paths = dict(paths)
        self.offsets = {node: _size(path) for node, path in self.paths.items()}  # earlier launches' lines: not ours
        self.counts = dict.fromkeys(self.paths, 0)

    def read(self) -> None:
        for node, path in self.paths.items():
            try:
                with open(path, "rb") as fh:
                    fh.seek(self.offsets[node])
                    data = fh.read()
            except OSError:
                continue
            self.offsets[node] += len(data)
            self.counts[node] += data.count(b"\n")

    def take(self, seconds: float) -> dict[str, float] | None:
        """Seconds per line of each node since the last take; None when any node wrote fewer than MIN_LINES."""
        counts, self.counts = self.counts, dict.fromkeys(self.paths, 0)
        if not counts or min(counts.values()) < MIN_LINES:
            return None
        return {node: seconds / n for node, n in counts.items()}


class MetricsTail:
    """New complete lines of the metrics file, read from where the last call stopped. A file replaced or cut shorter
    (a resumed training rewrites it, keeping the old lines) is read again from its start: the caller tells this
    launch's lines by their time."""

    def __init__(self, path: Path | None) -> None:
        self.path, self.partial = path, b""
        self.offset, self.inode = _size(path), _inode(path)

    def lines(self) -> list[str]:
        if self.path is None:
            return []
        try:
            with open(self.path, "rb") as fh:
                inode, size = os.fstat(fh.fileno()).st_ino, fh.seek(0, 2)
                if inode != self.inode or size < self.offset:
                    self.inode, self.offset, self.partial = inode, 0, b""
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        self.offset += len(data)
        *done, self.partial = (self.partial + data).split(b"\n")
        return [raw.decode(errors="replace") for raw in done]


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path else 0
    except OSError:
        return 0


def _inode(path: Path | None) -> int:
    try:
        return path.stat().st_ino if path else 0
    except OSError:
        return 0


@dataclass(frozen=True)
class Named:
    """A straggler, as named."""

    node: str
    figure: float  # its seconds per unit of progress (busy seconds per step, or seconds per line)
    median: float  # the other nodes' median of the same
    measure: str  # "busy s/step" or "s/line"
    replace: bool  # the launcher ends the step for a spare to take the node's place

    def describe(self, factor: float, window_s: float) -> str:
        return (
            f"{WHAT}: node {self.node}'s ranks {self.figure:.3g} {self.measure} against {self.median:.3g} "
            f"(the other nodes' median), {self.figure / self.median:.1f}x > {factor:g}x for {window_s:g} s"
        )


class StragglerCheck:
    """One step's straggler check, ticked by the launcher's supervising loop about once a second."""

    def __init__(
        self,
        env: Mapping[str, str],
        nodes: Sequence[str],
        log: Callable[[str], None],
        replaceable: bool = False,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.env, self.nodes, self.clock, self.log = env, list(nodes), clock, log
        self.settings = Settings.from_env(env)
        self.replaceable = replaceable  # a spare is left for this step's nodes
        stem = env.get(protocol.LOG_STEM_VAR, "")
        metrics = env.get(protocol.METRICS_FILE_VAR)
        self.metrics = MetricsTail(Path(metrics) if metrics else None)
        # an earlier launch's events, read again from a rewritten metrics file, are not this step's (the training
        # writes on the head node, where the launcher runs or a node of the same cluster's clock)
        self.since_wall = wall() - WALL_SLACK_S
        self.rates = LineRates({n: JobFiles(Path(stem)).node_out(n) for n in nodes} if stem else {})
        self.events_seen = False  # once the training reports busy times, output rates are no longer looked at
        self.sample_start = self.last_tick = clock()
        self.slow_since: dict[str, float] = {}
        self.named: dict[str, Named] = {}
        self.blamed: Named | None = None  # the straggler whose step the launcher is to end (replace)

    def tick(self) -> None:
        """Reads what is new and evaluates each new figure set."""
        for line in self.metrics.lines():
            if (ev := ranks_event(line)) is not None and (ev.wall is None or ev.wall >= self.since_wall):
                self.events_seen = True
                self.evaluate({n: v for n, v in ev.busy.items() if n in self.nodes}, "busy s/step")
        if self.events_seen:
            return
        self.rates.read()
        if (elapsed := self.clock() - self.sample_start) >= SAMPLE_S:
            self.sample_start = self.clock()
            if (per_line := self.rates.take(elapsed)) is None:
                self.slow_since.clear()  # inconclusive: no node stays "slow" across it
            else:
                self.evaluate(per_line, "s/line")

    def due(self) -> bool:
        """True once, when the launcher should end the step for a spare to replace the named straggler."""
        if self.blamed is not None or self.clock() - self.last_tick < TICK_S:
            return False  # the supervising loop comes round at every chunk of srun's output: files read once a second
        self.last_tick = self.clock()
        self.tick()
        self.blamed = next((n for n in self.named.values() if n.replace), None)
        return self.blamed is not None

    def evaluate(self, figures: Mapping[str, float], measure: str) -> None:
        now = self.clock()
        slow = slow_nodes(figures, self.settings.factor)
        for node in figures:
            if node not in slow:
                self.slow_since.pop(node, None)
        for node, median in slow.items():
            since = self.slow_since.setdefault(node, now)
            if now - since >= self.settings.window_s and node not in self.named:
                self.name(node, figures[node], median, measure)

    def name(self, node: str, figure: float, median: float, measure: str) -> None:
        replace = self.settings.on_straggler == "replace" and self.replaceable and not self.named
        named = Named(node, figure, median, measure, replace)
        self.named[node] = named
        said = named.describe(self.settings.factor, self.settings.window_s)
        if replace:
            then = "ending the step to replace it with a spare"
        elif self.settings.on_straggler == "replace":
            then = "on_straggler replace, but no spare node is left: warning only, the training goes on"
        else:
            then = "on_straggler warn: the training goes on"
        self.log(f"{said}; {then}")
        record(self.env, named, said, self.log)


def record(env: Mapping[str, str], named: Named, said: str, log: Callable[[str], None]) -> None:
    """One straggler event in the job's node events, which `multinode status` reads (a warning is its own kind of
    event: never read as a replacement). One that cannot be written is said; the spare's takeover is recorded on
    its own by the relaunch."""
    event = node_events.NodeEvent(
        node_events.STRAGGLER,
        named.node,
        said,
        action="replace" if named.replace else "warn",
        figure=round(named.figure, 6),
        median=round(named.median, 6),
        measure=named.measure,
    )
    spares.record(env, event, log)
