"""A job's preempted runs, and the job that preempted each: for `multinode status` and the next run's log.

The job's runs file says which run SLURM preempted and when ("preempted" line: SLURM's PreemptTime and the grace
time's end, written by the node that got the notice, launching/preemption.py), on which nodes it ran (its start
line) and how it ended (its end line: 85 checkpointed). SLURM keeps no record of the preemptor (slurmctld's log
says "JobId=Invalid" on 22.05 and 24.11, sacct has no such field, a pending preemptor's SchedNodes is empty on
22.05), so the preemptor is the job that SLURM started first on one of the run's nodes once the run had ended,
having been submitted before the notice: the job it gave the nodes to. One query for all runs (squeue -w, sacct -N
for what slurmctld forgot).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from snakemake_executor_multinode.contract.jsonl import json_lines
from snakemake_executor_multinode.contract.protocol import EXIT_PREEMPTED
from snakemake_executor_multinode.launching import preemption
from snakemake_executor_multinode.slurm.client import QueryError, SlurmClient, Started
from snakemake_executor_multinode.slurm.formats import hostlist

SKEW_S = 2.0  # SLURM's times are whole seconds: a start this close before the run's end still counts as after it


@dataclass(frozen=True)
class PreemptedRun:
    job: str
    restart: int
    notice: dict[str, Any]  # the runs file's "preempted" line
    nodes: tuple[str, ...]  # the run's nodes (its start line)
    end: float | None  # the run's end (its end line); None while it runs out its grace time
    exit: int | None

    @property
    def notice_at(self) -> float | None:
        return _epoch(self.notice.get("time"))

    def describe(self, by: str | None) -> str:
        """'run 0 preempted by job 15 (SLURM's preemption SIGTERM at ..., grace time 20 s, to ...); checkpointed'"""
        said = f"run {self.restart} preempted" + (f" by job {by}" if by else "") + f" ({preemption.when(self.notice)})"
        if self.end is None:
            return said + "; running out its grace time"
        if self.exit == EXIT_PREEMPTED:
            return said + "; checkpointed"
        return said + "; not checkpointed in the grace time: resumed from the last checkpoint"


def _epoch(text: object) -> float | None:
    try:
        return datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return None


def preempted_runs(lines: Iterable[Any]) -> list[PreemptedRun]:
    """The runs of a job that SLURM preempted, from its runs file's lines (any other line is left out)."""
    by_event: dict[str, dict[tuple[str, int], dict[str, Any]]] = {"start": {}, "end": {}, preemption.EVENT: {}}
    for line in lines:
        if isinstance(line, dict) and isinstance(line.get("restart"), int) and line.get("event") in by_event:
            by_event[line["event"]][(str(line.get("job", "")), line["restart"])] = line
    starts, ends, notices = by_event["start"], by_event["end"], by_event[preemption.EVENT]
    found = []
    for key, notice in notices.items():
        end = ends.get(key, {})
        code = end.get("exit")
        nodes = tuple(hostlist(str(starts.get(key, {}).get("nodes", ""))))
        code = code if isinstance(code, int) else None
        found.append(PreemptedRun(key[0], key[1], notice, nodes, _epoch(end.get("time")), code))
    return sorted(found, key=lambda r: (r.job, r.restart))


def preemptor(run: PreemptedRun, started: Sequence[Started]) -> str | None:
    """The job SLURM gave the run's nodes to: the first to start on one of them after the run ended, submitted
    before the notice (it waited for them). None while the run has not ended or no such job is known."""
    notice = run.notice_at
    if run.end is None or notice is None or not run.nodes:
        return None
    for job in started:
        if job.jobid.split("_")[0] == run.job or job.start < run.end - SKEW_S:
            continue
        if job.submit is not None and job.submit > notice + SKEW_S:
            continue
        if set(hostlist(job.nodes)) & set(run.nodes):
            return job.jobid
    return None


def preemptors(client: SlurmClient, runs: Sequence[PreemptedRun]) -> dict[tuple[str, int], str]:
    """The preemptor of each ended run that has one, from one query for all of them; {} when SLURM does not answer
    (the runs are said without it)."""
    ended = [r for r in runs if r.end is not None and r.nodes]
    if not ended:
        return {}
    try:
        started = client.started_on(
            sorted({n for r in ended for n in r.nodes}), min(r.end or 0 for r in ended) - SKEW_S
        )
    except QueryError:
        return {}
    return {(r.job, r.restart): by for r in ended if (by := preemptor(r, started)) is not None}


def say_previous(runs_file: str, env: Mapping[str, str], client: SlurmClient | None = None) -> int:
    """The job log's line at the start of a run after a preemption (the job script calls `multinode preempted-by`):
    which job SLURM gave the previous run's nodes to. Nothing is said where the runs file has no such run; 0 always
    (a line less in the log never stops a job)."""
    restart = env.get("SLURM_RESTART_COUNT", "0")
    previous = int(restart) - 1 if restart.isdigit() else -1
    runs = [
        r
        for r in preempted_runs(json_lines(Path(runs_file)))
        if r.job == env.get("SLURM_JOB_ID") and r.restart == previous
    ]
    by = preemptors(client or SlurmClient(timeout=10), runs)
    for run in runs:
        print(f"[multinode] {run.describe(by.get((run.job, run.restart)))}", flush=True)
    return 0
