"""Which nodes of a step no longer answer: asked once, after a task failed, before a node is blamed.

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
