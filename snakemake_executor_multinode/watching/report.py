"""The efficiency report: what a run's jobs asked SLURM for against what they used, per job, per rule and per run.

All figures come from one `sacct --duplicates -j id,id,...` with the job steps (every run of a requeued job counts):
  time       the longest run's Elapsed against the time limit
  CPU        TotalCPU / (Elapsed x AllocCPUS), summed over the runs (TotalCPU of a job line covers its steps)
  memory     peak RSS against the memory per node: the batch step's MaxRSS plus the largest other step's, an upper
             bound for the head node (one task per node: a step's MaxRSS is a node's). Sampled every
             JobAcctGatherFrequency seconds: a job shorter than that has none, and a short spike may be missed.
  GPU-hours  gres/gpu of AllocTRES (all nodes) x Elapsed, summed per rule and per run
  goodput    where each run's allocation went (ledger.py): sacct's Start and End cut at the job's metrics events
A rule whose completed jobs used less than half of what they asked for gets a suggestion of what to request.
Written to .snakemake/multinode/reports/<run>.{csv,md}; `multinode report --run ID` writes it again at any time.
"""

from __future__ import annotations

import csv
import io
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from snakemake_executor_multinode.contract.jobfiles import REPORTS_DIR, JobFiles
from snakemake_executor_multinode.contract.jsonl import json_lines
from snakemake_executor_multinode.contract.state_files import Damaged, foreign, ignored
from snakemake_executor_multinode.launching import stall
from snakemake_executor_multinode.slurm.client import ACTIVE_STATES, QueryError, SlurmClient, is_job_key, is_transient
from snakemake_executor_multinode.slurm.formats import clock, cpu_seconds, epoch, minutes_to_seconds, size_mb, tres_map
from snakemake_executor_multinode.watching import gpu_use, progress
from snakemake_executor_multinode.watching.ledger import CATEGORIES, Ledger, RunSpan, ledger
from snakemake_executor_multinode.watching.registry import Submission
from snakemake_executor_multinode.watching.status_view import replacements, run_table

FIELDS = (
    "JobIDRaw",
    "State",
    "ElapsedRaw",
    "TimelimitRaw",
    "TotalCPU",
    "AllocCPUS",
    "NNodes",
    "MaxRSS",
    "AllocTRES",
    "ReqTRES",
    "JobID",  # an array element's <array>_<task>, the key the run knows it by
    "Start",  # each run's allocation, for the goodput ledger
    "End",
    "Submit",
)
WASTE = 0.5  # a rule that used less than this share of a request gets a suggestion
HEADROOM = 1.5  # suggested = what the longest / largest job used x this
SETTLE_SECONDS = 30.0  # at the end of a run: how long to wait for slurmdbd to record the last jobs' end


def _int(text: str) -> int:
    return int(text) if text.strip().isdigit() else 0


@dataclass
class RunRecord:
    """One run of a job (a requeued job has one per run), with what its steps used."""

    jobid: str
    state: str
    elapsed_s: int
    limit_s: int | None
    total_cpu_s: float
    alloc_cpus: int
    nodes: int
    mem_mb: float | None  # memory of the allocation, all nodes
    gpus: int  # GPUs of the allocation, all nodes
    batch_rss_mb: float | None = None
    step_rss_mb: float | None = None  # the largest MaxRSS of the other steps
    start: float | None = None  # epoch seconds; None: not started, or not in the query
    end: float | None = None  # None: still running
    submit: float | None = None

    @property
    def peak_rss_mb(self) -> float | None:
        known = [v for v in (self.batch_rss_mb, self.step_rss_mb) if v is not None]
        return sum(known) if known else None


def parse_accounting(rows: Iterable[dict[str, str]]) -> dict[str, list[RunRecord]]:
    """sacct --duplicates lines (a job's line, then its steps' lines; a requeued job's runs oldest first) -> runs."""
    runs: dict[str, list[RunRecord]] = {}
    current: RunRecord | None = None
    for row in rows:
        jobid, _, step = row.get("JobIDRaw", "").partition(".")  # an element's steps: its own id, as its line
        if not jobid.isdigit():
            continue
        if not step:
            tres = tres_map(row.get("AllocTRES", "")) or tres_map(row.get("ReqTRES", ""))
            current = RunRecord(
                jobid=jobid,
                state=(row.get("State", "").split() or ["UNKNOWN"])[0],  # "CANCELLED by 0" -> CANCELLED
                elapsed_s=_int(row.get("ElapsedRaw", "")),
                limit_s=minutes_to_seconds(row.get("TimelimitRaw", "")),
                total_cpu_s=cpu_seconds(row.get("TotalCPU", "")),
                alloc_cpus=_int(row.get("AllocCPUS", "")),
                nodes=_int(row.get("NNodes", "")) or 1,
                mem_mb=size_mb(tres.get("mem", "")),
                gpus=_int(tres.get("gres/gpu", "")),
                start=epoch(row.get("Start", "")),
                end=epoch(row.get("End", "")),
                submit=epoch(row.get("Submit", "")),
            )
            element = row.get("JobID", "")
            runs.setdefault(element if "_" in element and is_job_key(element) else jobid, []).append(current)
            continue
        if current is None or current.jobid != jobid:
            continue  # a step whose job line sacct did not print
        rss = size_mb(row.get("MaxRSS", ""))
        if rss is None:
            continue
        if step == "batch":
            current.batch_rss_mb = max(rss, current.batch_rss_mb or 0.0)
        elif step != "extern":  # the extern step holds no work of the job
            current.step_rss_mb = max(rss, current.step_rss_mb or 0.0)
    return runs


# --- figures ----------------------------------------------------------------------------------------------------
def _ratio(used: float | None, asked: float | None) -> float | None:
    return used / asked if used is not None and asked else None


class _UsedOfAsked:
    """Used against requested, the same for a job and a rule."""

    longest_run_s: int
    limit_s: int | None
    cpu_s: float
    cpu_alloc_s: float
    mem_req_mb: float | None
    peak_rss_mb: float | None

    @property
    def time_used(self) -> float | None:
        return _ratio(self.longest_run_s, self.limit_s)

    @property
    def cpu_efficiency(self) -> float | None:
        return _ratio(self.cpu_s, self.cpu_alloc_s)

    @property
    def mem_used(self) -> float | None:
        return _ratio(self.peak_rss_mb, self.mem_req_mb)


@dataclass(frozen=True)
class JobUsage(_UsedOfAsked):
    rule: str
    wildcards: str
    jobid: str
    state: str  # of its last run
    runs: int
    nodes: int
    gpus_per_node: int
    cpus_per_node: int
    elapsed_s: int  # all runs
    longest_run_s: int
    limit_s: int | None  # per run; None: no limit
    cpu_s: float
    cpu_alloc_s: float  # Elapsed x AllocCPUS, all runs
    mem_req_mb: float | None  # per node
    peak_rss_mb: float | None
    gpu_hours: float
    gpu_use: str = ""  # each sampled node's mean utilisation and peak memory (gpu_use.py); "": not sampled
    ledger: Ledger | None = None  # where the allocation went; None: sacct gave no run's start
    replaced: str = ""  # nodes dropped for spares within the job (spare_nodes): "node2 -> node3 (why)"; "": none

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def training(self) -> bool:
        """Shown in the goodput section: a job with GPUs, or one that wrote metrics."""
        return self.ledger is not None and (self.gpus_per_node > 0 or self.ledger.known)


STALL_TAIL_BYTES = 16 << 20  # the watchdog's line, then every rank's stack: near a run's end; logs grow for days


# SLURM's end of a run whose step was held without progress: the time limit over a hang, a node failure
SLURM_ENDED_HELD = ("TIMEOUT", "NODE_FAIL")


def _stalled(log: Path, state: str) -> bool:
    """A step without progress held this run until something ended it: the progress watchdog (its log's end says
    so: stall.NOTICED), SLURM at the time limit or at a node failure (the run's state), or the launcher when SLURM
    reported a node failure after the live ranks hung on the lost peer (stall.NODE_FAILURE_SAID). A stall after which
    the launcher started a new step in the run (stall.RELAUNCHED: a spare, an in-job restart) did not end it."""
    if state in SLURM_ENDED_HELD:
        return True
    tail = progress.read_tail(log, STALL_TAIL_BYTES)
    if tail is None:
        return False
    said = max(tail.rfind(stall.NOTICED.encode()), tail.rfind(stall.NODE_FAILURE_SAID.encode()))
    return said >= 0 and tail.find(stall.RELAUNCHED.encode(), said) < 0


def job_ledger(sub: Submission, runs: Sequence[RunRecord], now: float) -> Ledger | None:
    """The job's goodput ledger from its runs' Start and End (a running run ends `now`) and its files. Each run's
    first output time is the earliest its nodes' labellers wrote (`multinode torchrun`): a job without metrics is
    startup to it, then unknown (all unknown when it has none: a launcher of its own)."""
    started = [r for r in runs if r.start is not None]
    if not started or not sub.log:
        return None
    files = JobFiles.from_log(sub.log)
    spans = [
        RunSpan(r.start, max(r.end if r.end is not None else now, r.start), r.nodes, r.gpus // r.nodes, r.submit,
                _stalled(files.restart(k).log, r.state), files.restart(k).first_output_time())
        for k, r in enumerate(started)
        if r.start is not None
    ]  # fmt: skip
    runs_lines = [x for x in json_lines(files.runs) if isinstance(x, dict)]
    return ledger(spans, runs_lines, json_lines(files.metrics))


def job_usage(sub: Submission, runs: Sequence[RunRecord], now: float | None = None) -> JobUsage:
    last = runs[-1]
    mems = [r.peak_rss_mb for r in runs if r.peak_rss_mb is not None]
    return JobUsage(
        rule=sub.rule,
        wildcards=",".join(f"{k}={v}" for k, v in sub.wildcards.items()),
        jobid=last.jobid,
        state=last.state,
        runs=len(runs),
        nodes=last.nodes,
        gpus_per_node=last.gpus // last.nodes,
        cpus_per_node=last.alloc_cpus // last.nodes,
        elapsed_s=sum(r.elapsed_s for r in runs),
        longest_run_s=max(r.elapsed_s for r in runs),
        limit_s=last.limit_s,
        cpu_s=sum(r.total_cpu_s for r in runs),
        cpu_alloc_s=float(sum(r.elapsed_s * r.alloc_cpus for r in runs)),
        mem_req_mb=last.mem_mb / last.nodes if last.mem_mb is not None else None,
        peak_rss_mb=max(mems) if mems else None,
        gpu_hours=sum(r.gpus * r.elapsed_s for r in runs) / 3600,
        gpu_use=gpu_use.describe(gpu_use.for_log(sub.log)),
        ledger=job_ledger(sub, runs, time.time() if now is None else now),
        replaced=replacements(sub.log),
    )


@dataclass(frozen=True)
class RuleUsage(_UsedOfAsked):
    rule: str
    jobs: int
    completed: int
    nodes: int
    gpus_per_node: int
    cpus_per_node: int
    longest_run_s: int
    limit_s: int | None
    cpu_s: float
    cpu_alloc_s: float
    mem_req_mb: float | None
    peak_rss_mb: float | None
    gpu_hours: float
    suggestion: dict[str, int] = field(default_factory=dict)  # resource -> value to request instead

    def suggestion_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.suggestion.items())


def suggest(jobs: Sequence[JobUsage]) -> dict[str, int]:
    """Values to request instead, for what the rule's completed jobs used less than half of (failed or cancelled
    jobs say nothing about what a job needs). With HEADROOM over the largest use, never more than was asked."""
    done = [j for j in jobs if j.state == "COMPLETED"]
    if not done:
        return {}
    out: dict[str, int] = {}
    limits = [j.limit_s for j in done]
    longest = max(j.longest_run_s for j in done)
    if all(limits) and longest < WASTE * min(x for x in limits if x):
        minutes = max(5, 5 * math.ceil(longest * HEADROOM / 60 / 5))  # whole 5 minutes, at least 5
        if minutes * 60 < min(x for x in limits if x):
            out["runtime"] = minutes
    asked = [j.mem_req_mb for j in done if j.mem_req_mb]
    peaks = [j.peak_rss_mb for j in done if j.peak_rss_mb is not None]
    if asked and len(peaks) == len(done) and max(peaks) < WASTE * min(asked):
        mem = max(1024, 1024 * math.ceil(max(peaks) * HEADROOM / 1024))  # whole GiB
        if mem < min(asked):
            out["mem_mb"] = mem
    cpu_s, alloc_s = sum(j.cpu_s for j in done), sum(j.cpu_alloc_s for j in done)
    if alloc_s and cpu_s / alloc_s < WASTE:
        node_s = sum(j.elapsed_s * j.nodes for j in done)
        used = cpu_s / node_s if node_s else 0.0  # CPUs busy per node, on average
        cpus = max(1, max(j.gpus_per_node for j in done), math.ceil(used * HEADROOM))  # a CPU per GPU at least
        if cpus < min(j.cpus_per_node for j in done):
            out["cpus_per_task"] = cpus
    return out


def per_rule(jobs: Sequence[JobUsage]) -> list[RuleUsage]:
    by_rule: dict[str, list[JobUsage]] = {}
    for job in jobs:
        by_rule.setdefault(job.rule, []).append(job)
    rules = []
    for rule, group in by_rule.items():
        limits = [j.limit_s for j in group if j.limit_s]
        mems = [j.mem_req_mb for j in group if j.mem_req_mb]
        peaks = [j.peak_rss_mb for j in group if j.peak_rss_mb is not None]
        rules.append(
            RuleUsage(
                rule=rule,
                jobs=len(group),
                completed=sum(j.state == "COMPLETED" for j in group),
                nodes=max(j.nodes for j in group),
                gpus_per_node=max(j.gpus_per_node for j in group),
                cpus_per_node=max(j.cpus_per_node for j in group),
                longest_run_s=max(j.longest_run_s for j in group),
                limit_s=max(limits) if limits else None,
                cpu_s=sum(j.cpu_s for j in group),
                cpu_alloc_s=sum(j.cpu_alloc_s for j in group),
                mem_req_mb=max(mems) if mems else None,
                peak_rss_mb=max(peaks) if peaks else None,
                gpu_hours=sum(j.gpu_hours for j in group),
                suggestion=suggest(group),
            )
        )
    return rules


# --- the report -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Report:
    run_id: str
    jobs: list[JobUsage]
    rules: list[RuleUsage]
    unknown: list[str]  # job ids accounting does not know (yet)

    @property
    def gpu_hours(self) -> float:
        return sum(r.gpu_hours for r in self.rules)

    @property
    def active(self) -> list[JobUsage]:
        return [j for j in self.jobs if j.active]


def collect(
    run_id: str,
    subs: Sequence[Submission],
    client: SlurmClient,
    settle_seconds: float = 0.0,
    patient: bool = True,
    sleep: Callable[[float], None] = time.sleep,
    clock_: Callable[[], float] = time.monotonic,
) -> Report:
    """The run's report from one sacct query. With `settle_seconds` (end of a run: the last job ended a moment
    ago, and slurmdbd records that end a moment later) the query is repeated, once a second, while a job still
    shows as active or sacct does not answer. `patient`: transient failures are retried (SlurmClient's policy).
    Raises QueryError when accounting does not answer."""
    by_id: dict[str, Submission] = {}
    for sub in sorted(subs, key=lambda s: s.submitted_at):
        if sub.jobid is not None:
            by_id.setdefault(sub.jobid, sub)  # an adopted job is one job, however many runs name it
    deadline = clock_() + settle_seconds
    while True:
        try:
            runs = parse_accounting(client.accounting(by_id, FIELDS, steps=True, patient=patient))
        except QueryError as err:
            if clock_() >= deadline or not is_transient(str(err)):
                raise  # accounting off is no reason to wait
            sleep(1.0)
            continue
        unsettled = any(r[-1].state in ACTIVE_STATES for r in runs.values()) or len(runs) < len(by_id)
        if not unsettled or clock_() >= deadline:
            break
        sleep(1.0)
    jobs = [job_usage(by_id[j], runs[j]) for j in by_id if j in runs]
    return Report(run_id, jobs, per_rule(jobs), [j for j in by_id if j not in runs])


def _pct(value: float | None) -> str:
    return f"{100 * value:.0f}%" if value is not None else "-"


def _mb(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1024:.1f} GiB" if value >= 1024 else f"{value:.0f} MiB"


def _hours(value: float) -> str:
    return f"{value:.2f}" if value >= 10 else f"{value:.3f}"  # a short test job still shows its GPU-seconds


def _num(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


CSV_COLUMNS = (
    "scope",
    "rule",
    "wildcards",
    "jobid",
    "state",
    "jobs",
    "runs",
    "nodes",
    "gpus_per_node",
    "cpus_per_node",
    "elapsed_s",
    "limit_s",
    "time_used",
    "cpu_s",
    "cpu_efficiency",
    "mem_req_mb",
    "peak_rss_mb",
    "mem_used",
    "gpu_hours",
    "suggestion",
    # the goodput ledger (training jobs only): node-seconds allocated, and per category; productive empty: unknown
    "alloc_node_s",
    "goodput",
    "queue_wait_s",
    *(f"{c}_node_s" for c in CATEGORIES),
)


@dataclass(frozen=True)
class Goodput:
    """The ledgers of several jobs added up (a rule's, the run's): node-seconds and GPU-hours per category."""

    jobs: int
    node_seconds: dict[str, float]
    gpu_hours: float
    known_node_s: float  # allocated node-seconds of the jobs whose productive time is known
    queue_wait_s: float | None
    unknown_jobs: int  # jobs without metrics: their productive time is not counted anywhere

    @property
    def allocated_node_s(self) -> float:
        return sum(self.node_seconds.values())

    @property
    def goodput(self) -> float | None:
        """Productive over allocated node-seconds of the jobs whose productive time is known."""
        return self.node_seconds["productive"] / self.known_node_s if self.known_node_s > 0 else None

    def share(self, category: str) -> float | None:
        total = self.allocated_node_s
        return self.node_seconds[category] / total if total > 0 else None


def goodput_of(jobs: Iterable[JobUsage]) -> Goodput:
    ledgers = [j.ledger for j in jobs if j.training and j.ledger is not None]
    waits = [x.queue_wait_s for x in ledgers if x.queue_wait_s is not None]
    return Goodput(
        jobs=len(ledgers),
        node_seconds={c: sum(x.node_seconds[c] for x in ledgers) for c in CATEGORIES},
        gpu_hours=sum(x.allocated_gpu_h for x in ledgers),
        known_node_s=sum(x.allocated_node_s for x in ledgers if x.known),
        queue_wait_s=sum(waits) if waits else None,
        unknown_jobs=sum(not x.known for x in ledgers),
    )


def _ledger_cells(node_s: dict[str, float], known: bool, goodput: float | None, wait: float | None) -> list[str]:
    cells = [f"{sum(node_s.values()):.1f}", _num(goodput), _num(wait, 1)]
    return cells + ["" if c == "productive" and not known else f"{node_s[c]:.1f}" for c in CATEGORIES]


def to_csv(report: Report) -> str:
    """One line per job, one per rule, one for the run (`scope`); ratios as fractions, empty when unknown."""
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(CSV_COLUMNS)
    for j in report.jobs:
        out.writerow(
            ["job", j.rule, j.wildcards, j.jobid, j.state, 1, j.runs, j.nodes, j.gpus_per_node, j.cpus_per_node]
            + [j.elapsed_s, j.limit_s or "", _num(j.time_used), f"{j.cpu_s:.1f}", _num(j.cpu_efficiency)]
            + [_num(j.mem_req_mb, 0), _num(j.peak_rss_mb, 0), _num(j.mem_used), f"{j.gpu_hours:.6f}", ""]
            + (
                _ledger_cells(j.ledger.node_seconds, j.ledger.known, j.ledger.goodput, j.ledger.queue_wait_s)
                if j.training and j.ledger is not None
                else [""] * (3 + len(CATEGORIES))
            )
        )
    for r in report.rules:
        out.writerow(
            ["rule", r.rule, "", "", "", r.jobs, "", r.nodes, r.gpus_per_node, r.cpus_per_node]
            + [r.longest_run_s, r.limit_s or "", _num(r.time_used), f"{r.cpu_s:.1f}", _num(r.cpu_efficiency)]
            + [_num(r.mem_req_mb, 0), _num(r.peak_rss_mb, 0), _num(r.mem_used), f"{r.gpu_hours:.6f}"]
            + [r.suggestion_text()]
            + _goodput_cells(goodput_of(j for j in report.jobs if j.rule == r.rule))
        )
    cpu_s, alloc_s = sum(r.cpu_s for r in report.rules), sum(r.cpu_alloc_s for r in report.rules)
    out.writerow(
        ["run", "", "", "", "", len(report.jobs), "", "", "", "", "", "", "", f"{cpu_s:.1f}"]
        + [_num(_ratio(cpu_s, alloc_s)), "", "", "", f"{report.gpu_hours:.6f}", ""]
        + _goodput_cells(goodput_of(report.jobs))
    )
    return buf.getvalue()


def _goodput_cells(total: Goodput) -> list[str]:
    if not total.jobs:
        return [""] * (3 + len(CATEGORIES))
    return _ledger_cells(total.node_seconds, total.known_node_s > 0, total.goodput, total.queue_wait_s)


def _md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return [line(header), "|" + "---|" * len(header), *(line(r) for r in rows)]


def to_markdown(report: Report) -> str:
    lines = [f"# Efficiency of run {report.run_id}", ""]
    lines += [
        f"{len(report.jobs)} job(s), {_hours(report.gpu_hours)} GPU-hours allocated. Time: the longest run against the "
        "time limit. CPU: TotalCPU / (Elapsed x AllocCPUS). Memory: peak RSS per node (sampled) against the request.",
        "",
        "## Per rule",
        "",
    ]
    lines += _rules_markdown(report.rules)
    lines += ["", "## Per job", ""]
    lines += _jobs_markdown(report.jobs)
    lines += _gpu_use_markdown(report.jobs)
    lines += _goodput_markdown(report)
    notes = _notes(report)
    return "\n".join(lines + ([""] + [f"- {n}" for n in notes] if notes else []) + [""])


def _rules_markdown(rules: Sequence[RuleUsage]) -> list[str]:
    return _md_table(
        ("rule", "jobs", "nodes x GPUs", "time used", "CPU efficiency", "memory used", "GPU-hours", "request instead"),
        (
            (
                r.rule,
                f"{r.jobs} ({r.completed} completed)",
                f"{r.nodes}x{r.gpus_per_node}",
                f"{clock(r.longest_run_s)} of {clock(r.limit_s) if r.limit_s else 'no limit'} ({_pct(r.time_used)})",
                f"{_pct(r.cpu_efficiency)} of {r.cpus_per_node} CPU(s)/node",
                f"{_mb(r.peak_rss_mb)} of {_mb(r.mem_req_mb)} ({_pct(r.mem_used)})",
                _hours(r.gpu_hours),
                r.suggestion_text() or "-",
            )
            for r in rules
        ),
    )


def _jobs_markdown(jobs: Sequence[JobUsage]) -> list[str]:
    return _md_table(
        ("rule", "wildcards", "job", "state", "runs", "elapsed / limit", "CPU eff.", "peak / memory", "GPU-hours"),
        (
            (
                j.rule,
                j.wildcards or "-",
                j.jobid,
                j.state,
                str(j.runs),
                f"{clock(j.elapsed_s)} / {clock(j.limit_s) if j.limit_s else 'none'}",
                _pct(j.cpu_efficiency),
                f"{_mb(j.peak_rss_mb)} / {_mb(j.mem_req_mb)}",
                _hours(j.gpu_hours),
            )
            for j in jobs
        ),
    )


def _gpu_use_markdown(jobs: Sequence[JobUsage]) -> list[str]:
    """The jobs whose GPU use was sampled; nothing where none was."""
    sampled = [j for j in jobs if j.gpu_use]
    if not sampled:
        return []
    return [
        "",
        "## GPU use per job",
        "",
        "Sampled with nvidia-smi: per node, the mean utilisation and the peak memory of one GPU.",
        "",
        *_md_table(
            ("rule", "wildcards", "job", "per node"),
            ((j.rule, j.wildcards or "-", j.jobid, j.gpu_use) for j in sampled),
        ),
    ]


def _notes(report: Report) -> list[str]:
    """What the figures above leave out: jobs not ended, jobs accounting does not know, memory not sampled."""
    notes = []
    if report.active:
        notes.append(f"{len(report.active)} job(s) had not ended: their figures are partial (report again later).")
    if report.unknown:
        notes.append(f"Not in SLURM's accounting (yet): {', '.join(report.unknown)}.")
    if any(j.peak_rss_mb is None for j in report.jobs):
        notes.append("Memory '-': the job ended before SLURM sampled it (JobAcctGatherFrequency).")
    return notes


def _allocated(node_s: float, gpu_h: float) -> str:
    return f"{_hours(gpu_h)} GPU-h" if gpu_h > 0 else f"{_hours(node_s / 3600)} node-h"


def _goodput_row(name: list[str], node_s: dict[str, float], gpu_h: float, known: bool, goodput: float | None,
                 wait: float | None) -> list[str]:  # fmt: skip
    total = sum(node_s.values())
    shares = ["unknown" if c == "productive" and not known else _pct(node_s[c] / total if total else None)
              for c in CATEGORIES]  # fmt: skip
    return [*name, _allocated(total, gpu_h), *shares, _pct(goodput) if known else "unknown",
            clock(round(wait)) if wait is not None else "-"]  # fmt: skip


def _goodput_markdown(report: Report) -> list[str]:
    """Where each training job's allocation went, and the run's; the queue wait beside it (not allocated)."""
    jobs = [j for j in report.jobs if j.training and j.ledger is not None]
    if not jobs:
        return []
    lines = [
        "",
        "## Where the allocation went",
        "",
        "Per training job: SLURM's Elapsed x nodes of every run (GPU-hours: x GPUs), cut at the job's metrics "
        "records and events (docs/training-contract.md) into shares of it. Goodput: the productive share (steps "
        "that count toward the final model). Lost: steps a later run, relaunch or retry computed again. Queue wait: "
        "beside the allocation, not part of it. A job without metrics: productive unknown, never guessed.",
        "",
    ]
    rows = []
    for j in jobs:
        x = j.ledger
        assert x is not None
        rows.append(_goodput_row([j.rule, j.wildcards or "-", j.jobid], x.node_seconds, x.allocated_gpu_h, x.known,
                                 x.goodput, x.queue_wait_s))  # fmt: skip
    total = goodput_of(jobs)
    rows.append(_goodput_row(["all training jobs", "", f"{total.jobs} job(s)"], total.node_seconds, total.gpu_hours,
                             total.known_node_s > 0, total.goodput, total.queue_wait_s))  # fmt: skip
    lines += _md_table(("rule", "wildcards", "job", "allocated", *CATEGORIES, "goodput", "queue wait"), rows)
    if total.unknown_jobs:
        lines += ["", f"{total.unknown_jobs} job(s) wrote no metrics: the run's goodput leaves them out."]
    if replaced := [j for j in jobs if j.replaced]:
        lines += [
            "",
            "Nodes replaced by spares (or failing their node check) within a job (spare_nodes; the relaunch's time is "
            "in the shares above), stragglers named:",
            "",
        ]
        lines += _md_table(("rule", "wildcards", "job", "dropped -> spare (why)"),
                           ((j.rule, j.wildcards or "-", j.jobid, j.replaced) for j in replaced))  # fmt: skip
    return lines


def write(report: Report, workdir: Path) -> tuple[Path, Path]:
    folder = workdir / REPORTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    paths = (folder / f"{report.run_id}.csv", folder / f"{report.run_id}.md")
    for path, text in zip(paths, (to_csv(report), to_markdown(report)), strict=True):
        try:
            if why := foreign(path.lstat().st_uid):  # never read, but not overwritten unsaid
                ignored(Damaged(path, why), "replaced by this run's report")
        except FileNotFoundError:
            pass
        write_text(path, text)
    return paths


def write_text(path: Path, text: str) -> None:
    """Whole or not at all: a reader (or Snakemake, checking an output) never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def summary_lines(report: Report, markdown: Path) -> list[str]:
    """The few lines Snakemake prints at the end of a run."""
    lines = [
        f"efficiency of run {report.run_id}: {len(report.jobs)} job(s), {_hours(report.gpu_hours)} GPU-hours; "
        f"report: {markdown}"
    ]
    for r in report.rules:
        limit = clock(r.limit_s) if r.limit_s else "no limit"
        line = (
            f"  {r.rule}: {r.jobs} job(s), {r.nodes}x{r.gpus_per_node}, longest {clock(r.longest_run_s)} of {limit}, "
            f"CPU {_pct(r.cpu_efficiency)} of {r.cpus_per_node}/node, memory {_mb(r.peak_rss_mb)} of "
            f"{_mb(r.mem_req_mb)}, {_hours(r.gpu_hours)} GPU-h"
        )
        lines.append(line + (f"; request instead: {r.suggestion_text()}" if r.suggestion else ""))
    if report.active:
        lines.append(f"  {len(report.active)} job(s) still running: `multinode report --run {report.run_id}` later")
    return lines


def end_of_run(workdir: Path, run_id: str, client: SlurmClient, queued: bool = False) -> list[str]:
    """The report at the end of a Snakemake run (the adapter's shutdown): written, and its summary returned as
    lines to print. Never raises: a report is no reason to fail a run."""
    subs = run_table(workdir).get(run_id, [])
    if not subs:
        return []
    later = f"`multinode report --run {run_id}`"
    if queued:
        return [f"efficiency report: the jobs are queued (--immediate-submit); run {later} once they have ended"]
    try:
        # not patient: the run's end waits SETTLE_SECONDS for accounting at most, not the retry budget
        report = collect(run_id, subs, client, settle_seconds=SETTLE_SECONDS, patient=False)
        _, markdown = write(report, workdir)
    except (QueryError, OSError) as err:
        return [f"efficiency report: not written ({err}); run {later} later"]
    return summary_lines(report, markdown)
