"""The progress watchdog of `multinode torchrun`: a job that makes no progress is noticed, not left to its time limit.

Progress is any new line from any rank on any node (each node's labeller appends every rank's lines to the node's
file beside the job log: a training that logs, prints or warns at all moves it) or a new metrics line
($MULTINODE_METRICS_FILE). Both are stat() calls on the head node, once a second: a deadlocked collective, a data
loader waiting forever or every rank blocked on I/O show as files that stop growing, whatever the cause.

How long without progress is a stall: the rule's `stall_timeout` once the launch's training has begun
(`LaunchStart`: a rank's first line or a metrics line; before it, imports and the rendezvous, at least LONG_S:
`fixed_timeout`), or by default ($MULTINODE_STALL_TIMEOUT auto) the training's own pace (`Pace`, `adaptive_timeout`):
PACE_FACTOR times the longest of the last PACE_WINDOW intervals between its metrics step lines, at least PACE_FLOOR_S;
LONG_S before a launch's second step line (startup: imports, compilation, the checkpoint's load), while a checkpoint
save runs (a checkpoint_begin without its checkpoint_end), and for a training that writes no step lines at all.

After that long without progress the launcher (head node):
0. asks every other node of the step, and every spare, whether its slurmd answers (liveness.split, ~1 s): in a
   network split every rank waits in its collective with the same stack, so the stacks name no node; a node the head
   cannot reach (twice) is named in the log at once and blamed: a spare takes its place where one is left, else it
   is written to $MULTINODE_FAILED_NODE_FILE and the step fails without a requeue (a requeue would land on it again; the
   retry excludes it). Its stacks, which cannot come, are not waited for;
1. asks every node for its ranks' Python stacks: it writes `<stem>.stall-request`; each node's labeller sees it, runs
   `py-spy dump` on each of its workers and appends the stack, each line labelled with its rank and marked as a stack
   line (contract/logline.py), to its file
   (so to the job log), then writes `<stem>.<node>.stacks-done`; it waits for every node, at most STACKS_WAIT_S;
2. ends the step: first gently (it writes `<stem>.stop-request` and sends srun SIGUSR1, which srun passes to every
   node's task; the labeller, seeing the request, sends its torchrun SIGTERM: torchrun ends its workers, and a
   container runtime's client ends its container, which a SIGKILL to the client would leave running), after
   stop_grace (20 s in a container, 5 s without) by srun's forced termination; without a container each node's
   labeller SIGKILLs its torchrun and every process below it STOP_KILL_S after the gentle stop (nodelog.py);
3. writes its verdict to the stall marker ("stalled: no progress for 10m on any rank; stacks in <log>; rank 1 differs:
   time.sleep (worker.py:12)"), which Snakemake's error quotes;
4. with a restart left (resource max_restarts, launching/restarts.py) starts the training again on the same nodes,
   recording nothing; else on_stall fail: exits EXIT_STALLED; requeue: writes the preempt file, so the job script
   requeues the job (it resumes from its last checkpoint) as after the pre-time-limit signal. A file it cannot write
   is logged as an error naming it; without the preempt file the job fails, its verdict saying it was not requeued
   (record).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from snakemake_executor_multinode.contract import logline, protocol
from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.launching import proctree
from snakemake_executor_multinode.launching.metrics_tail import MetricsTail

NOTICED = "stall noticed at"  # the job log's line when the watchdog ends a step (the goodput ledger reads it)
# The end of the launcher's line that starts a new step after a failed one, a spare's replacement or an in-job
# restart ("...; relaunch 2"): a stall said before it did not end the run (the ledger reads it).
RELAUNCHED = "; relaunch "
# The launcher's line when SLURM reports a node failure (after SlurmdTimeout: the live ranks hung on the lost peer
# until then): the ledger books the wait as stalled.
NODE_FAILURE_SAID = "is down (SLURM reports a node failure)"
STACKS_WAIT_S = 30.0  # every node's stacks, at most this long after the request (py-spy takes ~0.1 s per process)
PY_SPY_TIMEOUT_S = 15.0
# A stalled step's gentle end (SIGTERM to each node's torchrun), before srun's forced termination: in a container its
# runtime's client stops the container meanwhile (a SIGKILL to the client would leave it running); without one
# torchrun's SIGTERM reaches the workers directly, and a worker that outlives it (stopped, or a SIGTERM handler that
# cannot run in a hung collective) would not end by waiting longer: each node's labeller SIGKILLs torchrun and every
# process below it STOP_KILL_S after the gentle stop, so the step ends, its nodes free for a restart, before srun's
# forced termination (whose SIGKILL comes only after SLURM's KillWait, 30 s by default).
STOP_GRACE_S = 20.0
STOP_GRACE_BARE_S = 5.0
STOP_KILL_S = 3.0
_FRAME = re.compile(r"^\s+(\S.*?) \((\S+?):(\d+)\)")  # py-spy: "    sleep (worker.py:12)"


def stop_grace(contained: bool) -> float:
    return STOP_GRACE_S if contained else STOP_GRACE_BARE_S


def request_file(stem: str) -> Path:
    return JobFiles(Path(stem)).stall_request


def done_file(stem: str, node: str) -> Path:
    return JobFiles(Path(stem)).stacks_done(node)


def stop_file(stem: str) -> Path:
    """The launcher's request to every node to end its torchrun gently (SIGTERM), sent with SIGUSR1 through srun."""
    return JobFiles(Path(stem)).stop_request


# The adaptive timeout, the default (protocol.STALL_AUTO): the training's own pace, from its metrics lines.
PACE_FACTOR = 10.0  # times the longest recent interval between step lines (NVIDIA's resiliency extension: 5x)
PACE_WINDOW = 20  # the recent intervals: the last this many
PACE_FLOOR_S = 30.0  # never shorter: a hang of a sub-second-step training is noticed within a minute
# Before a launch's second step line, during a checkpoint save, and for a training without step lines: the fixed
# default of before (longer than any save or startup this project has seen).
LONG_S = 30 * 60.0


@dataclass
class Pace:
    """The training's steps as its metrics lines tell them (docs/training-contract.md): the recent intervals between
    step lines, whether a checkpoint save runs, and the highest step this launch reached (the restart policy's
    progress). Lines written before `since_wall` are an earlier launch's (a resumed training rewrites the file)."""

    since_wall: float
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=PACE_WINDOW))
    saving: bool = False  # a checkpoint_begin without its checkpoint_end
    reached: float | None = None  # the highest step of this launch's step lines; None: none yet
    last: float | None = None  # the time of the last step line, or of the end of the save after it

    def feed(self, line: str, now: float) -> None:
        """One metrics line; `now` stands in for the time of a line that says none (`wall`, else `time`)."""
        try:
            rec = json.loads(line)
        except ValueError:
            return
        if not isinstance(rec, dict):
            return
        wall = _number(rec.get("wall"))
        wall = _number(rec.get("time")) if wall is None else wall
        if wall is not None and wall < self.since_wall:
            return
        at = now if wall is None else wall
        event, step = rec.get("event"), _number(rec.get("step"))
        if event == "checkpoint_begin":
            self.saving = True
        elif event == "checkpoint_end":
            self.saving = False
            if self.last is not None:
                self.last = at  # the save is no step: the next interval starts after it
        elif event is None and step is not None:
            if self.last is not None:
                self.intervals.append(max(0.0, at - self.last))
            self.last = at
            self.reached = step if self.reached is None else max(self.reached, step)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def adaptive_timeout(pace: Pace) -> float:
    """Seconds without progress that make a stall, by the training's pace so far."""
    if pace.saving or not pace.intervals:
        return LONG_S
    return max(PACE_FLOOR_S, PACE_FACTOR * max(pace.intervals))


def adaptive_rule(pace: Pace) -> str:
    """Why the adaptive timeout is what it is now, for the log line that says a stall was noticed."""
    if pace.saving:
        return "during a checkpoint save"
    if not pace.intervals:
        return "before the training's second step line"
    return (
        f"{PACE_FACTOR:g}x the longest of the last {len(pace.intervals)} intervals between step lines, "
        f"{max(pace.intervals):.3g} s, at least {PACE_FLOOR_S:g} s"
    )


class LaunchStart:
    """Whether this launch's training has begun: a line of a rank in a node's file, or a metrics line, written since
    the launch (each file's whole new lines, MetricsTail). The launcher's own lines (`[node1] launching on ...`) and
    a stack taken on request are no start. Nothing is read once the training has begun. (The ledger's end of startup
    is the same first line, but the run's first: nodelog.py's first output file, written once per run.)"""

    def __init__(self, node_files: Sequence[Path], metrics: Path | None) -> None:
        self.node_tails = [MetricsTail(path) for path in node_files]
        self.metrics_tail = MetricsTail(metrics)
        self.begun = False

    def check(self) -> bool:
        if not self.begun:
            self.begun = bool(self.metrics_tail.lines()) or any(_rank_line(t.lines()) for t in self.node_tails)
        return self.begun


def _rank_line(lines: list[str]) -> bool:
    for line in lines:
        lab = logline.parse(line)
        if lab and (lab.rank, lab.local_rank) != (None, None) and not lab.rest.startswith(logline.STACK):
            return True
    return False


def fixed_timeout(seconds: float, start: LaunchStart) -> float:
    """A rule's own stall_timeout counts once the training has begun: before it, a start slower than the timeout
    (torch's import on a loaded node or a shared file system, the rendezvous, a tracker's start) is no stall."""
    return seconds if seconds <= 0 or start.check() else max(seconds, LONG_S)


def fixed_rule(start: LaunchStart) -> str:
    """Why a fixed timeout is what it is now, for the log line that says a stall was noticed."""
    return "" if start.begun else f" (before the training's first line: at least {LONG_S / 60:g} min for its start)"


class Watchdog:
    """Tells a stall from progress by the sizes of the files every rank's output and the metrics reach. `timeout`:
    seconds, or a function giving them at each look (the adaptive timeout); 0 or less: never a stall."""

    def __init__(
        self, timeout: float | Callable[[], float], paths: Sequence[Path], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.timeout = timeout if callable(timeout) else (lambda: float(timeout))
        self.paths, self.clock = list(paths), clock
        self.last_progress = clock()
        self.limit = 0.0  # the timeout at the last look: the one a stall exceeded
        self._seen: dict[Path, tuple[int, int]] = {}

    def stalled(self) -> bool:
        self.limit = self.timeout()
        if self.limit <= 0:
            return False
        for path in self.paths:
            try:
                st = path.stat()
            except OSError:
                continue
            now = (st.st_size, st.st_mtime_ns)
            if self._seen.get(path) != now:
                self._seen[path] = now
                self.last_progress = self.clock()
        return self.clock() - self.last_progress >= self.limit


def worker_ranks(
    agent_pid: int,
    children: Callable[[], dict[int, list[int]]] = proctree.children,
    environ: Callable[[int], proctree.Environ] = proctree.environ,
    step: Mapping[str, str] | None = None,
) -> list[tuple[int, str]]:
    """(pid, global rank) of this node's training workers: the first processes down the tree below torchrun's agent
    with RANK in their environment (not their own children, a data loader's workers, which inherit it). A container
    runtime's monitor (podman's conmon) is not below its client, so where the tree holds none, the workers are the
    processes of this node's SLURM step (`step`: this process's SLURM_JOB_ID, SLURM_STEP_ID and SLURMD_NODENAME, which
    the runtime passes in) with a RANK, again without their children."""
    tree = children()
    found, todo = [], [agent_pid]
    while todo:
        for pid in tree.get(todo.pop(), []):
            try:
                rank = environ(pid).get(b"RANK")
            except OSError:
                continue
            if rank is not None:
                found.append((pid, rank.decode()))
            else:
                todo.append(pid)  # a wrapper (a container runtime's client): the worker is further down
    if not found and step is not None:
        found = _step_workers(tree, environ, step)
    return sorted(found, key=lambda pr: int(pr[1]) if pr[1].isdigit() else 0)


STEP_KEYS = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURMD_NODENAME")


def _step_workers(
    tree: dict[int, list[int]], environ: Callable[[int], proctree.Environ], step: Mapping[str, str]
) -> list[tuple[int, str]]:
    if not all(step.get(k) for k in STEP_KEYS):
        return []  # outside SLURM: the tree is all there is
    want = {k.encode(): step[k].encode() for k in STEP_KEYS}
    ranked: dict[int, str] = {}
    for pid in {p for kids in tree.values() for p in kids}:
        try:
            env = environ(pid)
        except OSError:
            continue
        if b"RANK" in env and all(env.get(k) == v for k, v in want.items()):
            ranked[pid] = env[b"RANK"].decode()
    parent = {kid: p for p, kids in tree.items() for kid in kids}
    return [(pid, rank) for pid, rank in ranked.items() if parent.get(pid) not in ranked]


def dump(pid: int) -> list[str]:
    """py-spy's view of a process's Python stacks (every thread); a line saying why where it cannot."""
    try:
        proc = subprocess.run(
            ["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=PY_SPY_TIMEOUT_S
        )
    except FileNotFoundError:
        return ["no stack: py-spy is not installed on this node (pip install py-spy)"]
    except subprocess.TimeoutExpired:
        return [f"no stack: py-spy did not answer within {PY_SPY_TIMEOUT_S:.0f} s"]
    lines = (proc.stdout or proc.stderr).splitlines()
    return lines if proc.returncode == 0 else [f"no stack (py-spy exit {proc.returncode}): {' '.join(lines)[:300]}"]


def _tops(stem: str, nodes: Sequence[str]) -> dict[int, tuple[str, str]]:
    """Each rank's innermost frame in its stack, and the node whose file holds it."""
    tops: dict[int, tuple[str, str]] = {}
    for node in nodes:
        try:
            text = JobFiles(Path(stem)).node_out(node).read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            m = logline.parse(line)
            if m is None or m.rank is None or m.rank in tops or not m.rest.startswith(logline.STACK):
                continue
            if frame := _FRAME.match(m.rest.removeprefix(logline.STACK)):
                tops[m.rank] = (f"{frame[1]} ({os.path.basename(frame[2])}:{frame[3]})", node)
    return tops


def _odd(tops: Mapping[int, str]) -> list[int]:
    """The ranks whose innermost frame differs from the majority's; none without a majority."""
    if len(set(tops.values())) < 2:
        return []
    common, count = Counter(tops.values()).most_common(1)[0]
    odd = sorted(r for r, top in tops.items() if top != common)
    return odd if count > len(odd) else []


def odd_node(stem: str, nodes: Sequence[str]) -> str | None:
    """The one node that holds every rank differing from the majority (a spare can replace it); None when no rank
    differs, or the differing ranks are on several nodes."""
    found = _tops(stem, nodes)
    odd_nodes = {found[r][1] for r in _odd({r: top for r, (top, _) in found.items()})}
    return odd_nodes.pop() if len(odd_nodes) == 1 else None


def verdict(stem: str, nodes: Sequence[str], timeout_s: float, log: str) -> str:
    """One line for Snakemake: how long, where the stacks are, and the rank whose innermost frame differs from the
    others' (the one that did not join), where one does."""
    tops = {rank: top for rank, (top, _) in _tops(stem, nodes).items()}
    said = f"stalled: no progress for {_seconds(timeout_s)} on any rank; stacks in {log}"
    if len(set(tops.values())) < 2:
        return said
    if odd := _odd(tops):  # most ranks wait in the same place: the others are the ones to look at
        return said + "; " + "; ".join(f"rank {r} differs: {tops[r]}" for r in odd)
    by_top: dict[str, list[int]] = {}
    for rank, top in sorted(tops.items()):
        by_top.setdefault(top, []).append(rank)
    return said + "; " + "; ".join(f"rank {','.join(map(str, ranks))}: {top}" for top, ranks in by_top.items())


@dataclass(frozen=True)
class Recorded:
    """What `record` could write."""

    verdict: str  # as written for the job status watch: with on_stall requeue and no requeue, why not
    requeue: bool  # the job script will requeue the job: on_stall requeue, and its request was written
    errors: tuple[str, ...] = ()  # each file that could not be written: its path and why


def record(env: Mapping[str, str], message: str, on_stall: str) -> Recorded:
    """The verdict for the job status watch; with on_stall requeue, the preempt file too (the job script then requeues).

    A file that cannot be written is an error for the caller to log, never skipped: without the preempt file the
    job script does not requeue, and the job fails with the stall's exit code, its verdict saying why. No other way
    to requeue is tried (scontrol from here): the job's own requeue count lives in the same state folder, so past a
    broken shared filesystem a stalling job could requeue without bound; a failed job is one --retries or a rerun
    resumes from its last checkpoint, and a person sees it."""
    errors: list[str] = []
    requeue = False
    if on_stall == "requeue":
        if not (preempt := env.get(protocol.PREEMPT_FILE_VAR)):
            why = f"no ${protocol.PREEMPT_FILE_VAR}: not run by the plugin's job script, which requeues"
            errors.append(f"on_stall requeue: {why}")
        elif (err := _write(preempt, "stalled")) is not None:
            why = f"cannot write {preempt} ({err})"
            errors.append(f"cannot write the requeue request {preempt}: {err}")
        else:
            requeue = True
        if not requeue:
            message += f"; not requeued: {why}"
    if (path := env.get(protocol.STALL_FILE_VAR)) and (err := _write(path, message)) is not None:
        errors.append(f"cannot write the stall verdict {path}: {err}")
    return Recorded(message, requeue, tuple(errors))


def _write(path: str, text: str) -> str | None:
    try:
        Path(path).write_text(text + "\n")
    except OSError as err:
        return err.strerror or str(err)
    return None


def _seconds(s: float) -> str:
    s = int(s)
    return f"{s // 60}m" if s % 60 == 0 and s >= 60 else f"{s}s"
