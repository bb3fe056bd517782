"""The progress watchdog of `multinode torchrun`: a job that makes no progress is noticed, not left to its time limit.

Progress is any new line from any rank on any node (each node's labeller appends every rank's lines to the node's
file beside the job log: a training that logs, prints or warns at all moves it) or a new metrics line
($MULTINODE_METRICS_FILE). Both are stat() calls on the head node, once a second: a deadlocked collective, a data
loader waiting forever or every rank blocked on I/O show as files that stop growing, whatever the cause.

After `stall_timeout` seconds without progress the launcher (head node):
1. asks every node for its ranks' Python stacks: it writes `<stem>.stall-request`; each node's labeller sees it, runs
   `py-spy dump` on each of its workers and appends the stack, labelled `[<node> rank<R>] stack| ...`, to its file
   (so to the job log), then writes `<stem>.<node>.stacks-done`; it waits for every node, at most STACKS_WAIT_S;
2. ends the step (srun ends every task);
3. writes its verdict to the stall marker ("stalled: no progress for 10m on any rank; stacks in <log>; rank 1 differs:
   time.sleep (worker.py:12)"), which Snakemake's error quotes;
4. on_stall fail: exits EXIT_STALLED; requeue: writes the preempt file, so the job script requeues the job (it resumes
   from its last checkpoint) as after the pre-time-limit signal.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from snakemake_executor_multinode import protocol

STACK_LABEL = "stack| "
STACKS_WAIT_S = 30.0  # every node's stacks, at most this long after the request (py-spy takes ~0.1 s per process)
PY_SPY_TIMEOUT_S = 15.0
_FRAME = re.compile(r"^\s+(\S.*?) \((\S+?):(\d+)\)")  # py-spy: "    sleep (worker.py:12)"
_LABELLED = re.compile(r"^\[(?P<node>[^ \]]+) rank(?P<rank>\d+)\] " + re.escape(STACK_LABEL) + r"(?P<text>.*)$")


def request_file(stem: str) -> Path:
    return Path(f"{stem}.stall-request")


def done_file(stem: str, node: str) -> Path:
    return Path(f"{stem}.{node}.stacks-done")


class Watchdog:
    """Tells a stall from progress by the sizes of the files every rank's output and the metrics reach."""

    def __init__(self, timeout_s: float, paths: Sequence[Path], clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s, self.paths, self.clock = timeout_s, list(paths), clock
        self.last_progress = clock()
        self._seen: dict[Path, tuple[int, int]] = {}

    def stalled(self) -> bool:
        if self.timeout_s <= 0:
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
        return self.clock() - self.last_progress >= self.timeout_s


def _environ(pid: int) -> bytes:
    return Path(f"/proc/{pid}/environ").read_bytes()


def worker_ranks(
    agent_pid: int, children: Callable[[], dict[int, list[int]]], environ: Callable[[int], bytes] = _environ
) -> list[tuple[int, str]]:
    """(pid, global rank) of the training workers below torchrun's agent: the first processes down the tree with
    RANK in their environment (not their own children, a data loader's workers, which inherit it)."""
    found, todo, tree = [], [agent_pid], children()
    while todo:
        for pid in tree.get(todo.pop(), []):
            try:
                env = environ(pid).split(b"\0")
            except OSError:
                continue
            rank = next((kv[5:].decode() for kv in env if kv.startswith(b"RANK=")), None)
            if rank is not None:
                found.append((pid, rank))
            else:
                todo.append(pid)  # a wrapper (a container runtime's client): the worker is further down
    return sorted(found, key=lambda pr: int(pr[1]) if pr[1].isdigit() else 0)


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


def verdict(stem: str, nodes: Sequence[str], timeout_s: float, log: str) -> str:
    """One line for Snakemake: how long, where the stacks are, and the rank whose innermost frame differs from the
    others' (the one that did not join), where one does."""
    tops: dict[str, str] = {}
    for node in nodes:
        try:
            text = Path(protocol.node_log(stem, node)).read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            m = _LABELLED.match(line)
            if m and m["rank"] not in tops and (frame := _FRAME.match(m["text"])):
                tops[m["rank"]] = f"{frame[1]} ({os.path.basename(frame[2])}:{frame[3]})"
    said = f"stalled: no progress for {_seconds(timeout_s)} on any rank; stacks in {log}"
    if len(set(tops.values())) < 2:
        return said
    common, count = Counter(tops.values()).most_common(1)[0]
    odd = sorted((r for r, top in tops.items() if top != common), key=int)
    if count > len(odd):  # most ranks wait in the same place: the others are the ones to look at
        return said + "; " + "; ".join(f"rank {r} differs: {tops[r]}" for r in odd)
    by_top: dict[str, list[str]] = {}
    for rank, top in sorted(tops.items(), key=lambda kv: int(kv[0])):
        by_top.setdefault(top, []).append(rank)
    return said + "; " + "; ".join(f"rank {','.join(ranks)}: {top}" for top, ranks in by_top.items())


def record(env: Mapping[str, str], message: str, on_stall: str) -> None:
    """The verdict for the tracker; with on_stall requeue, the preempt file too (the job script then requeues)."""
    writes = [(protocol.STALL_FILE_VAR, message)]
    if on_stall == "requeue":
        writes.append((protocol.PREEMPT_FILE_VAR, "stalled"))
    for var, text in writes:
        if path := env.get(var):
            try:
                Path(path).write_text(text + "\n")
            except OSError:
                pass


def _seconds(s: float) -> str:
    s = int(s)
    return f"{s // 60}m" if s % 60 == 0 and s >= 60 else f"{s}s"
