"""`multinode status`: one run's jobs as a table, from the registry and ONE batched SLURM query.

The registry (registry.py) says which jobs a run submitted (rule, wildcards, attempt, log); SLURM says where they
are, in one batched query for all of them, never one per job:
  - `squeue -t all -j id,id,... -O ...` for every job slurmctld still holds (queued, running, and ended less than
    MinJobAge ago): state, pending reason, RestartCnt (so no `scontrol show job` per job), elapsed, time limit,
    nodes, GPUs per node. slurmctld first, because slurmdbd lags it: sacct was seen to call a job PENDING whose
    training had already written three metrics lines.
  - `sacct --duplicates -X -j ...` only for the jobs slurmctld no longer knows (ended longer ago): every run of a
    requeued job is a line of its own, so its restarts are counted there.
Neither knows a job that ended long ago on a cluster without accounting; its exit marker may still say how it ended,
and its restarts are counted from the restart logs the job script writes. Progress is the last line of each job's
metrics file (progress.py), and GPU use each node's GPU samples (gpu_use.py), read from the shared filesystem; a
running job's goodput so far is the ledger (ledger.py) of its runs as its runs file times them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from snakemake_executor_multinode.contract import node_events
from snakemake_executor_multinode.contract.jobfiles import (
    EXIT_MARKER,
    RUNS_DIR,
    JobFiles,
    StateFolders,
    tensorboard_dir,
)
from snakemake_executor_multinode.contract.jsonl import json_lines
from snakemake_executor_multinode.contract.state_files import Damaged, ignored, marker_text
from snakemake_executor_multinode.slurm import reasons
from snakemake_executor_multinode.slurm.client import (
    ACTIVE_STATES,
    QueryError,
    SlurmClient,
    is_job_key,
    job_order,
    queue_key,
)
from snakemake_executor_multinode.slurm.formats import clock, clock_to_seconds, gres_gpus, minutes_to_seconds, tres_map
from snakemake_executor_multinode.watching import gpu_use, preemptions, progress, run_ends
from snakemake_executor_multinode.watching.ledger import CATEGORIES, RunSpan, ledger
from snakemake_executor_multinode.watching.registry import Submission, runs

SACCT_FIELDS = (
    "JobIDRaw", "State", "Reason", "ElapsedRaw", "TimelimitRaw", "NNodes", "AllocTRES", "ReqTRES", "JobID",
)  # fmt: skip
SQUEUE_FIELDS = (
    "JobID", "State", "Reason", "RestartCnt", "TimeUsed", "TimeLimit", "NumNodes", "tres-per-node", "ArrayJobID",
    "ArrayTaskID",
)  # fmt: skip


class RunNotFound(LookupError):
    """No run of that id (or no run at all) in the registry."""


class JobNotFound(LookupError):
    """No submission of this folder's runs is the job asked for; the message names what was looked for."""


@dataclass(frozen=True)
class JobRow:
    """One submission of the run, as the table shows it."""

    rule: str
    wildcards: str  # "shard=1,part=a"; "" without wildcards
    attempt: int
    jobid: str | None  # None: sbatch never answered (refused, or still in flight)
    state: str
    reason: str = ""  # why it is pending (or why it ended), when SLURM says
    nodes: int | None = None
    gpus_per_node: int | None = None
    elapsed_s: int | None = None
    limit_s: int | None = None  # None: no limit (UNLIMITED) or not known
    restarts: int = 0
    progress: str = ""
    log: str = ""
    gpu_use: str = ""  # each sampled node's mean utilisation and peak memory so far (gpu_use.py)
    goodput: str = ""  # a running job's goodput so far and where the rest went
    replaced: str = ""  # the nodes `multinode torchrun` dropped for spares (resource spare_nodes), with why
    run_id: str = ""  # the experiment its runs log to (W&B run id, MLflow tag), shown for a training-shaped job
    tensorboard: str = ""  # its TensorBoard folder, once the training has written it
    preempted: str = ""  # its runs SLURM preempted, each with its preemptor (preemptions.py)
    ended: str = ""  # how its runs ended, where there is more to say than one run's exit 0 (run_ends.py)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


@dataclass(frozen=True)
class SlurmView:
    """What SLURM says of one job: the fields the table needs, whichever command answered."""

    state: str
    reason: str
    nodes: int | None
    gpus_per_node: int | None
    elapsed_s: int | None
    limit_s: int | None
    restarts: int


# --- the registry's runs ----------------------------------------------------------------------------------------
def run_started(subs: Sequence[Submission]) -> float:
    return min(s.submitted_at for s in subs)


def run_table(workdir: Path) -> dict[str, list[Submission]]:
    """Every run that submitted something, oldest first. (Each Snakemake start makes a run folder, also when it has
    nothing to do; those without a submission are no run to look at.)"""
    by_run: dict[str, list[Submission]] = {}
    for sub in runs(workdir / RUNS_DIR):
        by_run.setdefault(sub.run_id, []).append(sub)
    return dict(sorted(by_run.items(), key=lambda item: run_started(item[1])))


def resolve_run(table: dict[str, list[Submission]], which: str) -> str:
    """`latest` (the run that started submitting last), a run id, or a unique prefix of one."""
    if not table:
        raise RunNotFound(f"no run has submitted a job from this folder ({RUNS_DIR} is empty)")
    if which == "latest":
        return list(table)[-1]
    matches = [run for run in table if run.startswith(which)]
    if len(matches) != 1:
        known = ", ".join(list(table)[-10:])
        what = "no run" if not matches else "several runs"
        raise RunNotFound(f"{what} with id {which!r}; runs (newest last): {known}")
    return matches[0]


def find_job(workdir: Path, which: str | None) -> Submission:
    """One job of this folder's runs: `which` is a SLURM job id (or array element <id>_<task>), a rule name or one of
    a job's output paths (as given to Snakemake, or absolute); None: the most recently submitted job. The newest
    submission wins where several match (a rule's jobs, an output built again)."""
    subs = sorted((s for s in runs(workdir / RUNS_DIR) if s.jobid), key=lambda s: s.submitted_at)
    if not subs:
        raise JobNotFound(f"no job: no run has submitted a job from {workdir} ({RUNS_DIR} is empty)")
    if which is None:
        return subs[-1]
    if is_job_key(which):
        found = [s for s in subs if s.jobid == which]
        what = f"SLURM job {which}"
    elif found := [s for s in subs if s.rule == which]:
        what = f"rule {which}"
    else:
        found = [s for s in subs if _makes(s, workdir, which)]
        what = f"rule or output {which!r}"
    if not found:
        raise JobNotFound(f"no job is {what} in the runs of {workdir}")
    return found[-1]


def _makes(sub: Submission, workdir: Path, output: str) -> bool:
    """`output` (as given to Snakemake, or absolute) is one of the job's outputs."""
    wanted = os.path.normpath(workdir / output)  # an absolute path stays itself
    return any(os.path.normpath(workdir / o) == wanted for o in sub.outputs)


def makers(workdir: Path, outputs: Sequence[str]) -> tuple[list[Submission], list[str]]:
    """The jobs that made these outputs: for each, the newest submission that ran to success with it among its
    outputs (one job once, in the order of submission); and the outputs no job of these runs made (a local rule's,
    or another executor's)."""
    done = [s for s in runs(workdir / RUNS_DIR) if s.jobid and s.ended == "success"]
    done.sort(key=lambda s: s.submitted_at)
    found: dict[str, Submission] = {}
    missing = []
    for output in outputs:
        made = [s for s in done if _makes(s, workdir, output)]
        if made:
            found.setdefault(made[-1].job_name, made[-1])
        else:
            missing.append(output)
    return sorted(found.values(), key=lambda s: s.submitted_at), missing


def current_log(sub: Submission) -> str:
    """The log the job writes now: its newest restart's, else its first."""
    later = restart_logs(sub.log)
    return str(later[-1]) if later else sub.log


# --- SLURM ------------------------------------------------------------------------------------------------------
def slurm_views(client: SlurmClient, jobids: Iterable[str]) -> dict[str, SlurmView]:
    """Every job's view: one squeue for all, then one sacct for those slurmctld no longer knows (none while a run
    is under way). A job neither knows is left out. QueryError when neither answers."""
    ids = sorted({j for j in jobids if j and is_job_key(j)}, key=job_order)
    if not ids:
        return {}
    views: dict[str, SlurmView] = {}
    ctld_error: QueryError | None = None
    try:
        views = {queue_key(row): from_squeue(row) for row in client.queue(ids, SQUEUE_FIELDS) if row.get("JobID")}
    except QueryError as err:
        ctld_error = err  # slurmctld restarting: accounting may still answer for every job
    if missing := [j for j in ids if j not in views]:
        try:
            views |= from_sacct(client.accounting(missing, SACCT_FIELDS))
        except QueryError as err:
            if ctld_error is not None:
                raise QueryError(f"{ctld_error} / {err}") from err
            # no accounting: the jobs slurmctld forgot are unknown
    return views


def from_sacct(rows: Iterable[dict[str, str]]) -> dict[str, SlurmView]:
    runs_of: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        if row.get("JobIDRaw", "").isdigit():
            element = row.get("JobID", "")  # an array element is known as <array>_<task>
            runs_of.setdefault(element if "_" in element and is_job_key(element) else row["JobIDRaw"], []).append(row)
    views = {}
    for jobid, records in runs_of.items():
        last = records[-1]  # sacct lists a requeued job's runs oldest first; the earlier ones say REQUEUED
        nodes = _int(last.get("NNodes", ""))
        tres = tres_map(last.get("AllocTRES", "")) or tres_map(last.get("ReqTRES", ""))
        views[jobid] = SlurmView(
            state=_state(last.get("State", "")),
            reason=last.get("Reason", ""),
            nodes=nodes,
            gpus_per_node=_per_node(tres.get("gres/gpu"), nodes),
            elapsed_s=_int(last.get("ElapsedRaw", "")),
            limit_s=minutes_to_seconds(last.get("TimelimitRaw", "")),
            restarts=len(records) - 1,
        )
    return views


def from_squeue(row: dict[str, str]) -> SlurmView:
    return SlurmView(
        state=_state(row.get("State", "")),
        reason=row.get("Reason", ""),
        nodes=_int(row.get("NumNodes", "")),
        gpus_per_node=gres_gpus(row.get("tres-per-node", "")),
        elapsed_s=clock_to_seconds(row.get("TimeUsed", "")),
        limit_s=clock_to_seconds(row.get("TimeLimit", "")),
        restarts=_int(row.get("RestartCnt", "")) or 0,
    )


def _state(text: str) -> str:
    return text.split()[0] if text.strip() else "UNKNOWN"  # "CANCELLED by 0" -> CANCELLED


def _int(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def _per_node(total: str | None, nodes: int | None) -> int | None:
    if total is None or not total.isdigit():
        return 0 if total is None else None
    return int(total) // nodes if nodes else int(total)


# --- rows -------------------------------------------------------------------------------------------------------
def restart_logs(log: str) -> list[Path]:
    """The logs of a requeued job's later runs, oldest first ("": a job without a log yet)."""
    return JobFiles.from_log(log).restart_logs() if log else []


def _exit_marker(workdir: Path, jobid: str) -> str | None:
    try:
        return marker_text(StateFolders(workdir).marker(jobid, EXIT_MARKER), EXIT_MARKER).split()[0]
    except OSError:
        return None
    except Damaged as err:
        ignored(err, "the job's state is SLURM's alone")
        return None


# --- goodput so far ---------------------------------------------------------------------------------------------
def _iso_epoch(text: object) -> float | None:
    try:
        return datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return None


def run_spans(files: JobFiles, nodes: int, gpus_per_node: int, now: float) -> list[RunSpan]:
    """A running job's runs as its runs file times them (the job script's start and end lines; squeue has no
    start per run). A run that requeued itself writes no end line: its log's last write ends it; the last run ends
    now. Each run's first output time is its nodes' earliest (`multinode torchrun` writes it)."""
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}
    for line in json_lines(files.runs):
        if isinstance(line, dict) and isinstance(line.get("restart"), int):
            when = _iso_epoch(line.get("time"))
            if when is not None and line.get("event") in ("start", "end"):
                (starts if line["event"] == "start" else ends)[line["restart"]] = when
    spans = []
    for k in sorted(starts):
        end = ends.get(k)
        if end is None and k == max(starts):
            end = now
        elif end is None:
            try:
                end = files.restart(k).log.stat().st_mtime
            except OSError:
                end = starts[k]
        spans.append(RunSpan(starts[k], max(end, starts[k]), nodes, gpus_per_node,
                             first_output=files.restart(k).first_output_time()))  # fmt: skip
    return spans


def goodput_so_far(log: str, nodes: int, gpus_per_node: int, now: float) -> str:
    """'62% of 3.20 GPU-h (startup 8%, checkpoint 3%, ...)', or that it is unknown (the rest still shown: a job
    without metrics has startup to its first output line, then unknown); "" without a timed run."""
    files = JobFiles.from_log(log)
    spans = run_spans(files, nodes, gpus_per_node, now)
    if not spans:
        return ""
    runs_lines = [x for x in json_lines(files.runs) if isinstance(x, dict)]
    led = ledger(spans, runs_lines, json_lines(files.metrics))
    size = f"{led.allocated_gpu_h:.2f} GPU-h" if gpus_per_node else f"{led.allocated_node_s / 3600:.2f} node-h"
    rest = [f"{c} {100 * share:.0f}%" for c in CATEGORIES if c != "productive" and (share := led.share(c) or 0) > 0]
    shown = "unknown (no metrics)" if led.goodput is None else f"{100 * led.goodput:.0f}%"
    return f"{shown} of {size}" + (f" ({', '.join(rest)})" if rest else "")


def replaced(log: str) -> list[node_events.NodeEvent]:
    """The nodes the launcher dropped in a job (launching/spares.py), in order: each replaced by a spare, or failing
    its node check with no spare taking its place (`spare` empty: a spare itself, or none left)."""
    return node_events.read_of_log(log).dropped


def replacements(log: str) -> str:
    """'node2 -> node3 (does not answer: the node is down)', one per replacement the launcher recorded,
    'node3 (failed its node check: ...)' for a node dropped with no spare in its place, and
    'node2 straggler (5.0x the others' busy s/step; replace)' per straggler it named (launching/straggler.py); ""
    without any."""
    return node_events.read_of_log(log).describe()


def curves(sub: Submission, view: SlurmView | None) -> tuple[str, str]:
    """Where a job's training curves are: its run id (the trackers' run) and its TensorBoard folder ("" until the
    training writes it). Said for a job that wrote that folder or has several nodes or GPUs (a training), not for
    every element of a fan-out."""
    if not sub.tracking_id or not sub.log:
        return "", ""
    folder = Path(tensorboard_dir(JobFiles.from_log(sub.log).prefix.parent, sub.tracking_id))
    written = folder.is_dir()
    if not (written or (view is not None and ((view.nodes or 0) > 1 or (view.gpus_per_node or 0) > 0))):
        return "", ""
    return sub.tracking_id, str(folder) if written else ""


def preempted(client: SlurmClient, subs: Sequence[Submission]) -> dict[str, str]:
    """Each job's preempted runs, said with their preemptors: job id -> "run 0 preempted by job 15 (...); ...".
    One SLURM query for every preempted run of these jobs (none without one)."""
    found = {
        sub.jobid: runs
        for sub in subs
        if sub.jobid and sub.log and (runs := preemptions.preempted_runs(json_lines(JobFiles.from_log(sub.log).runs)))
    }
    by = preemptions.preemptors(client, [r for runs in found.values() for r in runs])
    return {job: "; ".join(r.describe(by.get((r.job, r.restart))) for r in runs) for job, runs in found.items()}


def rows_for(
    subs: Sequence[Submission], views: dict[str, SlurmView], workdir: Path, preempted: Mapping[str, str] | None = None
) -> list[JobRow]:
    rows = []
    for sub in sorted(subs, key=lambda s: s.submitted_at):
        view = views.get(sub.jobid or "")
        later_logs = restart_logs(sub.log)
        found = progress.for_log(sub.log)
        if sub.jobid is None:
            state, reason = "UNSUBMITTED", "no job id: sbatch refused it or never answered"
        elif view is None:
            # SLURM forgot it (no accounting, finished before MinJobAge); the exit marker may still say how it ended
            code = _exit_marker(workdir, sub.jobid)
            state, reason = ("ENDED", f"exit {code}") if code is not None else ("UNKNOWN", "SLURM no longer knows it")
        else:
            state = view.state
            reason = view.reason if view.reason not in reasons.NO_REASON and state == "PENDING" else ""
        running = view is not None and view.state == "RUNNING"
        run_id, tensorboard = curves(sub, view)
        rows.append(
            JobRow(
                rule=sub.rule,
                wildcards=",".join(f"{k}={v}" for k, v in sub.wildcards.items()),
                attempt=sub.attempt,
                jobid=sub.jobid,
                state=state,
                reason=reason,
                nodes=view.nodes if view else None,
                gpus_per_node=view.gpus_per_node if view else None,
                elapsed_s=view.elapsed_s if view else None,
                limit_s=view.limit_s if view else None,
                restarts=view.restarts if view else len(later_logs),
                progress=found.describe(eta=running) if found else "",
                log=str(later_logs[-1]) if later_logs else sub.log,
                gpu_use=gpu_use.describe(gpu_use.for_log(sub.log)),
                goodput=goodput_so_far(sub.log, view.nodes or 1, view.gpus_per_node or 0, time.time())
                if running and view is not None and sub.log
                else "",
                replaced=replacements(sub.log),
                run_id=run_id,
                tensorboard=tensorboard,
                preempted=(preempted or {}).get(sub.jobid or "", ""),
                ended=run_ends.describe(json_lines(JobFiles.from_log(sub.log).runs), state in ACTIVE_STATES)
                if sub.log
                else "",
            )
        )
    return rows


def collect(workdir: Path, subs: Sequence[Submission], client: SlurmClient) -> list[JobRow]:
    views = slurm_views(client, [s.jobid for s in subs if s.jobid])
    return rows_for(subs, views, workdir, preempted(client, subs))


# --- the table --------------------------------------------------------------------------------------------------
def _short(path: str, workdir: Path) -> str:
    try:
        return str(Path(path).relative_to(workdir))
    except ValueError:
        return path


def summary(rows: Sequence[JobRow]) -> str:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.state] = counts.get(row.state, 0) + 1
    return ", ".join(f"{n} {state.lower()}" for state, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _label(r: JobRow) -> str:
    return r.rule + (f"[{r.wildcards}]" if r.wildcards else "") + (f" #{r.attempt}" if r.attempt > 1 else "")


def render(run_id: str, rows: Sequence[JobRow], workdir: Path, started: float | None = None) -> str:
    when = f", started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))}" if started else ""
    head = f"run {run_id}{when}: {len(rows)} job(s), {summary(rows)}"
    return "\n".join([head, *_table(rows, workdir), *_sections(rows, workdir)])


def _table(rows: Sequence[JobRow], workdir: Path) -> list[str]:
    """One line a job under a header, in columns (the log last, unpadded)."""
    header = ("RULE", "JOBID", "STATE", "NODESxGPUS", "ELAPSED/LIMIT", "RESTARTS", "PROGRESS", "LOG")
    table = [header]
    for r in rows:
        shape = f"{r.nodes}x{r.gpus_per_node}" if r.nodes is not None and r.gpus_per_node is not None else "-"
        limit = clock(r.limit_s) if r.limit_s is not None else ("-" if r.elapsed_s is None else "none")
        table.append(
            (
                _label(r),
                r.jobid or "-",
                r.state + (f" ({r.reason})" if r.reason else ""),
                shape,
                f"{clock(r.elapsed_s)}/{limit}",
                str(r.restarts),
                r.progress or "-",
                _short(r.log, workdir) if r.log else "-",
            )
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(header) - 1)]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(line[:-1], widths, strict=True)) + "  " + line[-1] for line in table
    ]


def _sections(rows: Sequence[JobRow], workdir: Path) -> list[str]:
    """The sections under the table, each with a title and a line per job it speaks of; none where no job has
    anything to say."""

    def per_job(say: Callable[[JobRow], str]) -> list[str]:
        return [f"  {_label(r)} (job {r.jobid}): {say(r)}" for r in rows if say(r)]

    def tracked(r: JobRow) -> str:
        if not r.run_id:
            return ""
        return f"run {r.run_id}, TensorBoard " + (
            _short(r.tensorboard, workdir) if r.tensorboard else "none written yet"
        )

    waits = [
        f"  job {r.jobid}: {reasons.say(r.reason, r.jobid)}"
        for r in rows
        if r.state == "PENDING" and r.reason and r.jobid and reasons.explain(r.reason)
    ]
    sections = (
        ("why they wait:", waits),
        ("GPU use so far (per node: mean utilisation, peak memory of one GPU):", per_job(lambda r: r.gpu_use)),
        ("goodput so far (productive share of the allocation; the rest):", per_job(lambda r: r.goodput)),
        ("preempted by SLURM (for a job of a higher priority tier or QOS):", per_job(lambda r: r.preempted)),
        (
            "training curves (run id: W&B run id unless WANDB_RUN_ID was set; MLflow tag multinode.run_id):",
            per_job(tracked),
        ),
        (
            "nodes replaced by spares (dropped -> spare) or failing their node check, stragglers named:",
            per_job(lambda r: r.replaced),
        ),
        ("how the runs ended (requeued, stalled, the failing node):", per_job(lambda r: r.ended)),
    )
    return [line for title, lines in sections if lines for line in ("", title, *lines)]


def watch(
    show: Callable[[], str],
    interval: float,
    out: Callable[[str], None],
    tty: bool,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Print `show()` every `interval` seconds until Ctrl-C (KeyboardInterrupt, left to the caller). A run's next
    jobs may be submitted any moment, so an all-finished table is no reason to stop. On a terminal the screen is
    redrawn; into a file or pipe each table follows the last."""
    while True:
        text = show()
        out(("\x1b[H\x1b[2J" if tty else "") + text + ("" if tty else "\n"))
        sleep(interval)
