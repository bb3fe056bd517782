"""Spare nodes (resource spare_nodes): the allocation holds `nodes + k` nodes (--no-kill), the step trains on `nodes`.

When a step fails and the failure names a node (a dead node, a failing rank's node), the launcher drops that node
for the rest of the job and starts a new step on the survivors plus the first spare, with the same world size; the
training resumes from its own checkpoint, told which launch it is by $MULTINODE_RELAUNCH. Without a spare left the
failure ends the launcher as it always did (the job script's and Snakemake's retry path excludes the node).
Each replacement is an event in the job's node events (contract/node_events.py), which `multinode status` and the
job script read.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from snakemake_executor_multinode.contract import node_events, protocol
from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.launching import stall
from snakemake_executor_multinode.launching.allocation import Allocation, free_port, head_address

# How long a relaunch waits for SLURM to forget the failed step (srun already ended). A dead node's part of the step
# may be held until SLURM marks the node down (SlurmdTimeout): the new step does not wait for that, it overlaps it.
STEP_GONE_WAIT_S = 10.0
STEP_NAME = "torchrun"  # the launcher's step's --job-name


def train_nodes(env: Mapping[str, str], allocated: int) -> int:
    """The nodes the step trains on: $MULTINODE_TRAIN_NODES (the rule's nodes, set when it has spares), else all
    of the allocation's (a hand-written script, or a job without spares)."""
    value = env.get(protocol.TRAIN_NODES_VAR, "")
    return int(value) if value.isdigit() and 1 <= int(value) <= allocated else allocated


@dataclass
class Roster:
    """The allocation's nodes, in its order, those that failed (never chosen again in this job), and how many
    the step trains on."""

    nodes: tuple[str, ...]
    train: int
    bad: list[str] = field(default_factory=list)

    @property
    def has_spares(self) -> bool:
        """Whether the job was given spares at all (the step trains on fewer nodes than it holds)."""
        return self.train < len(self.nodes)

    def spares_left(self) -> int:
        return max(0, len(self.usable()) - self.train)

    def usable(self) -> list[str]:
        return [n for n in self.nodes if n not in self.bad]

    def chosen(self) -> tuple[str, ...]:
        """The step's nodes: the first `train` of the allocation's nodes not known bad."""
        return tuple(self.usable()[: self.train])

    def idle(self) -> list[str]:
        """The spares: the usable nodes not chosen now."""
        return self.usable()[self.train :]

    def spare(self) -> str | None:
        """The node a replacement would add: the first usable node not chosen now."""
        rest = self.usable()[self.train :]
        return rest[0] if rest else None

    def drop(self, node: str) -> str | None:
        """Marks `node` bad and returns the spare that takes its place; None (nothing marked) without a spare, or
        when `node` is no node of the step."""
        spare = self.spare()
        if spare is None or node not in self.chosen():
            return None
        self.bad.append(node)
        return spare

    def exclude(self, nodes: Sequence[str]) -> dict[str, str | None]:
        """Marks `nodes` bad wherever they are (training nodes or spares: nodes that failed their node check);
        each one's replacement, in order: a spare that now fills the step in a training node's place, None for a
        spare and for a training node no spare was left for."""
        before = self.chosen()
        self.bad += [n for n in nodes if n not in self.bad]
        incoming = iter([n for n in self.chosen() if n not in before])
        return {n: next(incoming, None) if n in before else None for n in nodes}

    def enough(self) -> bool:
        """Whether the usable nodes still fill the step."""
        return len(self.usable()) >= self.train


def step_allocation(alloc: Allocation, nodes: Sequence[str], relaunch: int) -> Allocation:
    """The allocation a launch's step sees: its nodes, the head's address (a new head when the old one was
    dropped) and, from the first relaunch on, a port of its own (the failed step's store may linger in TIME_WAIT)."""
    if relaunch == 0 and tuple(nodes) == alloc.nodes:
        return alloc
    addr = alloc.master_addr if nodes[0] == alloc.nodes[0] else head_address(nodes[0], nodes[1:])
    port = alloc.master_port + relaunch % protocol.PORTS_PER_JOB
    if socket.gethostname().split(".")[0] == nodes[0]:
        port = free_port(port)
    return replace(alloc, nodes=tuple(nodes), master_addr=addr, master_port=port)


def events_file(env: Mapping[str, str]) -> Path | None:
    """The job's node events (the first run's replacements file, beside its log); None outside a job's log."""
    stem = env.get(protocol.LOG_STEM_VAR)
    return JobFiles(Path(stem)).first_run.replacements if stem else None


def record(env: Mapping[str, str], event: node_events.NodeEvent, log: Callable[[str], None]) -> bool:
    """One event in the job's node events, with the job's id; False (said through `log`) when it could not be
    written: the caller takes the safe path (a lost replacement: the job does not requeue itself)."""
    path = events_file(env)
    if path is None:
        return True
    try:
        node_events.append(path, replace(event, job=env.get("SLURM_JOB_ID", "")))
    except node_events.NodeEventError as err:
        log(f"ERROR: {err.message}")
        return False
    return True


def forget_failed_node(env: Mapping[str, str], node: str, log: Callable[[str], None]) -> None:
    """The failed-node marker names the node a retry excludes; a node replaced in the job is no reason for one,
    so the marker is removed when it names that node, and a later failure without a spare names its own. A marker
    that cannot be removed is said: the job's failure may then be blamed on the replaced node (the retry leaves it
    out either way: session.py reads the node events)."""
    path = env.get(protocol.FAILED_NODE_FILE_VAR, "")
    if not path:
        return
    try:
        if Path(path).read_text().strip() == node:
            Path(path).unlink()
    except FileNotFoundError:
        return
    except OSError as err:
        log(
            f"ERROR: cannot clear the failed-node marker {path} ({err.strerror or err}): a failure of this job may "
            f"be blamed on {node}, which a spare already replaced"
        )


def clear_stall_exchange(stem: str, nodes: Sequence[str]) -> None:
    """A stalled step's requests to the nodes (stacks, gentle stop) and their answers, removed before a relaunch:
    the new step's labellers would answer a stale stack request at once, turn a user's USR1 checkpoint signal into
    a stop, and the next stall would find every node's stacks already "done"."""
    if not stem:
        return
    for path in (stall.request_file(stem), stall.stop_file(stem), *(stall.done_file(stem, n) for n in nodes)):
        path.unlink(missing_ok=True)


def step_present(job_id: str) -> bool:
    """Whether SLURM still lists the launcher's step of this job (squeue -s: steps, by name). A squeue that does not
    answer counts as "still listed": a new step that overlaps a gone one costs nothing, one that waits for a step
    still there hangs until SlurmdTimeout."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-s", "-j", job_id, "-o", "%j"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return True  # unknown: taken as still there (the new step then overlaps it), never as gone
    if out.returncode != 0:
        return True
    return STEP_NAME in out.stdout.split()


def wait_step_gone(
    job_id: str,
    present: Callable[[str], bool] = step_present,
    limit_s: float = STEP_GONE_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Waits until SLURM no longer lists the failed step, at most `limit_s`; whether it is gone."""
    deadline = time.monotonic() + limit_s
    while present(job_id):
        if time.monotonic() >= deadline:
            return False
        sleep(0.5)
    return True
