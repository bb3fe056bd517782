"""The goodput ledger: where a job's allocated time went, run by run (`multinode report`).

A pure function of what SLURM accounted (each run's start, end, nodes and GPUs), the job's runs file and its
metrics records (docs/training-contract.md: step lines and events, each with its wall-clock `wall`). Within a run,
time is cut at the records' times, so the parts add up to the run's allocated time by construction:

- startup: the run's start to its first record (less a resume's `restore_s`, and less the first line's own steps
  where it says `step_ms`); a run without any record of a job that writes metrics is all startup;
- restore: the resume's `restore_s` (the seconds loading the checkpoint took);
- relaunch: within a run, a new step of `multinode torchrun`: a spare's replacement of a node (launching/spares.py)
  or an in-job restart on the same nodes (launching/restarts.py): the last record before a resume that is not the
  run's first record, to that resume (less its restore_s): the failure's notice (a stall's timeout included), the
  node check and the new step's start. Steps above the step it resumed from were computed again: lost, as across
  runs;
- checkpoint: checkpoint_begin to checkpoint_end, whatever is said between them (an asynchronous save's
  checkpoint_written, when the save waits for the one before);
- productive / lost: the interval before a step line (or a checkpoint_begin) covers the steps since the previous
  record. Steps above the step a later run resumed from were computed again: lost. A later run is the job's own
  (a requeue) or another job's that resumed from the same checkpoints, its resume event in the same metrics file
  after this run ended (Snakemake's retry, a rerun); without one the last run's steps are productive;
- stalled / teardown: the last record to the run's end: stalled when a step that made no progress held the run
  until something ended it: the progress watchdog, or SLURM (the time limit, a node failure after SlurmdTimeout;
  the caller decides), else teardown (and SLURM's tail);
- spare: the allocated nodes beyond those the training runs on (resource spare_nodes: the runs file's
  `train_nodes`), for the whole run: every other category counts the training's nodes only, so productive
  node-seconds are the training's own, and the categories still add up to the allocation;
- preempted: SLURM's preemption notice (the runs file's "preempted" line, launching/preemption.py) to the run's end:
  the save in the grace time, and the wait for SLURM's end; the run is cut there as if it ended then;
- unknown: a job with no metrics at all: startup to its first output line when the caller knows it, the rest
  unknown; without a first output line (a command with its own launcher) the whole run is unknown. Its productive
  time is unknown, never guessed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

CATEGORIES = (
    "startup", "productive", "checkpoint", "restore", "relaunch", "lost", "stalled", "preempted", "teardown", "spare",
    "unknown",
)  # fmt: skip
# sacct's Start and End are whole seconds and the nodes' clocks drift: a record this close outside a run is the run's
# (clamped into it); one further away belongs to another job sharing the training's metrics file.
SKEW_S = 2.0
# sacct cuts Start and End down to the whole second: a run lasted up to this long past its End. A record written in
# that second extends the run to it; clamped to End, the time before it would drop out of every category.
TRUNCATION_S = 1.0

_LINE, _BEGIN, _END, _RESUME = "line", "checkpoint_begin", "checkpoint_end", "resume"


@dataclass(frozen=True)
class RunSpan:
    """One run (the first, or a requeue) as SLURM accounted it: epoch seconds, its nodes and GPUs per node."""

    start: float
    end: float
    nodes: int
    gpus_per_node: int = 0
    submit: float | None = None  # when it became pending: its queue wait is start - submit
    # a step without progress held it until the progress watchdog or SLURM (time limit, node failure) ended it
    stalled: bool = False
    first_output: float | None = None  # the job log's first output line, for a job that writes no metrics


@dataclass
class RunLedger:
    span: RunSpan
    seconds: dict[str, float]
    restart: int
    exit: int | None = None  # from the runs file's end line, when there is one
    train_nodes: int | None = None  # the nodes it trains on (the runs file's start line); None: all of them

    @property
    def allocated_s(self) -> float:
        return self.span.end - self.span.start

    @property
    def training_nodes(self) -> int:
        """The nodes every category but spare counts: the training's, never more than the allocation's."""
        return self.span.nodes if self.train_nodes is None else min(self.train_nodes, self.span.nodes)

    @property
    def spare_nodes(self) -> int:
        return self.span.nodes - self.training_nodes

    def node_seconds(self, category: str) -> float:
        if category == "spare":
            return self.allocated_s * self.spare_nodes
        return self.seconds[category] * self.training_nodes


@dataclass
class Ledger:
    """Seconds, node-seconds and GPU-hours per category, per run and summed; the queue wait beside them."""

    runs: list[RunLedger]
    known: bool  # the job wrote timed metrics: without them productive is unknown
    seconds: dict[str, float] = field(default_factory=dict)
    node_seconds: dict[str, float] = field(default_factory=dict)
    gpu_hours: dict[str, float] = field(default_factory=dict)
    queue_wait_s: float | None = None

    @property
    def allocated_s(self) -> float:
        return sum(self.seconds.values())

    @property
    def allocated_node_s(self) -> float:
        return sum(self.node_seconds.values())

    @property
    def allocated_gpu_h(self) -> float:
        return sum(self.gpu_hours.values())

    @property
    def productive_node_s(self) -> float | None:
        return self.node_seconds["productive"] if self.known else None

    @property
    def goodput(self) -> float | None:
        """Productive over allocated node-seconds (None when productive is unknown or nothing was allocated)."""
        total = self.allocated_node_s
        return None if not self.known or total <= 0 else self.node_seconds["productive"] / total

    def share(self, category: str) -> float | None:
        total = self.allocated_node_s
        return None if total <= 0 else self.node_seconds[category] / total


@dataclass(frozen=True)
class _Record:
    wall: float
    kind: str
    step: float | None
    restore_s: float = 0.0
    step_ms: float | None = None


def _number(record: Mapping[str, Any], key: str) -> float | None:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _record(raw: Any) -> _Record | None:
    """A metrics record with a time; step lines and "superseded" ones (the lines a resume dropped) are lines."""
    if not isinstance(raw, Mapping):
        return None
    wall = _number(raw, "wall")
    wall = _number(raw, "time") if wall is None else wall  # a script that writes only the documented `time`
    if wall is None:
        return None
    event = raw.get("event")
    kind = _LINE if event in (None, "superseded") else str(event)
    restore = _number(raw, "restore_s") or 0.0
    return _Record(wall, kind, _number(raw, "step"), max(restore, 0.0), _number(raw, "step_ms"))


def _assign(records: list[_Record], spans: Sequence[RunSpan]) -> list[list[_Record]]:
    """Each record to the run it falls in (or within SKEW_S of, the nearest), clamped into it; time order."""
    per_run: list[list[_Record]] = [[] for _ in spans]
    for rec in records:
        best, distance = None, SKEW_S
        for i, span in enumerate(spans):
            d = max(span.start - rec.wall, rec.wall - span.end, 0.0)
            if d <= distance and (best is None or d < distance):
                best, distance = i, d
        if best is not None:
            span = spans[best]
            per_run[best].append(_Record(min(max(rec.wall, span.start), span.end), rec.kind, rec.step, rec.restore_s,
                                         rec.step_ms))  # fmt: skip
    for run in per_run:
        run.sort(key=lambda r: r.wall)  # stable: records written at one instant keep the file's order
    return per_run


def _extended(spans: list[RunSpan], records: list[_Record]) -> list[RunSpan]:
    """Each run's end moved to its last record within TRUNCATION_S after sacct's End (never into the next run)."""
    out = []
    for i, span in enumerate(spans):
        limit = min(span.end + TRUNCATION_S, spans[i + 1].start if i + 1 < len(spans) else math.inf)
        late = [r.wall for r in records if span.end < r.wall <= limit]
        out.append(replace(span, end=max(late)) if late else span)
    return out


def _resumed_from(per_run: list[list[_Record]]) -> list[float | None]:
    """The step each run started from: the resume event before its first step line, or inferred (no such event) as
    the last step earlier runs logged below its first line's step (0 when none). A resume after a step line is a
    spare's relaunch inside the run, not where the run started. None: the run logged no step, so says nothing."""
    found: list[float | None] = []
    for j, recs in enumerate(per_run):
        first = next(((r.kind, r.step) for r in recs if r.kind in (_RESUME, _LINE) and r.step is not None), None)
        resume = None
        if first is not None:
            kind, step = first
            earlier = [r.step for run in per_run[:j] for r in run if r.step is not None and r.step < step]
            resume = step if kind == _RESUME else max(earlier, default=0.0)
        found.append(resume)
    return found


def _split_work(seconds: dict[str, float], gap: float, before: float, after: float, keep_to: float) -> None:
    """A step interval covering steps (before, after]: steps up to `keep_to` count, later ones were computed again."""
    if after <= keep_to:
        seconds["productive"] += gap
    elif before >= keep_to or after <= before:
        seconds["lost"] += gap
    else:
        lost = gap * (after - keep_to) / (after - before)
        seconds["lost"] += lost
        seconds["productive"] += gap - lost


def _kept_to(recs: Sequence[_Record], keep_to: float) -> list[float]:
    """For each record, the highest step of its work that counts: `keep_to` (later runs), lowered by every resume
    after it in the same run (a relaunch computed the steps above it again)."""
    out, lowest = [keep_to] * len(recs), keep_to
    for k in range(len(recs) - 1, -1, -1):
        out[k] = lowest
        step = recs[k].step
        if recs[k].kind == _RESUME and step is not None and k > 0:
            lowest = min(lowest, step)
    return out


def _run_seconds(
    span: RunSpan, recs: list[_Record], known: bool, start_step: float, keep_to: float
) -> dict[str, float]:
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    if not recs:
        if not known and span.first_output is None:  # no metrics and no output line seen (its own launcher)
            seconds["unknown"] += span.end - span.start
            return seconds
        output = span.end if span.first_output is None else min(max(span.first_output, span.start), span.end)
        seconds["startup"] += output - span.start
        rest = span.end - output
        if not known:
            seconds["unknown"] += rest
        else:  # it never trained: its output after the first line is startup still, or the stall that ended it
            seconds["stalled" if span.stalled else "startup"] += rest
        return seconds
    first, keep = recs[0], _kept_to(recs, keep_to)
    gap = first.wall - span.start
    step = start_step
    if first.kind == _RESUME:
        restore = min(first.restore_s, gap)
        seconds["restore"] += restore
        seconds["startup"] += gap - restore
    elif first.kind == _END:
        seconds["checkpoint"] += gap
    elif first.step is not None and first.step_ms is not None and first.kind in (_LINE, _BEGIN):
        # the first line's own steps, by the time per step it reports; the rest of the gap is startup
        work = min(max(first.step_ms * max(first.step - step, 0.0) / 1000, 0.0), gap)
        _split_work(seconds, work, step, first.step, keep[0])
        seconds["startup"] += gap - work
    else:
        seconds["startup"] += gap
    if first.step is not None:
        step = max(step, first.step) if first.kind != _RESUME else first.step
    saving = first.kind == _BEGIN  # inside a checkpoint_begin .. checkpoint_end
    for k, (a, b) in enumerate(zip(recs, recs[1:], strict=False), start=1):
        gap = b.wall - a.wall
        if saving or b.kind == _END:
            seconds["checkpoint"] += gap
        elif b.kind == _RESUME:  # a relaunch inside the run (a spare took a node's place, or an in-job restart)
            restore = min(b.restore_s, gap)
            seconds["restore"] += restore
            seconds["relaunch"] += gap - restore
        elif b.step is not None and b.kind in (_LINE, _BEGIN):
            _split_work(seconds, gap, step, b.step, keep[k])
        else:  # an event this ledger does not know, or a line without a step: the work since the last step
            _split_work(seconds, gap, step, step, keep[k])
        if b.step is not None:
            step = b.step if b.kind == _RESUME else max(step, b.step)
        saving = b.kind == _BEGIN or (saving and b.kind not in (_END, _RESUME))
    tail = span.end - recs[-1].wall
    if span.stalled:
        seconds["stalled"] += tail
    elif saving:
        seconds["checkpoint"] += tail  # ended while saving
    else:
        seconds["teardown"] += tail
    return seconds


def _by_restart(runs_lines: Sequence[Mapping[str, Any]], event: str, key: str) -> dict[int, int]:
    """One integer of the runs file's start or end lines by restart (an end line's exit, a start line's
    train_nodes)."""
    found: dict[int, int] = {}
    for line in runs_lines:
        restart, value = line.get("restart"), line.get(key)
        if line.get("event") == event and isinstance(restart, int) and isinstance(value, int):
            found[restart] = value
    return found


def _preemptions(runs_lines: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """The runs file's preemption notices: SLURM's PreemptTime (epoch seconds) by restart."""
    found: dict[int, float] = {}
    for line in runs_lines:
        restart = line.get("restart")
        if line.get("event") == "preempted" and isinstance(restart, int):
            try:
                found[restart] = datetime.fromisoformat(str(line.get("time"))).timestamp()
            except ValueError:
                continue
    return found


def _run_until_preempted(
    span: RunSpan, recs: list[_Record], known: bool, start_step: float, keep_to: float, notice: float | None
) -> dict[str, float]:
    """A run's seconds; a preempted run's before the notice as any run's, the rest `preempted`."""
    if notice is None or not span.start < notice < span.end:
        return _run_seconds(span, recs, known, start_step, keep_to)
    before = [r for r in recs if r.wall <= notice]
    seconds = _run_seconds(replace(span, end=notice), before, known, start_step, keep_to)
    seconds["preempted"] += span.end - notice
    return seconds


def ledger(spans: Sequence[RunSpan], runs_lines: Sequence[Mapping[str, Any]], metrics: Sequence[Any]) -> Ledger:
    """The ledger of one job: its runs as SLURM accounted them (any order), its runs file's lines and its metrics
    records (parsed JSON, in the file's order)."""
    ordered = sorted(spans, key=lambda s: s.start)
    records = [r for raw in metrics if (r := _record(raw)) is not None]
    ordered = _extended(ordered, records)
    per_run = _assign(records, ordered)
    known = any(per_run)
    resumed = _resumed_from(per_run)
    exits = _by_restart(runs_lines, "end", "exit")
    trains = _by_restart(runs_lines, "start", "train_nodes")
    preempted = _preemptions(runs_lines)
    runs: list[RunLedger] = []
    resumes = [(r.wall, r.step) for r in records if r.kind == _RESUME and r.step is not None]
    for i, (span, recs) in enumerate(zip(ordered, per_run, strict=True)):
        later = [r for r in resumed[i + 1 :] if r is not None]
        later += [step for wall, step in resumes if wall > span.end + SKEW_S]  # another job's too (a retry)
        keep_to = min(later, default=math.inf)  # steps above it were computed again by a later run
        resumed_at = resumed[i]
        start_step = resumed_at if resumed_at is not None else 0.0
        seconds = _run_until_preempted(span, recs, known, start_step, keep_to, preempted.get(i))
        runs.append(RunLedger(span, seconds, i, exits.get(i), trains.get(i)))
    result = Ledger(runs, known)
    for cat in CATEGORIES:
        result.seconds[cat] = sum(r.seconds[cat] for r in runs)
        result.node_seconds[cat] = sum(r.node_seconds(cat) for r in runs)
        result.gpu_hours[cat] = sum(r.node_seconds(cat) * r.span.gpus_per_node for r in runs) / 3600
    waits = [s.start - s.submit for s in ordered if s.submit is not None]
    result.queue_wait_s = sum(max(w, 0.0) for w in waits) if waits else None
    return result
