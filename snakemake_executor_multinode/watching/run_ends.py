"""How each run of a job ended, as `multinode status` says it: from the job's runs file, where the job script writes a
start line for every run, and an end line (its exit code, and why where it knows: the stall watchdog, the node the
launcher blamed, a checkpoint it did not requeue) or a requeue line (why it requeued itself) at its end.

A run whose next run exists and that ended with SLURM's SIGTERM (143) was requeued by SLURM: an admin's requeue, a
preemption or a node failure (the job script cannot tell which). Lines that are no run's start, end or requeue are
left out (output, not state: read tolerantly).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from snakemake_executor_multinode.contract.protocol import (
    EXIT_CODE_CHANGED,
    EXIT_CRASH_LOOP,
    EXIT_PREEMPTED,
    EXIT_STALLED,
)

SIGTERM_EXIT = 143  # the job script's exit when SLURM ends a run (scancel, a requeue, a preemption, the time limit)
# What an exit code says where the end line has no word of why.
_EXITS = {
    EXIT_PREEMPTED: "checkpointed, not requeued",
    EXIT_CODE_CHANGED: "not resumed: the code changed since the submission",
    EXIT_STALLED: "stalled: ended by the progress watchdog",
    EXIT_CRASH_LOOP: "a crash loop: not run again",
}


def _by_restart(lines: Sequence[Any], event: str) -> dict[int, Mapping[str, Any]]:
    return {
        line["restart"]: line
        for line in lines
        if isinstance(line, Mapping) and line.get("event") == event and isinstance(line.get("restart"), int)
    }


def ends(lines: Sequence[Any], active: bool) -> list[str]:
    """One phrase per run, oldest first: 'requeued by itself (checkpointed before the time limit)', 'exit 87
    (stalled: ended by the progress watchdog)', 'exit 143, requeued by SLURM', 'exit 0'; the last run of an `active`
    job is 'running'."""
    starts, finished, requeued = (_by_restart(lines, e) for e in ("start", "end", "requeue"))
    restarts = sorted(set(starts) | set(finished) | set(requeued))
    said = []
    for k in restarts:
        later = any(r > k for r in restarts)
        if (line := requeued.get(k)) is not None:
            said.append(f"requeued by itself ({line.get('why') or 'no reason given'})")
        elif (line := finished.get(k)) is not None:
            code = line.get("exit")
            why = str(line.get("why") or "") or (_EXITS.get(code, "") if isinstance(code, int) else "")
            text = f"exit {code}" + (f" ({why})" if why else "")
            if later:
                text += ", requeued by SLURM" if code == SIGTERM_EXIT else ", run again by SLURM"
            said.append(text)
        elif later:
            said.append("ended without an end line (killed), run again by SLURM")
        else:
            said.append("running" if active else "ended without an end line (killed)")
    return said


def describe(lines: Sequence[Any], active: bool) -> str:
    """The runs' ends for the status table, "" for a job with nothing to say (one run, exit 0, or none yet)."""
    said = ends(lines, active)
    if len(said) <= 1 and all(s in ("exit 0", "running") for s in said):
        return ""
    if len(said) == 1:
        return said[0]
    return "; ".join(f"run {k}: {s}" for k, s in enumerate(said, start=1))
