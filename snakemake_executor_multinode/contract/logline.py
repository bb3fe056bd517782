"""The label of every line `multinode torchrun` writes to a job's log, written and read here only.

A worker's line starts `[<node> rank<R>] `; a worker that ended before its global rank was seen, `[<node>
local_rank<L>] `; torchrun's own lines (and the launcher's on that node), `[<node>] `. A line of a rank's Python
stack, which the progress watchdog asks for, carries `stack| ` after the label. launching/nodelog.py writes the
labels on every node; launching/stall.py reads the stacks, watching/logs.py filters by rank or node and
watching/failure.py quotes the failing rank.
"""

from __future__ import annotations

import re
from typing import NamedTuple

STACK = "stack| "  # after a label: one line of a rank's Python stack (the watchdog's request, launching/stall.py)

# ASCII: a rank is what torchrun's RANK says, digits 0-9; a node name is a host name (no blank, no bracket)
LABEL = re.compile(r"\[(?P<node>[^\s\]]+)(?: (?:rank(?P<rank>\d+)|local_rank(?P<local_rank>\d+)))?\] ", re.ASCII)

# torchrun's summary of a failed node names the rank that failed first: "Root Cause ...", then "  rank : 3 (...)".
ROOT_CAUSE_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")


def label(node: str, rank: int | str | None = None, *, local_rank: int | None = None) -> str:
    """The label a line starts with: a worker's (`rank`), one of a worker whose rank was never seen (`local_rank`),
    or torchrun's own (neither)."""
    if rank is not None:
        return f"[{node} rank{rank}] "
    if local_rank is not None:
        return f"[{node} local_rank{local_rank}] "
    return f"[{node}] "


class Labelled(NamedTuple):
    """A labelled line read back: rank and local_rank are None where the label does not carry them."""

    node: str
    rank: int | None
    local_rank: int | None
    rest: str  # the line after its label


def parse(line: str) -> Labelled | None:
    """The label at the start of `line`, and what follows it; None for an unlabelled line."""
    if (m := LABEL.match(line)) is None:
        return None
    rank, local = m["rank"], m["local_rank"]
    return Labelled(
        m["node"], int(rank) if rank is not None else None, int(local) if local is not None else None, line[m.end() :]
    )


def failing_rank_lines(text: str, node: str, count: int = 12) -> tuple[str, list[str]]:
    """The last lines of the rank that failed first on `node` (read from the node's labelled lines in a job log:
    torchrun's own root-cause summary names the rank), as (who, lines); the last lines of the node's ranks where no
    rank is named; (node, []) where they wrote nothing."""
    labelled = [(line, parse(line)) for line in text.splitlines()]
    ours = [(line, lab) for line, lab in labelled if lab is not None and lab.node == node]
    rank, in_root_cause = None, False
    for _, lab in ours:
        if lab.rank is not None or lab.local_rank is not None:
            continue  # torchrun's own lines only
        if lab.rest.startswith("Root Cause"):
            in_root_cause = True
        elif in_root_cause and (m := ROOT_CAUSE_RANK.match(lab.rest)):
            rank, in_root_cause = int(m[1]), False
    lines = [line for line, lab in ours if lab.rank is not None and (rank is None or lab.rank == rank)]
    return (label(node, rank).strip("[] ") if rank is not None else node, lines[-count:])
