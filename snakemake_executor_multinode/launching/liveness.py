"""Which nodes of a step no longer answer: asked once after a task failed, before a node is blamed, and once when the
progress watchdog finds a stall (a network split: `split`).

A node that dies (its slurmd, slurmstepd and workers gone) takes the other nodes' ranks with it: they fail first
(their peer vanished), and srun names them. SLURM itself marks the node only after SlurmdTimeout (minutes). A TCP
connect to each node's slurmd, all at once, answers in well under a second: a live node's kernel accepts it even
while slurmd is busy; a dead node refuses it (its stack is up, nothing listens) or never answers (timeout).
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

DEFAULT_SLURMD_PORT = 6818  # SLURM's compiled-in default
CONNECT_TIMEOUT_S = 1.0


def slurmd_port(env: Mapping[str, str] | None = None, timeout: float = 5.0) -> int:
    """The cluster's SlurmdPort (`scontrol show config`), read only when a failure needs it."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True, timeout=timeout, env=env
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return DEFAULT_SLURMD_PORT
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "SlurmdPort" and value.strip().isdigit():
            return int(value.strip())
    return DEFAULT_SLURMD_PORT


def answers(node: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> bool:
    """False only when the node's address is known and nothing accepts on its slurmd port. A name that does not
    resolve is no evidence (it counts as answering): never blame a node on a guess."""
    try:
        addrs = socket.getaddrinfo(node, port, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return True
    try:
        with socket.create_connection((str(addrs[0][4][0]), port), timeout=timeout):
            return True
    except OSError:  # refused, timed out, unreachable
        return False


def unreachable(nodes: Sequence[str], port: int, probe: Callable[[str, int], bool] = answers) -> list[str]:
    """The nodes (in the given order) whose slurmd does not answer; all asked in parallel, so ~1 s at worst."""
    if not nodes:
        return []
    with ThreadPoolExecutor(max_workers=min(len(nodes), 64)) as pool:
        alive = list(pool.map(lambda n: probe(n, port), nodes))
    return [n for n, ok in zip(nodes, alive, strict=True) if not ok]


@dataclass(frozen=True)
class Split:
    """A stalled step's nodes that the head node cannot reach, and the one to blame."""

    node: str  # the node to blame: an unreachable node of the step, or the head itself when it reaches no one
    unreachable: tuple[str, ...]  # every node (step or spare) the head could not reach, in the order asked
    head: bool = False  # the head (where the launcher runs) is the one cut off: it reaches none of 2+ other nodes


def split(
    here: str,
    step: Sequence[str],
    spares: Sequence[str],
    port: int,
    find: Callable[[Sequence[str], int], list[str]] = unreachable,
) -> Split | None:
    """Asked when the progress watchdog finds a stall: in a network split every rank waits in its collective and the
    stacks name no node, so the head asks every other node of the step and every spare (in parallel) whether it
    answers. A node is unreachable only when it fails twice in a row (a second round for those alone). With 2 or
    more other nodes none of which answers, the head is the one cut off; otherwise the first unreachable node of the
    step is blamed. None when every node answers, or only spares do not (the stall is not theirs)."""
    others = [n for n in dict.fromkeys([*step, *spares]) if n != here]
    down = find(others, port)
    down = find(down, port) if down else []
    if not down:
        return None
    if len(others) >= 2 and len(down) == len(others):
        return Split(here, tuple(down), head=True)
    blamed = [n for n in step if n in down]
    return Split(blamed[0], tuple(down)) if blamed else None
