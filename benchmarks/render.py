"""Render the benchmark tables and figures of the READMEs from the committed result files.

    python benchmarks/render.py            # rewrite every generated block in place
    python benchmarks/render.py --check    # exit 1 and print a diff where a file differs from its rendering

The Markdown files (FILES) keep their hand-written prose; every generated block sits between two markers:

    <!-- render:NAME -->
    | a | table |
    <!-- /render:NAME -->

A renderer's text of several lines (a table, a list) goes on lines of its own between the markers, with a blank line
on each side; a one-line text (a figure in a sentence) goes inline: `took <!-- render:x -->323 s<!-- /render:x -->`.
Never begin a line with an inline marker: Markdown would read the line as an HTML block. A name may appear in
several files (the same figure in README.md and benchmarks/README.md); an unknown name, an unclosed marker or a
renderer no file uses is an error.

Renderers select result lines by explicit keys with `line(FILE, variant=..., call=...)`: no line, or more than
one, is a MissingResult that names the file and the keys, never an empty row. A ratio between two lines is taken
only when both ran in one run (`ratio(..., run=KEY)` refuses lines whose KEY differs): figures from different device
calls or runs are shown side by side with their run, never divided.

Adding a table (e.g. a new GPU measurement, `benchmarks/gpu/results-h200-issue33.jsonl`):

1. commit the result file, each line with the keys that tell its lines apart (`variant`, and `run` or `call` when
   the file holds several device calls);
2. add one function here, next to the other GPU tables:

       I33 = "benchmarks/gpu/results-h200-issue33.jsonl"

       @renders("issue33-throughput")
       def issue33_throughput() -> str:
           rows = []
           for label, variant in [("bf16", "torch_ddp+compile"), ("the new option", "torch_ddp+compile+new")]:
               r = line(I33, variant=variant)
               rows.append([label, f1(r["step_ms"]), n0(r["tokens_per_s"]), pct(r["mfu"])])
           return table(["variant", "step ms", "tokens/s", "MFU"], rows)

3. put `<!-- render:issue33-throughput -->` and `<!-- /render:issue33-throughput -->` on lines of their own where
   the table goes in benchmarks/README.md, run `python benchmarks/render.py`, and commit the README with it.
   tests/unit/test_benchmark_tables.py fails while a README differs from what this script renders.

A figure in prose is the same: a function that returns one line, and an inline marker pair around the figure.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import re
import sys
from collections.abc import Callable, Iterable
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FILES = ("README.md", "CONTRIBUTING.md", "benchmarks/README.md", "docs/evidence.md", "docs/first-job.md")

CHAIN_1202 = "benchmarks/results-chain-overhead-2026-12-02.json"  # restored verbatim from commit fbf9502
CHAIN_1203 = "benchmarks/results-chain-overhead-2026-12-03.json"  # moved from results-chain-overhead.json (issue 51)
CHAIN = "benchmarks/results-chain-overhead.json"
FANOUT = "benchmarks/results-fanout.json"
BREAKDOWN = "benchmarks/results-chain-breakdown.json"  # one run of chain_breakdown.py: floor and multinode side by side
STATE = "benchmarks/results-state-scaling.json"
LAUNCH = "benchmarks/results-launch.json"
GOODPUT = "benchmarks/results-goodput.json"  # one run of goodput.py: every variant side by side, the baseline too
GOODPUT_MODEL = "benchmarks/results-goodput-model.json"  # goodput_model.py on GOODPUT and CKPT_ASYNC_H100
RESTART = "benchmarks/results-restart.json"  # one run of restart.py: rounds of the hung- and crashed-rank tests
H200 = "benchmarks/gpu/results-h200.jsonl"  # one device run, 2026-12-02
I14 = "benchmarks/gpu/results-h200-issue14.jsonl"  # runs A-F: key "run", told apart by its letter
DET = "benchmarks/gpu/results-h200-determinism.jsonl"  # one device run
I26 = "benchmarks/gpu/results-h200-issue26.jsonl"  # calls A-E: key "call"
I33 = "benchmarks/gpu/results-h200-issue33.jsonl"  # one measuring call, "issue33-throughput"; later calls by "call"

PEAK_BF16 = 989e12  # H200 dense bf16 FLOP/s, the MFU denominator every GPU result line uses


class MissingResult(LookupError):
    """A result file, a key inside it, or the one line a renderer selects, is not there."""


class MarkerError(ValueError):
    """A marker names no renderer, is not closed, or a renderer is used by no file."""


# ---------------------------------------------------------------------------------------------------------------
# Reading result files


@functools.cache
def _load(path: Path) -> Any:
    if not path.is_file():
        raise MissingResult(f"{path.relative_to(ROOT)}: no such result file")
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(row) for row in text.splitlines() if row.strip()]
    return json.loads(text)


def data(rel: str, *path: str | int) -> Any:
    """The JSON value at `path` inside result file `rel` (relative to the repository)."""
    value = _load(ROOT / rel)
    for i, key in enumerate(path):
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            where = "".join(f"[{k!r}]" for k in path[: i + 1])
            raise MissingResult(f"{rel}: no {where}") from None
    return value


class Prefix(str):
    """A key value that matches any string starting with it (issue 14's run labels: `Prefix("A:")`)."""

    def __repr__(self) -> str:
        return f"{str(self)!r}..."


def _matches(row: dict[str, Any], keys: dict[str, Any]) -> bool:
    for key, want in keys.items():
        if key not in row:
            return False
        if isinstance(want, Prefix):
            if not (isinstance(row[key], str) and row[key].startswith(want)):
                return False
        elif row[key] != want:
            return False
    return True


def lines(rel: str, *path: str | int, **keys: Any) -> list[dict[str, Any]]:
    """Every line of `rel` (at `path`, for a JSON file) that has all `keys`; at least one, else MissingResult."""
    rows = data(rel, *path)
    found = [row for row in rows if isinstance(row, dict) and _matches(row, keys)]
    if not found:
        where = "".join(f"[{k!r}]" for k in path)
        raise MissingResult(f"{rel}{where}: no result line with {_describe(keys)}")
    return found


def line(rel: str, *path: str | int, **keys: Any) -> dict[str, Any]:
    """The one line of `rel` that has all `keys`: none or several is a MissingResult naming the file and keys."""
    found = lines(rel, *path, **keys)
    if len(found) > 1:
        where = "".join(f"[{k!r}]" for k in path)
        raise MissingResult(f"{rel}{where}: {len(found)} result lines with {_describe(keys)}; select by more keys")
    return found[0]


def _describe(keys: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in keys.items())


def field(row: dict[str, Any], key: str) -> Any:
    """row[key], or a MissingResult naming the line."""
    if key not in row:
        raise MissingResult(f"result line {_short(row)} has no {key!r}")
    return row[key]


def _short(row: dict[str, Any]) -> str:
    return (
        "{"
        + ", ".join(f"{k}={row[k]!r}" for k in ("run", "call", "variant", "launcher", "mode", "nodes") if k in row)
        + "}"
    )


def ratio(a: dict[str, Any], b: dict[str, Any], key: str, run: str | None) -> float:
    """a[key] / b[key], both from one run: when `run` names the key that tells runs apart, it must be equal."""
    if run is not None and field(a, run) != field(b, run):
        raise MissingResult(f"no ratio across runs: {_short(a)} against {_short(b)}")
    return float(field(a, key)) / float(field(b, key))


# ---------------------------------------------------------------------------------------------------------------
# Formatting


def fixed(x: float | Decimal, digits: int) -> str:
    """x with `digits` decimals, rounded half up from the value as the file writes it (0.4135 -> 41.4%, not 41.3%)."""
    d = x if isinstance(x, Decimal) else Decimal(repr(float(x)))
    return str(d.quantize(Decimal(1).scaleb(-digits), ROUND_HALF_UP))


def f0(x: float) -> str:
    return fixed(x, 0)


def f1(x: float) -> str:
    return fixed(x, 1)


def f2(x: float) -> str:
    return fixed(x, 2)


def f3(x: float) -> str:
    return fixed(x, 3)


def f4(x: float) -> str:
    return fixed(x, 4)


def n0(x: float) -> str:
    return f"{x:,.0f}"


def _percent(x: float) -> Decimal:
    return Decimal(repr(float(x))) * 100


def pct(x: float, digits: int = 1) -> str:
    """A fraction as a percentage: 0.4103 -> 41.0%."""
    return fixed(_percent(x), digits) + "%"


def pct_span(values: Iterable[float]) -> str:
    """A range of fractions as percentages: 40.2-40.5%."""
    return span((_percent(v) for v in values), f1) + "%"


def points(a: float, b: float) -> str:
    """a - b in percentage points, from the values as the file writes them: 0.4497 - 0.4292 -> +2.1."""
    return f"{'+' if a >= b else ''}{fixed(_percent(a) - _percent(b), 1)}"


def change(r: float) -> str:
    """A ratio as a signed change: 1.037 -> +3.7%."""
    return f"{'+' if r >= 1 else ''}{pct(r - 1)}"


def span(values: Iterable[Any], fmt: Callable[[Any], str], sep: str = "-") -> str:
    """The range of values, or one value when they are all equal after formatting."""
    vals = sorted(values)
    lo, hi = fmt(vals[0]), fmt(vals[-1])
    return lo if lo == hi else f"{lo}{sep}{hi}"


def each(values: Iterable[Any], fmt: Callable[[Any], str]) -> str:
    return " / ".join(fmt(v) for v in values)


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(out)


def bold(s: str) -> str:
    return f"**{s}**"


# ---------------------------------------------------------------------------------------------------------------
# The renderers

RENDERERS: dict[str, Callable[[], str]] = {}


def renders(name: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    def register(fn: Callable[[], str]) -> Callable[[], str]:
        if name in RENDERERS:
            raise MarkerError(f"two renderers named {name!r}")
        RENDERERS[name] = fn
        return fn

    return register


# --- Chain of 10 jobs: chain_overhead.py ------------------------------------------------------------------------

CHAIN_FLOOR, CHAIN_MN, CHAIN_INNER = "handwritten afterok chain", "multinode", "multinode --multinode-inner-snakemake"
CHAIN_OFFICIAL = "official slurm plugin, 1 s checks"


@renders("chain-2026-12-02")
def chain_first() -> str:
    labels = [
        (CHAIN_FLOOR, "hand-written `sbatch --dependency=afterok` chain (the floor)", False),
        (CHAIN_MN, "**`--executor multinode`** (plain shell rules run directly)", True),
        (CHAIN_INNER, "`--executor multinode --multinode-inner-snakemake` (Snakemake once inside each job)", False),
        (
            CHAIN_OFFICIAL,
            "official `snakemake-executor-plugin-slurm` 2.8.0, `--seconds-between-status-checks 1`",
            False,
        ),
    ]
    rows = []
    for variant, label, strong in labels:
        r = line(CHAIN_1202, variant=variant)
        over, rpcs = f2(r["overhead_per_job_s"]), f1(r["rpcs_per_job"])
        rows.append([label, f2(r["wall_s"]), bold(over) if strong else over, bold(rpcs) if strong else rpcs])
    return table(["variant", "wall s", "overhead / job s", "slurmctld RPCs / job"], rows)


@renders("chain-2026-12-02-targets")
def chain_first_targets() -> str:
    mn, floor = line(CHAIN_1202, variant=CHAIN_MN), line(CHAIN_1202, variant=CHAIN_FLOOR)
    official = line(CHAIN_1202, variant=CHAIN_OFFICIAL)
    met = mn["overhead_per_job_s"] <= 2 and mn["rpcs_per_job"] <= 4
    return (
        f"{'met' if met else 'not met'} ({f2(mn['overhead_per_job_s'])} s, {f1(mn['rpcs_per_job'])} RPCs; "
        f"{f2(ratio(mn, floor, 'overhead_per_job_s', None))}x the hand-written floor, "
        f"{f0(ratio(official, mn, 'overhead_per_job_s', None))}x less overhead than the official plugin in the same "
        "run)"
    )


def _chain_runs(jobs: int, variant: str, rel: str = CHAIN_1203) -> list[dict[str, Any]]:
    return sorted(lines(rel, jobs=jobs, variant=variant), key=lambda r: r["repeat"])


def _chain_table(rel: str, with_load: bool) -> str:
    """One value per run of chain_overhead.py (each run with every variant side by side), 10 and 30 jobs."""
    rows = []
    for jobs in (10, 30):
        floors = _chain_runs(jobs, CHAIN_FLOOR, rel)
        for variant, label in [(CHAIN_FLOOR, "hand-written (the floor)"), (CHAIN_MN, "**multinode**"),
                               (CHAIN_INNER, "multinode `--multinode-inner-snakemake`")]:  # fmt: skip
            runs = _chain_runs(jobs, variant, rel)
            if [r["repeat"] for r in runs] != [r["repeat"] for r in floors]:
                raise MissingResult(f"{rel}: {variant!r} ({jobs} jobs) and the floor ran different repeats")
            over = [r["overhead_per_job_s"] for r in runs]
            after = [r["overhead_per_job_after_start_s"] for r in runs]
            ratios = [a / f["overhead_per_job_s"] for a, f in zip(over, floors, strict=True)]
            ratios_after = [a / f["overhead_per_job_after_start_s"] for a, f in zip(after, floors, strict=True)]
            rows.append([
                str(jobs), label, each(over, f2), each(ratios, f2), each((r["run_start_s"] for r in runs), f2),
                each(after, f2), each(ratios_after, f2), span((r["rpcs_per_job"] for r in runs), f1),
            ])  # fmt: skip
            if with_load:
                rows[-1].append(each((r["loadavg_before"][0] for r in runs), str))
    header = ["jobs", "variant", "overhead / job s", "ratio to the floor", "start s", "after start s",
              "ratio after start", "RPCs / job"]  # fmt: skip
    return table(header + (["load before (1 min)"] if with_load else []), rows)


@renders("chain-2026-12-03")
def chain_remeasured() -> str:
    return _chain_table(CHAIN_1203, with_load=False)


@renders("chain-issue51")
def chain_issue51() -> str:
    return _chain_table(CHAIN, with_load=True)


CHAIN_TARGET = 1.1  # issue 51: multinode's overhead per job against the floor's, measured in the same run


@renders("chain-issue51-ten")
def chain_issue51_ten() -> str:
    mn, floors = _chain_runs(10, CHAIN_MN, CHAIN), _chain_runs(10, CHAIN_FLOOR, CHAIN)
    over, floor = [m["overhead_per_job_s"] for m in mn], [f["overhead_per_job_s"] for f in floors]
    ratios = [o / f for o, f in zip(over, floor, strict=True)]
    after = [m["overhead_per_job_after_start_s"] / f["overhead_per_job_after_start_s"] for m, f in zip(mn, floors,
             strict=True)]  # fmt: skip
    met = sum(r <= CHAIN_TARGET for r in ratios)
    return (
        f"{span(over, f2)} s per job against the floor's {span(floor, f2)} s in the same runs: "
        f"{', '.join(f2(r) + 'x' for r in ratios)}; the {CHAIN_TARGET}x target is met in {met} of {len(ratios)} runs. "
        f"Without Snakemake's start (the same command with nothing to do: {span((m['run_start_s'] for m in mn), f2)} "
        f"s) each job costs {', '.join(f2(r) + 'x' for r in after)} the floor's"
    )


@renders("chain-issue51-thirty")
def chain_issue51_thirty() -> str:
    mn, floors = _chain_runs(30, CHAIN_MN, CHAIN), _chain_runs(30, CHAIN_FLOOR, CHAIN)
    pairs = list(zip(mn, floors, strict=True))
    overall = [m["overhead_per_job_s"] / f["overhead_per_job_s"] for m, f in pairs]
    after = [m["overhead_per_job_after_start_s"] / f["overhead_per_job_after_start_s"] for m, f in pairs]
    return f"{' and '.join(f2(r) + 'x' for r in overall)} overall, {' and '.join(f2(r) + 'x' for r in after)} per job"


@renders("chain-2026-12-03-ten")
def chain_remeasured_ten() -> str:
    mn, floors = _chain_runs(10, CHAIN_MN), _chain_runs(10, CHAIN_FLOOR)
    over, floor = [m["overhead_per_job_s"] for m in mn], [f["overhead_per_job_s"] for f in floors]
    start, after = [m["run_start_s"] for m in mn], [m["overhead_per_job_after_start_s"] for m in mn]
    return (
        f"{span(over, f2)} s against the hand-written floor's {span(floor, f2)} s "
        f"({span((o / f for o, f in zip(over, floor, strict=True)), f2)}x), in every run. Most of the gap is "
        f"Snakemake's once-per-run start ({span(start, f2)} s, measured as the same command with nothing to do); "
        f"without it each job costs {span(after, f2)} s "
        f"({span((a / f for a, f in zip(after, floor, strict=True)), f2)}x)"
    )


@renders("chain-2026-12-03-thirty")
def chain_remeasured_thirty() -> str:
    mn, floors = _chain_runs(30, CHAIN_MN), _chain_runs(30, CHAIN_FLOOR)
    pairs = list(zip(mn, floors, strict=True))
    overall = [m["overhead_per_job_s"] / f["overhead_per_job_s"] for m, f in pairs]
    after = [m["overhead_per_job_after_start_s"] / f["overhead_per_job_after_start_s"] for m, f in pairs]
    return f"{' and '.join(f2(r) + 'x' for r in overall)} overall, {' and '.join(f2(r) + 'x' for r in after)} per job"


# --- Where each job's time goes: chain_breakdown.py -------------------------------------------------------------

BD_FLOOR, BD_MN = "handwritten afterok chain", "multinode"
# (the row's words, the floor's step, multinode's step): each step as chain_breakdown.py names it in the result file
BD_STEPS = [
    ("the job script's tail (command end -> exit marker)", None,
     "job: command end -> exit marker (the job script's tail)"),
    ("the end noticed (exit marker -> status cycle done)", None, "plugin: exit marker -> status cycle done (wake)"),
    ("the plugin ends the job (registry, provenance)", None, "plugin: the job's end (registry, provenance)"),
    ("Snakemake: the end handled, the next job handed over", None, "Snakemake: end reported -> next job handed over"),
    ("&nbsp;&nbsp;of which output checks, DAG update, job selection", None,
     "  of which output checks, DAG update, job selection"),
    ("the plugin plans the job", None, "plugin: plan"),
    ("the plugin writes its script, provenance and record", None, "plugin: script, provenance and record written"),
    ("sbatch", None, "sbatch"),
    ("the rest of the submission", None, "plugin: rest of the submission"),
    ("SLURM: the job completes", "SLURM: command end -> job complete", None),
    ("SLURM: to the next job's allocation (its scheduling pass)",
     "SLURM: complete -> next job allocated (its scheduling pass)",
     "SLURM: submitted -> allocated (its scheduling pass)"),
    ("SLURM: allocation -> command start (launch, the script's start)",
     "SLURM: allocated -> command start (launch, script start)",
     "SLURM: allocated -> command start (launch, script start)"),
]  # fmt: skip


def _bd(variant: str) -> dict[str, Any]:
    return data(BREAKDOWN, variant)


@renders("chain-breakdown-steps")
def chain_breakdown_steps() -> str:
    floor, ours = _bd(BD_FLOOR), _bd(BD_MN)
    rows = []
    for words, f, m in BD_STEPS:
        rows.append([words, f3(data(BREAKDOWN, BD_FLOOR, "per_job", f)) if f else "-",
                     f3(data(BREAKDOWN, BD_MN, "per_job", m)) if m else "-"])  # fmt: skip
    mean = [f3(sum(r["gaps_s"]) / len(r["gaps_s"])) for r in (floor, ours)]
    rows.append(["**a job's end to the next job's start (mean gap)**", *(bold(x) for x in mean)])
    rows.append(["upper quartile of the gaps (the guard's figure)", f3(floor["upper_quartile_gap_s"]),
                 f3(ours["upper_quartile_gap_s"])])  # fmt: skip
    rows.append(["each gap", each(floor["gaps_s"], f2), each(ours["gaps_s"], f2)])
    return table(["from one job's end to the next job's start, mean over the chain", "floor s", "multinode s"], rows)


@renders("chain-breakdown-run")
def chain_breakdown_run() -> str:
    floor, ours = _bd(BD_FLOOR), _bd(BD_MN)
    rows = [[f"start: {k}", f3(v)] for k, v in ours["start"].items()]
    rows += [[f"end: {k}", f3(v)] for k, v in ours["end"].items()]
    rows.append(
        ["wall time of the chain (the floor's in the same run)", f"{f2(ours['wall_s'])} ({f2(floor['wall_s'])})"]
    )
    rows.append(["overhead per job, start and end included (the floor's)",
                 f"{f3(ours['overhead_per_job_s'])} ({f3(floor['overhead_per_job_s'])})"])  # fmt: skip
    return table(["multinode, once per run", "s"], rows)


@renders("chain-breakdown-rpcs")
def chain_breakdown_rpcs() -> str:
    floor, ours = _bd(BD_FLOOR)["rpcs"], _bd(BD_MN)["rpcs"]
    kinds = sorted(set(floor) | set(ours), key=lambda k: (-(floor.get(k, 0) + ours.get(k, 0)), k))
    rows = [[f"`{k}`", str(floor.get(k, 0)), str(ours.get(k, 0))] for k in kinds]
    rows.append(["per job", f2(_bd(BD_FLOOR)["rpcs_per_job"]), f2(_bd(BD_MN)["rpcs_per_job"])])
    return table(["slurmctld RPCs of the run, by message", "floor", "multinode"], rows)


@renders("chain-breakdown-cpu")
def chain_breakdown_cpu() -> str:
    rows = [
        [f"`{r['checkout']}`", f3(r["import_cpu_s"]), f3(r["to_first_submission"]), f4(r["per_job"]),
         f3(r["mean_gap_s"]), f3(r["upper_quartile_gap_s"]), r["loadavg_before"][0]]
        for r in data(BREAKDOWN, "cpu_by_checkout")
    ]  # fmt: skip
    header = ["plugin at", "CPU: importing the adapter s", "CPU: Snakemake's process to the first sbatch s",
              "CPU: per further job s", "mean gap s", "upper-quartile gap s", "load"]  # fmt: skip
    return table(header, rows)


@renders("chain-breakdown-profile")
def chain_breakdown_profile() -> str:
    top = data(BREAKDOWN, "profile_of_a_second_multinode_run", "plugin_by_time_inside")[:8]
    rows = [[f"`{r['function']}`", str(r["calls"]), f3(r["inside_s"])] for r in top]
    return table(["the plugin's functions, by time inside them (cProfile, every thread)", "calls", "s"], rows)


@renders("chain-breakdown-load")
def chain_breakdown_load() -> str:
    before, after = data(BREAKDOWN, "loadavg_before"), data(BREAKDOWN, "loadavg_after")
    return f"{' '.join(before)} before and {' '.join(after)} after (1, 5, 15 minutes)"


@renders("chain-breakdown-ratio")
def chain_breakdown_ratio() -> str:
    return f"{f2(data(BREAKDOWN, 'per_job_ratio'))}x"


# --- Fan-out of 500 jobs: fanout.py -----------------------------------------------------------------------------

FAN_FLOOR, FAN_HAND_ARRAY = "handwritten sbatch fan-out + afterok", "handwritten job array + afterok"
FAN_ARRAY, FAN_NO_ARRAYS = "multinode (one job array)", "multinode --multinode-no-arrays"
FAN_THREE = "shell_start_line_three_runs"  # three runs, each variant side by side in each
FAN_BEFORE = "first_run_with_long_and_official"  # before the issue's fixes
FAN_PARSER = "after_start_line_fix"  # after `multinode provenance --start` skipped the parser's imports
FAN_TARGET = 1.2  # overhead per job against the floor's


def _fan_runs(variant: str) -> list[dict[str, Any]]:
    return [
        line(FANOUT, FAN_THREE, "runs", i, "rows", variant=variant) for i in range(len(data(FANOUT, FAN_THREE, "runs")))
    ]


def _fan_ratios(variant: str) -> list[float]:
    return [
        r["overhead_per_job_s"] / f["overhead_per_job_s"]
        for r, f in zip(_fan_runs(variant), _fan_runs(FAN_FLOOR), strict=True)
    ]


def _fan_one_run(key: str) -> list[str]:
    floor = line(FANOUT, key, "rows", variant=FAN_FLOOR)
    pair = [line(FANOUT, key, "rows", variant=v) for v in (FAN_ARRAY, FAN_NO_ARRAYS)]
    return [
        each((r["wall_s"] for r in pair), f1),
        each((r["overhead_per_job_s"] for r in pair), f3),
        each((r["overhead_per_job_s"] / floor["overhead_per_job_s"] for r in pair), f2),
        each((r["rpcs_per_job"] for r in pair), f2),
        each((r["snakemake_cpu_s"] for r in pair), f1),
    ]


@renders("fanout-500")
def fanout_table() -> str:
    rows = []
    for variant, label, strong in [
        (FAN_FLOOR, 'hand-written: 500 x `sbatch --wrap "sleep 1"`, then `--dependency=afterok:<all>` '
                    "(**the floor**)", False),
        (FAN_HAND_ARRAY, "hand-written job array: one `sbatch --array=0-499`, then afterok (the floor for "
                         "arrays)", False),
        (FAN_ARRAY, "**multinode** (the 500 as one job array)", True),
        (FAN_NO_ARRAYS, "multinode `--multinode-no-arrays` (500 paced sbatch calls)", False),
    ]:  # fmt: skip
        runs = _fan_runs(variant)
        cells = [
            each((r["wall_s"] for r in runs), f1),
            each((r["overhead_per_job_s"] for r in runs), f3),
            "1" if variant == FAN_FLOOR else each(_fan_ratios(variant), f2),
            span((r["rpcs_per_job"] for r in runs), f2),
        ]
        cells = [bold(c) for c in cells] if strong else cells
        cpu = [r["snakemake_cpu_s"] for r in runs] if "snakemake_cpu_s" in runs[0] else []
        rows.append([label, *cells, span(cpu, f1) if cpu else "-"])
    rows.append(
        ["before this issue's fixes (one run: array / no arrays, against its own floor)", *_fan_one_run(FAN_BEFORE)]
    )
    rows.append([
        "after the parser skip, before the shell start line (one run: array / no arrays, against its own floor)",
        *_fan_one_run(FAN_PARSER),
    ])  # fmt: skip
    header = ["variant", "wall s (3 runs)", "overhead / job s", "ratio to the floor", "slurmctld RPCs / job",
              "Snakemake CPU s"]  # fmt: skip
    return table(header, rows)


@renders("fanout-cpu")
def fanout_cpu() -> str:
    return f"{span((r['snakemake_cpu_s'] for r in _fan_runs(FAN_ARRAY)), f1)} s"


@renders("fanout-floor")
def fanout_floor() -> str:
    return f"{span((r['overhead_per_job_s'] for r in _fan_runs(FAN_FLOOR)), f3, ' to ')} s per job"


@renders("fanout-target")
def fanout_target() -> str:
    arr, ind = _fan_ratios(FAN_ARRAY), _fan_ratios(FAN_NO_ARRAYS)
    missed = [sum(r > FAN_TARGET for r in rs) for rs in (arr, ind)]
    return (
        f"the array was {span(arr, f2)}x the floor, and the individual submissions {span(ind, f2)}x: the "
        f"{FAN_TARGET}x target was missed in {missed[0]} of {len(arr)} runs for the array ({', '.join(map(f2, arr))}) "
        f"and in {missed[1]} of {len(ind)} for the individual submissions ({', '.join(map(f2, ind))})"
    )


@renders("fanout-arrays")
def fanout_arrays() -> str:
    arr, ind = _fan_runs(FAN_ARRAY), _fan_runs(FAN_NO_ARRAYS)
    return (
        f"from {span((r['rpcs_per_job'] for r in ind), f2)} to {span((r['rpcs_per_job'] for r in arr), f2)}, and "
        f"Snakemake's CPU time from {span((r['snakemake_cpu_s'] for r in ind), f1)} s to "
        f"{span((r['snakemake_cpu_s'] for r in arr), f1)} s"
    )


@renders("fanout-long")
def fanout_long() -> str:
    r = line(FANOUT, FAN_BEFORE, "rows", variant="multinode, 2000 sleep-0 jobs, --jobs 24")
    return (
        f"{n0(r['jobs'])} `sleep 0` jobs with `--jobs 24` through the status loop: rc 0 in {f0(r['wall_s'])} s, "
        f"{f2(r['rpcs_per_job'])} RPCs per job, Snakemake's CPU time {f0(r['snakemake_cpu_s'])} s. Snakemake's "
        f"resident memory was flat: {f1(r['rss_first_quarter_mb'])} MB mean in the first quarter of the run and "
        f"{f1(r['rss_last_quarter_mb'])} MB in the last, {f0(r['snakemake_peak_rss_mb'])} MB at its peak"
    )


@renders("fanout-official")
def fanout_official() -> str:
    rows = {k: line(FANOUT, FAN_BEFORE, "rows", variant=v) for k, v in [
        ("official", "official slurm plugin, small fan-out, 1 s checks"), ("mn", "multinode, small fan-out"),
        ("floor", "handwritten, small fan-out")]}  # fmt: skip
    o, m, f = rows["official"], rows["mn"], rows["floor"]
    return (
        f"{o['jobs']}: {f1(o['wall_s'])} s ({f2(o['overhead_per_job_s'])} s overhead per job, {f2(o['rpcs_per_job'])} "
        f"RPCs per job). In the same run multinode took {f1(m['wall_s'])} s ({f2(m['overhead_per_job_s'])} s, "
        f"{f2(m['rpcs_per_job'])} RPCs) and the floor {f1(f['wall_s'])} s ({f3(f['overhead_per_job_s'])} s, "
        f"{f2(f['rpcs_per_job'])} RPCs)"
    )


FAN_1000 = "issue51_1000_jobs"  # issue 51: 1,000 jobs, every variant side by side in one run
FAN_1000_TARGET = 1.1  # multinode's wall time against the floor's


@renders("fanout-1000")
def fanout_1000() -> str:
    floor = line(FANOUT, FAN_1000, "rows", variant=FAN_FLOOR)
    rows = []
    for variant, label in [(FAN_FLOOR, "hand-written: 1,000 x `sbatch`, then afterok (**the floor**)"),
                           (FAN_HAND_ARRAY, "hand-written job array, then afterok"),
                           (FAN_ARRAY, "**multinode** (one job array per round Snakemake hands over)"),
                           (FAN_NO_ARRAYS, "multinode `--multinode-no-arrays`")]:  # fmt: skip
        r = line(FANOUT, FAN_1000, "rows", variant=variant)
        cpu = f1(r["snakemake_cpu_s"]) if "snakemake_cpu_s" in r else "-"
        rows.append([label, f1(r["wall_s"]), f2(r["wall_s"] / floor["wall_s"]), f3(r["overhead_per_job_s"]),
                     f2(r["rpcs_per_job"]), cpu, " ".join(r["loadavg_before"])])  # fmt: skip
    header = ["variant", "wall s", "wall / the floor's", "overhead / job s", "slurmctld RPCs / job",
              "Snakemake CPU s", "load before (1, 5, 15 min)"]  # fmt: skip
    return table(header, rows)


@renders("fanout-1000-target")
def fanout_1000_target() -> str:
    floor, ours = (line(FANOUT, FAN_1000, "rows", variant=v) for v in (FAN_FLOOR, FAN_ARRAY))
    r = ours["wall_s"] / floor["wall_s"]
    return (
        f"{f2(r)}x the floor's wall time ({f1(ours['wall_s'])} s against {f1(floor['wall_s'])} s): the "
        f"{FAN_1000_TARGET}x target is {'met' if r <= FAN_1000_TARGET else 'missed'}; "
        f"{f2(ours['rpcs_per_job'])} slurmctld RPCs per job against the floor's {f2(floor['rpcs_per_job'])}"
    )


# --- State that stays flat: state_scaling.py --------------------------------------------------------------------


def _whole(x: float) -> str:
    return n0(x) if x >= 10 else f"{x:.2g}"


@renders("state-reattach")
def state_reattach() -> str:
    rows = []
    for runs in (0, 10, 100):
        r = line(STATE, "reattach", earlier_runs=runs)
        rows.append([
            str(runs), n0(r["records"]), f3(r["index_ms_per_job"]), _whole(r["full_scan_ms_per_job"]),
            f"{f3(r['index_run_total_s'])} s against {_whole(r['full_scan_run_total_s'])} s",
        ])  # fmt: skip
    header = ["earlier runs of 500 jobs", "records", "reattach lookup, index (ms/job)",
              "reading the whole history (ms/job, the former way)", "a 500-job run spends"]  # fmt: skip
    return table(header, rows)


@renders("state-cycle")
def state_cycle() -> str:
    rows = []
    for jobs in (10, 500):
        r = line(STATE, "status_cycle_file_syscalls", running_jobs=jobs)
        rows.append([str(jobs), f"{f0(r['listing'])}", f"{f0(r['open_per_job'])}"])
    return table(
        ["running jobs", "file system calls per status cycle, one listing", "one open() per job (the former way)"], rows
    )


# --- Launch: launch.py ------------------------------------------------------------------------------------------

NODES = (2, 4, 8)


def _launch(launcher: str, nodes: int, mode: str = "ok") -> dict[str, Any]:
    return line(LAUNCH, "summary", launcher=launcher, nodes=nodes, mode=mode)


@renders("launch-ok")
def launch_ok() -> str:
    rows = []
    for nodes in NODES:
        for launcher in ("step", "per-node"):
            r, step = _launch(launcher, nodes), launcher == "step"
            b = bold if step else str
            rows.append([
                b(launcher), str(nodes), f3(r["first_task_s"]), b(f3(r["fanout_s"])), f2(r["workers_s"]),
                b(f2(r["launch_s"])), b(str(r["launcher_rpcs"])),
            ])  # fmt: skip
    header = ["launcher", "nodes", "first torchrun s", "fan-out s", "workers up s", "launch s", "slurmctld RPCs"]
    return table(header, rows)


@renders("launch-fail")
def launch_fail() -> str:
    rows = []
    for mode in ("fail", "fail-term"):
        for launcher in ("step", "per-node"):
            rs = [_launch(launcher, n, mode) for n in NODES]
            total_blocked = [(n - 1) * r["n"] for n, r in zip(NODES, rs, strict=True)]
            alive = [r["survivors_left"] for r in rs]
            alive_s = (
                "all"
                if alive == total_blocked
                else f"{', '.join(map(str, alive))} of {', '.join(map(str, total_blocked))}"
            )
            gone = span((r["all_ranks_gone_s"] for r in rs if r["all_ranks_gone_s"] is not None), f1)
            if mode == "fail-term" and launcher == "step":
                gone += " (KillWait)"
            rows.append([
                mode, bold(launcher) if launcher == "step" else launcher, " / ".join(map(str, NODES)),
                f"{each((r['detect_s'] for r in rs), f2)} (max {f2(max(r['detect_max_s'] for r in rs))})",
                each((r["named_after_s"] for r in rs), f2),
                f"{sum(r['named_right'] for r in rs)} of {sum(r['n'] for r in rs)}", f"{alive_s} / {gone}",
            ])  # fmt: skip
    header = ["scenario", "launcher", "nodes", "job ends s (median / max)", "named s", "named right",
              "blocked ranks alive then / all gone s"]  # fmt: skip
    return table(header, rows)


@renders("launch-load")
def launch_load() -> str:
    return span((j["load_before"] for j in data(LAUNCH, "jobs")), f1)


@renders("launch-shorter-at-8")
def launch_shorter_at_8() -> str:
    return f"{f0((1 - ratio(_launch('step', 8), _launch('per-node', 8), 'launch_s', None)) * 100)}%"


@renders("launch-cancels")
def launch_cancels() -> str:
    return str(_launch("per-node", 8, "fail")["launcher_rpcs"] - _launch("per-node", 8)["launcher_rpcs"])


LAUNCH_TARGET = 1.3  # 8 nodes against 2


@renders("launch-scaling-verdict")
def launch_scaling_verdict() -> str:
    worst = max(ratio(_launch("step", 8), _launch("step", 2), k, None) for k in ("fanout_s", "launch_s"))
    return "met" if worst <= LAUNCH_TARGET else "missed"


@renders("launch-first-torchrun")
def launch_first_torchrun() -> str:
    a, b = _launch("step", 2), _launch("step", 8)
    return f"{f3(a['first_task_s'])} -> {f3(b['first_task_s'])} s ({f2(ratio(b, a, 'first_task_s', None))}x)"


@renders("launch-fanout-scaling")
def launch_fanout_scaling() -> str:
    a, b = _launch("step", 2), _launch("step", 8)
    per = ratio(_launch("per-node", 8), _launch("per-node", 2), "fanout_s", None)
    last_ms = (b["fanout_s"] - b["first_task_s"]) * 1000
    return (
        f"{f2(ratio(b, a, 'fanout_s', None))}x ({f3(a['fanout_s'])} -> {f3(b['fanout_s'])} s; per-node {f2(per)}x): "
        f"the last {f0(last_ms)} ms"
    )


@renders("launch-end-to-end")
def launch_end_to_end() -> str:
    step = ratio(_launch("step", 8), _launch("step", 2), "launch_s", None)
    per = ratio(_launch("per-node", 8), _launch("per-node", 2), "launch_s", None)
    return f"{f1(step)}x (per-node {f1(per)}x)"


@renders("launch-workers")
def launch_workers() -> str:
    a, b = _launch("step", 2), _launch("step", 8)
    cpus = int(re.search(r"(\d+) CPUs", data(LAUNCH, "meta", "machine")).group(1))  # type: ignore[union-attr]
    per_agent = (b["workers_s"] - a["workers_s"]) / (8 - 2) * cpus
    return f"{f1(a['workers_s'])} -> {f1(b['workers_s'])} s, about {f1(per_agent)} CPU-seconds per agent's import"


@renders("launch-fail-target")
def launch_fail_target() -> str:
    rs = [_launch(lr, n, m) for m in ("fail", "fail-term") for lr in ("step", "per-node") for n in NODES]
    worst, named, total = max(r["detect_max_s"] for r in rs), sum(r["named_right"] for r in rs), sum(r["n"] for r in rs)
    verdict = "met in every run" if worst <= 10 and named == total else "not met"
    return f"{verdict} (worst {f1(worst)} s; named {named} of {total})"


@renders("launch-fail-gap")
def launch_fail_gap() -> str:
    def gap(mode: str) -> str:
        return span(
            (_launch("step", n, mode)["detect_s"] - _launch("per-node", n, mode)["detect_s"] for n in NODES), f1
        )

    return f"{gap('fail')} s slower than the per-node one with ordinary ranks, {gap('fail-term')} s slower"


@renders("launch-flags")
def launch_flags() -> str:
    s = data(LAUNCH, "meta", "split_flags")
    return (
        f"{f2(s['static_table_s'])} s in a fresh process with the static flag table against {f1(s['torch_parser_s'])} s"
    )


# --- Per ColossalAI plugin on one H200: gpu/run.sh, 2026-12-02 --------------------------------------------------


@renders("h200-plugins")
def h200_plugins() -> str:
    rows = []
    for variant, label, strong in [
        ("plain", "plain PyTorch, eager", False),
        ("plain+compile", "plain PyTorch + torch.compile", False),
        ("torch_ddp", "train.py, TorchDDPPlugin", False),
        ("torch_ddp+compile", "train.py, TorchDDPPlugin + compile", True),
        ("low_level_zero", "train.py, LowLevelZeroPlugin (ZeRO-2, bf16)", False),
        ("hybrid", "train.py, HybridParallelPlugin (tp1 pp1, flash attention)", False),
        ("gemini", "train.py, GeminiPlugin (HybridAdam)", False),
    ]:
        r = line(H200, variant=variant)
        cells = [label, f1(r["step_ms"]), n0(r["tokens_per_s"]), pct(r["mfu"])]
        rows.append([bold(c) for c in cells] if strong else cells)
    return table(["variant", "step ms", "tokens/s", "MFU"], rows)


@renders("h200-target")
def h200_target() -> str:
    r = line(H200, variant="torch_ddp+compile")
    return f"{'met' if r['mfu'] >= 0.40 else 'not met'} by `torch_ddp` + `compile: true` ({pct(r['mfu'])})"


@renders("h200-parity")
def h200_parity() -> str:
    ddp, plain = line(H200, variant="torch_ddp+compile"), line(H200, variant="plain+compile")
    return f"{f2(ratio(ddp, plain, 'tokens_per_s', None))}x"


@renders("h200-compile-gain")
def h200_compile_gain() -> str:
    return (
        f"{f2(ratio(line(H200, variant='torch_ddp+compile'), line(H200, variant='torch_ddp'), 'tokens_per_s', None))}x"
    )


@renders("h200-sharding-cost")
def h200_sharding_cost() -> str:
    ddp = line(H200, variant="torch_ddp")
    costs = [
        (1 - ratio(line(H200, variant=v), ddp, "tokens_per_s", None)) * 100
        for v in ("low_level_zero", "hybrid", "gemini")
    ]
    return f"{span(costs, f0)}% fewer tokens/s than eager `torch_ddp`"


@renders("h200-compile-first-step")
def h200_compile_first_step() -> str:
    return f"{f0(line(H200, variant='plain+compile')['first_step_s'])} s"


# --- GPU training, issue 14: runs A-F ---------------------------------------------------------------------------


def i14(run: str, variant: str) -> dict[str, Any]:
    return line(I14, run=Prefix(f"{run}:"), variant=variant)


def _i14_ratio(a: dict[str, Any], b: dict[str, Any], key: str = "tokens_per_s") -> float:
    return ratio(a, b, key, run="run")


def _family(row: dict[str, Any], family: str) -> tuple[float, float]:
    """A kernel family's share of the GPU's busy time and its ms per step, from a line's profile."""
    prof = field(row, "profile")
    share = prof["families_pct_of_busy"].get(family)
    if share is None:
        raise MissingResult(f"result line {_short(row)}: no kernel family {family!r} in its profile")
    return share, share / 100 * prof["gpu_busy_ms_per_step"]


def _kernels(row: dict[str, Any], pattern: str) -> list[float]:
    found = [ms for name, ms in field(row, "profile")["top_kernels_ms_per_step"] if re.search(pattern, name)]
    if not found:
        raise MissingResult(f"result line {_short(row)}: no kernel matching {pattern!r} in its profile")
    return found


@renders("i14-model")
def i14_model() -> str:
    rows = []
    for variant, label in [
        ("plain+compile", "`plain+compile` (lm.NativeLlama)"),
        ("plain+compile+hf", "`plain+compile+hf` (transformers LlamaForCausalLM, sdpa)"),
        ("torch_ddp+compile", "`torch_ddp+compile` (train.py, native)"),
        ("torch_ddp+compile+hf", "`torch_ddp+compile+hf` (train.py, HF)"),
    ]:
        r = i14("A", variant)
        busy = f1(r["profile"]["gpu_busy_ms_per_step"]) if "profile" in r else ""
        rows.append([label, f1(r["step_ms"]), n0(r["tokens_per_s"]), pct(r["mfu"]), busy])
    return table(["variant", "step ms", "tokens/s", "MFU", "GPU busy ms/step"], rows)


def _i14_hf_slower(base: str) -> float:
    """How much slower run A's HF model was than the native one, for `base` (plain+compile, torch_ddp+compile)."""
    return 1 - _i14_ratio(i14("A", f"{base}+hf"), i14("A", base))


@renders("i14-hf-slower")
def i14_hf_slower() -> str:
    plain, ddp = _i14_hf_slower("plain+compile"), _i14_hf_slower("torch_ddp+compile")
    bar = "outside" if min(plain, ddp) > 0.03 else "not outside"
    return f"HF is {pct(plain)} slower in the bare loop and {pct(ddp)} slower through train.py: {bar} the 3% bar"


@renders("i14-hf-slower-short")
def i14_hf_slower_short() -> str:
    return f"{pct(_i14_hf_slower('plain+compile'))} slower"


@renders("i14-hf-busy")
def i14_hf_busy() -> str:
    hf, native = i14("A", "plain+compile+hf"), i14("A", "plain+compile")
    extra = hf["profile"]["gpu_busy_ms_per_step"] - native["profile"]["gpu_busy_ms_per_step"]
    rope = _kernels(hf, "cos_mul_neg_sin")
    return f"{f1(extra)} ms more GPU time per step, almost all of it in {len(rope)} extra Inductor kernels"


@renders("i14-rope-kernels")
def i14_rope_kernels() -> str:
    return f"{' + '.join(f1(ms) for ms in _kernels(i14('A', 'plain+compile+hf'), 'cos_mul_neg_sin'))} ms/step"


@renders("i14-example-vs-plain")
def i14_example_vs_plain() -> str:
    plain, ddp = i14("B", "plain+compile+mb16"), i14("B", "torch_ddp+compile")
    a = abs(_i14_ratio(i14("A", "torch_ddp+compile"), i14("A", "plain+compile")) - 1)
    b = abs(_i14_ratio(ddp, plain) - 1)
    return (
        f"`plain+compile` {n0(plain['tokens_per_s'])} tokens/s ({pct(plain['mfu'])}), `torch_ddp+compile` "
        f"{n0(ddp['tokens_per_s'])} ({pct(ddp['mfu'])}): {pct(b, 2)} apart (run A: "
        f"{pct(a)}), {'inside' if max(a, b) <= 0.02 else 'outside'} the 2% bar"
    )


@renders("i14-window")
def i14_window() -> str:
    worst = max(abs(r["window_tokens_per_s"] / r["tokens_per_s"] - 1) for r in data(I14) if "window_tokens_per_s" in r)
    return f"within {pct(worst)}"


def _with_window(r: dict[str, Any]) -> tuple[str, str]:
    tok, mfu = n0(r["tokens_per_s"]), pct(r["mfu"])
    if "window_tokens_per_s" in r and n0(r["window_tokens_per_s"]) != tok:
        tok += f" (window {n0(r['window_tokens_per_s'])})"
    if "window_mfu" in r and pct(r["window_mfu"]) != mfu:
        mfu += f" (window {pct(r['window_mfu'])})"
    return tok, mfu


@renders("i14-kernels")
def i14_kernels() -> str:
    base = [i14("A", "plain+compile"), i14("B", "plain+compile+mb16")]
    ce, liger = (
        i14("C", "plain+compile+liger_fused_ce+mb16"),
        i14("C", "plain+compile+liger_rms_norm+liger_swiglu+liger_rope+mb16"),
    )
    c32, d32 = i14("C", "plain+compile+liger_fused_ce+mb32"), i14("D", "plain+compile+liger_fused_ce+mb32")
    cdt, d64 = i14("D", "plain+compile+liger_fused_ce+mb32+cdt"), i14("D", "plain+compile+liger_fused_ce+mb64")
    fa, adam = (
        i14("E", "plain+compile+liger_fused_ce+flash_attn_hopper+mb64"),
        i14("E", "plain+compile+liger_fused_ce+mb64+hybrid_adam"),
    )
    ex, ex_plain = (
        i14("F", "torch_ddp+compile+liger_fused_ce+flash_attn_hopper"),
        i14("F", "plain+compile+liger_fused_ce+flash_attn_hopper+mb64"),
    )
    gib = lambda r: f1(r["peak_mem_gib"])  # noqa: E731
    adam_share, _ = _family(fa, "optimizer (fused AdamW)")
    rows = [
        ["baseline, micro-batch 16 (runs A, B)", span((r["tokens_per_s"] for r in base), n0),
         pct_span(r["mfu"] for r in base), span((r["peak_mem_gib"] for r in base), f1), ""],
        ["+ Liger fused linear + cross entropy (`liger_fused_ce`) (C)", *_with_window(ce), gib(ce),
         "Inductor already fuses the CE; less memory. No baseline ran in C: no ratio"],
        ["+ Liger RMSNorm, SwiGLU, RoPE (`liger_rms_norm,liger_swiglu,liger_rope`) (C)", *_with_window(liger),
         gib(liger), "each is a graph break under torch.compile. No baseline ran in C: no ratio"],
        [f"micro-batch 32 + `liger_fused_ce` (C; D: {n0(d32['tokens_per_s'])}, {pct(d32['mfu'])})",
         *_with_window(c32), gib(c32), "D's is the baseline of D's rows below"],
        ["+ Inductor coordinate-descent tuning of its Triton kernels, mb32 (D)", *_with_window(cdt), gib(cdt),
         f"no gain ({change(_i14_ratio(cdt, d32))} against D's mb32); first compile {f0(cdt['first_step_s'])} s "
         f"instead of {f0(d32['first_step_s'])} s"],
        ["micro-batch 64 + `liger_fused_ce` (D)", *_with_window(d64), gib(d64),
         f"{points(d64['mfu'], d32['mfu'])} points over D's mb32"],
        ["+ FlashAttention for Hopper (`flash_attn_hopper`), mb64 (E)", *_with_window(fa), gib(fa),
         "kept, optional. Its baseline, D's mb64, ran in another call: no ratio"],
        ["+ ColossalAI's fused CUDA Adam (`optimizer: hybrid_adam`) instead of torch's fused AdamW, mb64, no FA (E)",
         *_with_window(adam), gib(adam),
         f"not kept: fused AdamW is {adam_share}% of E's GPU time. Its baseline ran in another call (D): no ratio"],
        ["**the example**: train.py torch_ddp + compile + `liger_fused_ce` + `flash_attn_hopper`, mb64 (F)",
         n0(ex["tokens_per_s"]), bold(pct(ex["mfu"])), "",
         f"plain + the same kernels in the same run: {n0(ex_plain['tokens_per_s'])} ({pct(ex_plain['mfu'])}); the "
         f"example is {'not slower' if _i14_ratio(ex, ex_plain) >= 1 else 'slower'}"],
    ]  # fmt: skip
    return table(["step", "tokens/s", "MFU", "peak GiB", "verdict"], rows)


@renders("i14-mb64-points")
def i14_mb64_points() -> str:
    d32, d64 = i14("D", "plain+compile+liger_fused_ce+mb32"), i14("D", "plain+compile+liger_fused_ce+mb64")
    return f"{points(d64['mfu'], d32['mfu'])} points"


@renders("i14-fa-kernels")
def i14_fa_kernels() -> str:
    fa = i14("E", "plain+compile+liger_fused_ce+flash_attn_hopper+mb64")
    fwd, bwd = _kernels(fa, "FlashAttentionForwardSm90"), _kernels(fa, "FlashAttentionBackwardSm90")
    return f"{f1(sum(fwd))} ms (forward) + {f1(sum(bwd))} ms (backward) of a {f0(fa['step_ms'])} ms micro-batch-64 step"


def _tflops(row: dict[str, Any], gemm_ms: float) -> float:
    """6N FLOPs of one step's tokens over the GEMMs' time."""
    tokens_per_step = row["tokens_per_s"] * row["step_ms"] / 1000
    return 6 * field(row, "params_matmul") * tokens_per_step / (gemm_ms / 1000) / 1e12


@renders("i14-busy")
def i14_busy() -> str:
    fa = i14("E", "plain+compile+liger_fused_ce+flash_attn_hopper+mb64")
    busy = fa["profile"]["gpu_busy_ms_per_step"]
    return f"{f1(busy)} of {f1(fa['step_ms'])} ms per step ({f0(busy / fa['step_ms'] * 100)}%)"


def _share(row: dict[str, Any], family: str) -> str:
    share, ms = _family(row, family)
    return f"{f1(share)}% ({f0(ms)} ms)"


@renders("i14-gemm")
def i14_gemm() -> str:
    fa = i14("E", "plain+compile+liger_fused_ce+flash_attn_hopper+mb64")
    _, ms = _family(fa, "matmul (cuBLAS/CUTLASS GEMM)")
    return f"{_share(fa, 'matmul (cuBLAS/CUTLASS GEMM)')}. That is {f0(_tflops(fa, ms))} TFLOP/s on the 6N FLOPs"


@renders("i14-elementwise")
def i14_elementwise() -> str:
    return _share(i14("E", "plain+compile+liger_fused_ce+flash_attn_hopper+mb64"), "inductor fused triton kernels")


@renders("i14-attn-adam")
def i14_attn_adam() -> str:
    fa = i14("E", "plain+compile+liger_fused_ce+flash_attn_hopper+mb64")
    return f"{_share(fa, 'attention (flash/cudnn/efficient)')}. Fused AdamW: {_share(fa, 'optimizer (fused AdamW)')}"


def _i14_best() -> float:
    return max(max(r.get("mfu", 0), r.get("window_mfu", 0)) for r in data(I14))


@renders("i14-target")
def i14_target() -> str:
    best = _i14_best()
    reached = "is reached" if best >= 0.5 else "is not reached"
    return f"**50% MFU {reached} by this benchmark's metric (6N FLOPs per token): the best is {pct(best)}.**"


@renders("i14-palm")
def i14_palm() -> str:
    fa = i14("E", "plain+compile+liger_fused_ce+flash_attn_hopper+mb64")
    ex, ex_plain = (
        i14("F", "torch_ddp+compile+liger_fused_ce+flash_attn_hopper"),
        i14("F", "plain+compile+liger_fused_ce+flash_attn_hopper+mb64"),
    )
    factor = ex_plain["mfu_attn"] / ex_plain["mfu"]  # the model's attention FLOPs over 6N: one model, one factor
    return (
        f"+{f0((factor - 1) * 100)}% here), the same runs are at {pct(fa['mfu_attn'])} (E) and the example at "
        f"{pct(ex['mfu'] * factor)} (F)"
    )


@renders("i14-step-needed")
def i14_step_needed() -> str:
    fa = i14("E", "plain+compile+liger_fused_ce+flash_attn_hopper+mb64")
    tokens_per_step = fa["tokens_per_s"] * fa["step_ms"] / 1000
    needed_ms = 6 * fa["params_matmul"] * tokens_per_step / (0.5 * PEAK_BF16) * 1000
    return f"from {f0(fa['step_ms'])} to {f0(needed_ms)} ms"


# --- Deterministic mode, issue 22: one device run ---------------------------------------------------------------


@renders("det-throughput")
def det_throughput() -> str:
    rows = []
    for variant, label in [
        ("torch_ddp+compile", "train.py, TorchDDPPlugin + compile (default: TF32 on, kernels free to vary)"),
        ("torch_ddp+compile+det", "train.py, TorchDDPPlugin + compile + `deterministic: true`"),
    ]:
        r = line(DET, variant=variant)
        rows.append([label, f1(r["step_ms"]), n0(r["tokens_per_s"]), pct(r["mfu"])])
    return table(["variant", "step ms", "tokens/s", "MFU"], rows)


@renders("det-cost")
def det_cost() -> str:
    default, det = line(DET, variant="torch_ddp+compile"), line(DET, variant="torch_ddp+compile+det")
    return (
        f"**{pct(1 - ratio(det, default, 'mfu', None))} of MFU** ({pct(default['mfu'])} -> {pct(det['mfu'])}; "
        f"{pct(ratio(det, default, 'step_ms', None) - 1)} longer steps)"
    )


@renders("det-earlier")
def det_earlier() -> str:
    default = line(DET, variant="torch_ddp+compile")
    earlier = [line(H200, variant="torch_ddp+compile"), i14("A", "torch_ddp+compile"), i14("B", "torch_ddp+compile")]
    gaps = [_percent(r["mfu"]) - _percent(default["mfu"]) for r in earlier]
    return f"{span(gaps, f1)} points below the earlier runs of the same variant ({pct_span(r['mfu'] for r in earlier)})"


@renders("det-loss")
def det_loss() -> str:
    default, det = line(DET, variant="torch_ddp+compile"), line(DET, variant="torch_ddp+compile+det")
    return f"{abs(det['loss'] - default['loss']):.1e} at step {default['steps']} ({default['loss']} and {det['loss']})"


# --- Precision, issue 26: calls A-E -----------------------------------------------------------------------------


def i26(call: str, variant: str) -> dict[str, Any]:
    return line(I26, call=call, variant=variant)


@renders("i26-mb32")
def i26_mb32() -> str:
    rows = []
    for call, variant, label in [
        ("A", "torch_ddp+compile", "`precision: bf16` (today's default: autocast over fp32 weights)"),
        ("B", "torch_ddp+compile+bf16m", "`precision: bf16_master`"),
        ("B", "torch_ddp+compile+bf16m+fp8", "`precision: bf16_master`, `fp8: tensorwise`"),
    ]:
        r = i26(call, variant)
        rows.append([label, call, f1(r["step_ms"]), n0(r["tokens_per_s"]), pct(r["mfu"])])
    return table(["variant", "call", "step ms", "tokens/s", "MFU"], rows)


@renders("i26-mb32-fp8")
def i26_mb32_fp8() -> str:
    fp8, bf16m = i26("B", "torch_ddp+compile+bf16m+fp8"), i26("B", "torch_ddp+compile+bf16m")
    return f"{change(ratio(fp8, bf16m, 'tokens_per_s', run='call'))} tokens/s"


@renders("i26-mb64")
def i26_mb64() -> str:
    rows = []
    for call, variant, label in [
        ("C", "plain+compile+liger_fused_ce+mb64", "bf16 autocast + `liger_fused_ce`"),
        ("B", "plain+compile+liger_fused_ce+mb64+bf16m", "`bf16_master` + `liger_fused_ce`"),
        ("D", "plain+compile+liger_fused_ce+mb64+bf16m+fp8", "`bf16_master` + `fp8: tensorwise` + `liger_fused_ce`"),
        ("E", "torch_ddp+compile+liger_fused_ce+bf16m+fp8", "**train.py**, torch_ddp + compile, same three"),
    ]:
        r = i26(call, variant)
        tok, mfu = n0(r["tokens_per_s"]), bold(pct(r["mfu"])) if r["mfu"] >= 0.5 else pct(r["mfu"])
        if "window_mfu" in r and pct(r["window_mfu"]) != pct(r["mfu"]):
            mfu += f" (window {pct(r['window_mfu'])})"
        gib = f1(r["peak_mem_gib"]) if "peak_mem_gib" in r else ""
        rows.append([f"{label} ({call})", f1(r["step_ms"]), tok, mfu, gib])
    return table(["variant", "step ms", "tokens/s", "MFU", "peak GiB"], rows)


@renders("i26-target")
def i26_target() -> str:
    plain, ex = (
        i26("D", "plain+compile+liger_fused_ce+mb64+bf16m+fp8"),
        i26("E", "torch_ddp+compile+liger_fused_ce+bf16m+fp8"),
    )
    reached = "is reached" if min(plain["mfu"], ex["mfu"]) >= 0.5 else "is not reached"
    return (
        f"**50% MFU by the 6N measure {reached}**: {pct(plain['mfu'])} in the bare loop and {pct(ex['mfu'])} "
        "through train.py"
    )


@renders("i14-best")
def i14_best() -> str:
    return pct(_i14_best())


@renders("i26-palm")
def i26_palm() -> str:
    return pct(i26("D", "plain+compile+liger_fused_ce+mb64+bf16m+fp8")["mfu_attn"])


@renders("i26-profile")
def i26_profile() -> str:
    b = i26("B", "plain+compile+liger_fused_ce+mb64+bf16m")
    _, gemm_ms = _family(b, "matmul (cuBLAS/CUTLASS GEMM)")
    return (
        f"busy {f1(b['profile']['gpu_busy_ms_per_step'])} ms per step. GEMMs "
        f"{_share(b, 'matmul (cuBLAS/CUTLASS GEMM)')}: {f0(_tflops(b, gemm_ms))} TFLOP/s on the 6N FLOPs, attention "
        f"{_share(b, 'attention (flash/cudnn/efficient)')}"
        f", Inductor's fused elementwise kernels {_share(b, 'inductor fused triton kernels')}, fused AdamW "
        f"{_share(b, 'optimizer (fused AdamW)')}, Liger's cross entropy {_share(b, 'liger triton kernels')}"
    )


PARITY_NAMES = {
    "torch_ddp": "eager bf16",
    "torch_ddp+compile": "compiled bf16 (today's default)",
    "torch_ddp+compile+bf16m": "`bf16_master`",
    "torch_ddp+compile+bf16m+fp8": "`bf16_master` + `fp8: tensorwise`",
    "low_level_zero": "`low_level_zero` bf16 (ColossalAI's own bf16 weights + fp32 masters)",
}


def _parity(baseline: str, run: str) -> dict[str, Any]:
    return line(I26, baseline=baseline, run=run)


@renders("i26-parity")
def i26_parity() -> str:
    rows = []
    for baseline, run in [("torch_ddp", "torch_ddp+compile"), ("torch_ddp", "low_level_zero"),
                          ("torch_ddp+compile", "torch_ddp+compile+bf16m"),
                          ("torch_ddp+compile", "torch_ddp+compile+bf16m+fp8")]:  # fmt: skip
        p = _parity(baseline, run)
        final = line(I26, variant=run, steps=300)
        rows.append([
            PARITY_NAMES[baseline], PARITY_NAMES[run], pct(p["max_rel_diff"], 2), str(p["at_step"]),
            str(p["steps"]), "yes" if p["within"] else "no", str(final["loss"]),
        ])  # fmt: skip
    header = ["baseline", "run", "max rel. difference", "at step", "logged steps", "within 1%", "final loss"]
    return table(header, rows)


@renders("i26-parity-summary")
def i26_parity_summary() -> str:
    floor = _parity("torch_ddp", "torch_ddp+compile")
    bf16m, fp8 = (
        _parity("torch_ddp+compile", "torch_ddp+compile+bf16m"),
        _parity("torch_ddp+compile", "torch_ddp+compile+bf16m+fp8"),
    )
    below = lambda p: "below" if p["max_rel_diff"] < floor["max_rel_diff"] else "above"  # noqa: E731
    return (
        f"Two runs of the default that differ only in kernels (eager and compiled) differ by up to "
        f"{pct(floor['max_rel_diff'], 2)} (step {floor['at_step']}): the noise floor of this comparison. `bf16_master` "
        f"against compiled bf16 is {below(bf16m)} it ({pct(bf16m['max_rel_diff'], 2)}, step {bf16m['at_step']}); "
        f"`bf16_master` + `fp8: tensorwise` is {below(fp8)} it ({pct(fp8['max_rel_diff'], 2)}, step {fp8['at_step']}). "
        + _within_verdict()
    )


def _within_verdict() -> str:
    pairs = lines(I26, baseline=Prefix(""))
    within = [PARITY_NAMES[p["run"]] for p in pairs if p["within"]]
    if not within:
        return "No run is within the 1% limit, the default's own eager/compiled pair included"
    return f"Within the 1% limit: {', '.join(within)} ({len(within)} of {len(pairs)} pairs)"


# --- The top-level README's figures -----------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------------
# Markers

MARKER = re.compile(r"<!-- render:([\w.-]+) -->(.*?)<!-- /render:\1 -->", re.S)
OPENING = re.compile(r"<!-- (/?)render:([\w.-]+) -->")


def render_text(text: str, where: str = "<text>", used: set[str] | None = None) -> str:
    """`text` with every generated block rewritten; the names it renders are added to `used`."""
    opened = [m.group(2) for m in OPENING.finditer(text) if not m.group(1)]
    closed = [m.group(1) for m in MARKER.finditer(text)]
    if sorted(opened) != sorted(closed):
        raise MarkerError(f"{where}: unclosed render marker(s): {sorted(set(opened) - set(closed)) or opened}")

    def block(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in RENDERERS:
            raise MarkerError(f"{where}: no renderer named {name!r} (benchmarks/render.py)")
        out = RENDERERS[name]()
        if used is not None:
            used.add(name)
        line_start = m.start() == 0 or text[m.start() - 1] == "\n"
        if "\n" in out:
            if not line_start or text[m.end() : m.end() + 1] not in ("", "\n"):
                raise MarkerError(
                    f"{where}: block {name!r} renders several lines: put its markers on lines of their own"
                )
            return f"<!-- render:{name} -->\n\n{out}\n\n<!-- /render:{name} -->"
        if re.fullmatch(r"\s*([-*+>]|\d+[.)])?\s*", text[: m.start()].rsplit("\n", 1)[-1]):
            raise MarkerError(f"{where}: inline block {name!r} begins a line, which Markdown reads as an HTML block")
        return f"<!-- render:{name} -->{out}<!-- /render:{name} -->"

    return MARKER.sub(block, text)


# ---------------------------------------------------------------------------------------------------------------
# Issue 33: every variant in one device call, by the wall clock between synchronised points

I33_CALL = "issue33-throughput"
I33_VARIANTS = [
    ("`precision: bf16` (the default: autocast over fp32 weights), micro-batch 32", "torch_ddp+compile"),
    ("`bf16_master`", "torch_ddp+compile+bf16m"),
    ("`bf16_master` + `fp8: tensorwise`", "torch_ddp+compile+bf16m+fp8"),
    ("`bf16_master` + `fp8: rowwise`", "torch_ddp+compile+bf16m+fp8row"),
    (
        "`bf16_master` + `fp8: tensorwise` + `liger_fused_ce`, micro-batch 64",
        "torch_ddp+compile+liger_fused_ce+bf16m+fp8+mb64",
    ),
    (
        "`bf16_master` + `fp8: rowwise` + `liger_fused_ce`, micro-batch 64",
        "torch_ddp+compile+liger_fused_ce+bf16m+fp8row+mb64",
    ),
]


def _i33(variant: str) -> dict[str, Any]:
    return line(I33, call=I33_CALL, variant=variant)


FIRST_JOB = "benchmarks/gpu/results-first-job-h100.json"  # one device call of benchmarks/gpu/slurm_on_device.sh
FIRST_JOB_PARTS = [
    ("plain `torchrun`", "plain_torchrun"),
    ("`multinode torchrun` outside SLURM (profile `ethernet`)", "local_multinode_torchrun"),
    ("`snakemake` -> sbatch -> job script -> srun -> `multinode torchrun` (one-node SLURM 22.05)", "slurm_snakemake"),
]


@renders("first-job-h100")
def first_job_h100() -> str:
    rows = []
    for label, key in FIRST_JOB_PARTS:
        r = data(FIRST_JOB, key)
        rows.append(
            [label, f2(field(r, "step_ms_median")), n0(field(r, "tokens_per_s_median")), pct(field(r, "mfu_median"))]
        )
    gpu = data(FIRST_JOB, "device", "gpu")
    return table([f"minimal_train.py on one {gpu}, one call", "step ms (median)", "tokens/s", "MFU"], rows)


@renders("first-job-h100-checks")
def first_job_h100_checks() -> str:
    checks = data(FIRST_JOB, "checks")
    return "\n".join(f"- {name}: {'passed' if ok else '**failed**'}" for name, ok in checks.items())


@renders("issue33-throughput")
def issue33_throughput() -> str:
    base = _i33(I33_VARIANTS[0][1])
    rows = []
    for label, variant in I33_VARIANTS:
        r = _i33(variant)
        rows.append(
            [
                label,
                f1(r["step_ms"]),
                n0(r["tokens_per_s"]),
                pct(r["mfu"]),
                change(ratio(r, base, "tokens_per_s", "call")),
            ]
        )
    return table(["train.py, torch_ddp + compile", "step ms", "tokens/s", "MFU", "tokens/s vs the default"], rows)


@renders("readme-i33-default")
def readme_i33_default() -> str:
    return pct(_i33(I33_VARIANTS[0][1])["mfu"])


@renders("issue33-best")
def issue33_best() -> str:
    best = max((_i33(v) for _, v in I33_VARIANTS), key=lambda r: r["mfu"])
    return pct(best["mfu"])


I33_KERNELS = "i33-kernels"  # the second call: FlashAttention for Hopper, the bare loop and its profile
I33_BEST = "torch_ddp+compile+liger_fused_ce+bf16m+fp8+mb64"
I33_FA = "torch_ddp+compile+liger_fused_ce+flash_attn_hopper+bf16m+fp8+mb64"
I33_PLAIN = "plain+compile+liger_fused_ce+mb64+bf16m+fp8"
I33_PARITY = "i33-parity"
LLZ_CUDA = "benchmarks/gpu/results-h200-llz-masters.json"


def _i33k(variant: str) -> dict[str, Any]:
    return line(I33, call=I33_KERNELS, variant=variant)


@renders("issue33-kernels")
def issue33_kernels() -> str:
    base = _i33k(I33_BEST)
    rows = []
    for label, variant in [
        ("train.py: `bf16_master` + `fp8: tensorwise` + `liger_fused_ce`", I33_BEST),
        ("train.py: the same + `flash_attn_hopper`", I33_FA),
        ("the bare loop (`plain_torch.py`): `bf16_master` + `fp8: tensorwise` + `liger_fused_ce`", I33_PLAIN),
    ]:
        r = _i33k(variant)
        rows.append([label, f1(r["step_ms"]), n0(r["tokens_per_s"]), bold(pct(r["mfu"], 2)),
                     change(ratio(r, base, "tokens_per_s", "call"))])  # fmt: skip
    return table(["micro-batch 64, compiled", "step ms", "tokens/s", "MFU", "tokens/s vs the first row"], rows)


@renders("issue33-train-best")
def issue33_train_best() -> str:
    return pct(_i33k(I33_FA)["mfu"], 2)


@renders("issue33-plain-best")
def issue33_plain_best() -> str:
    return pct(_i33k(I33_PLAIN)["mfu"], 2)


@renders("issue33-profile")
def issue33_profile() -> str:
    prof = field(_i33k(I33_PLAIN), "profile")
    busy = prof["gpu_busy_ms_per_step"]
    rows = [[family, f1(share) + "%", f1(busy * share / 100)] for family, share in prof["families_pct_of_busy"].items()]
    rows.append(["**GPU busy, all kernels**", "100%", f1(busy)])
    rows.append(["wall clock per step under the profiler", "", f1(prof["wall_ms_per_step"])])
    return table(["kernel family (bare loop, 3 profiled steps)", "share of GPU busy", "ms per step"], rows)


@renders("issue33-parity")
def issue33_parity() -> str:
    rows = []
    for run, label in [
        ("torch_ddp", "eager `bf16` (the default's numerics, other kernels: the noise floor)"),
        ("torch_ddp+compile+bf16m", "`bf16_master`"),
        ("torch_ddp+compile+bf16m+fp8", "`bf16_master` + `fp8: tensorwise`"),
        ("low_level_zero+compile", "`low_level_zero` bf16, masters re-seeded (`lm.boost`)"),
    ]:
        r = line(I33, call=I33_PARITY, baseline="torch_ddp+compile", run=run)
        final = line(I33, call=I33_PARITY, variant=run)["loss"]
        rows.append([label, pct(r["max_rel_diff"], 2), str(r["at_step"]), "yes" if r["within"] else "**no**",
                     f"{final:.4f}"])  # fmt: skip
    base = line(I33, call=I33_PARITY, variant="torch_ddp+compile")["loss"]
    rows.append(["compiled `bf16` (the default: the baseline)", "", "", "", f"{base:.4f}"])
    return table(["run, against compiled bf16", "max rel. difference", "at step", "within 1%", "final loss"], rows)


@renders("issue33-llz-cuda")
def issue33_llz_cuda() -> str:
    runs = data(LLZ_CUDA, "runs")

    def first10(name: str) -> str:
        return f"{sum(runs[name]['loss'][:10]) / 10:.4f}"

    return (
        f"stock LowLevelZero {first10('llz_stock')} = `bf16_master` from bf16-rounded weights "
        f"{first10('bf16m_rounded')}; re-seeded {first10('llz_reseeded')} = `bf16_master` "
        f"{first10('bf16_master')} (mean loss of steps 1-10); the first update reaches the weights the model "
        f"computes with at {pct(runs['llz_stock']['update_realized'])} stock, "
        f"{pct(runs['llz_reseeded']['update_realized'])} re-seeded"
    )


# ---------------------------------------------------------------------------------------------------------------
# Issues 36 and 48: goodput through a schedule of faults (goodput.py), the recipes against --executor multinode, and
# the model that predicts it and projects it (goodput_model.py)

GOODPUT_SCENARIO = "quiet"
GOODPUT_VARIANTS = {
    "baseline": "no faults (`--executor multinode`)",
    "recipe": "the seed's recipe",
    "competent": "the recipe + a competent team",
    "multinode": "`--executor multinode`",
    "spares": "`--executor multinode`, `spare_nodes=1`",
}
GOODPUT_FAULTS = {
    "node_death": "a node dies",
    "hang": "a rank hangs",
    "crash": "a rank crashes",
    "admin_requeue": "an admin requeue",
    "time_limit_signal": "the pre-time-limit signal",
}


def _goodput_variant(variant: str) -> dict[str, Any]:
    return line(GOODPUT, "scenarios", GOODPUT_SCENARIO, "variants", variant=variant)


def _or_dash(x: float | None, fmt: Callable[[Any], str]) -> str:
    return "-" if x is None else fmt(x)


def _fault(r: dict[str, Any], fault: str) -> dict[str, Any] | None:
    return next((x for x in r["faults"] if x["fault"] == fault), None)


@renders("goodput-variants")
def goodput_variants() -> str:
    rows = []
    for variant, label in GOODPUT_VARIANTS.items():
        r = _goodput_variant(variant)
        led = field(r, "ledger_node_s")
        done = r["goodput"] is not None
        rows.append([
            label, bold(pct(r["goodput"])) if done else f"not finished ({r['error']})", _or_dash(r["wall_s"], f0),
            f0(r["productive_node_s"]), f0(r["allocated_node_s"]), str(len(r["jobs"])), str(len(r["runs"])),
            f0(led["lost"]), f0(led["stalled"]), f0(led["startup"] + led["restore"] + led["relaunch"]),
            f0(led["checkpoint"]), f0(led["spare"]), f0(led["teardown"] + led["unknown"]),
        ])  # fmt: skip
    header = ["variant", "goodput", "wall s to the model", "productive node-s", "allocated node-s", "SLURM jobs",
              "runs", "lost", "stalled", "startup + restore + relaunch", "checkpoint", "spare", "teardown"]  # fmt: skip
    return table(header, rows)


@renders("goodput-faults")
def goodput_faults() -> str:
    rows = []
    for fault, label in GOODPUT_FAULTS.items():
        for variant, name in list(GOODPUT_VARIANTS.items())[1:]:
            f = _fault(_goodput_variant(variant), fault)
            if f is None:
                rows.append([label, name, "not reached", "", "", "", "", "", "", ""])
                continue
            rows.append([
                label, name, f"{f['step']} -> {_or_dash(f['resumed_from'], str)}: {_or_dash(f['steps_lost'], str)}",
                _or_dash(f["time_to_first_resumed_step_s"], f0), *(_or_dash(f[k], f0) for k in
                ("held_s", "queue_s", "startup_s")), _or_dash(f["restore_s"], f1), _or_dash(f["lost_s"], f0),
                bold(_or_dash(None if f["held_s"] is None else f["held_s"] + f["startup_s"] + f["restore_s"] +
                              f["lost_s"], f0)),
            ])  # fmt: skip
    header = ["fault", "variant", "step -> resumed: lost", "s to the first resumed step", "held s", "queue s",
              "startup s", "restore s", "lost s", "allocated s it cost"]  # fmt: skip
    return table(header, rows)


@renders("goodput-runs")
def goodput_runs() -> str:
    """How every run of every SLURM job ended, per variant (sacct's state, exit code and reason)."""
    rows = []
    for variant, label in GOODPUT_VARIANTS.items():
        ends: dict[str, int] = {}
        for run in _goodput_variant(variant)["runs"]:
            reason = "" if run["reason"] in ("None", "") else f" ({run['reason']})"
            key = f"{run['state']} {run['exit_code']}{reason}"
            ends[key] = ends.get(key, 0) + 1
        rows.append([label, ", ".join(f"{k} x{n}" if n > 1 else k for k, n in ends.items())])
    return table(["variant", "how its runs ended (sacct: state, exit code, reason)"], rows)


@renders("goodput-signal")
def goodput_signal() -> str:
    parts = []
    for variant, label in list(GOODPUT_VARIANTS.items())[1:]:
        f = _fault(_goodput_variant(variant), "time_limit_signal")
        if f is None or f["signal_due_at"] is None:
            continue
        got, due = f["signal_received_at"], f["signal_due_at"]
        if got is None:
            seen = "never reached the training"
        else:
            seen = f"reached it {abs(got - due):.0f} s {'before' if got < due else 'after'} that"
        parts.append(f"{label}: due {f['signal_due_at'] - f['injected_at']:.0f} s after the cut, {seen}")
    return "; ".join(parts)


@renders("goodput-setup")
def goodput_setup() -> str:
    cfg = data(GOODPUT, "config")
    load = f"{each(data(GOODPUT, 'load_before'), f1)} before, {each(data(GOODPUT, 'load_after'), f1)} after"
    during = data(GOODPUT, "load_during")
    stall = "the plugin's defaults" if not cfg["stall_timeout"] else (
        f"`stall_timeout={cfg['stall_timeout']}`, `on_stall={cfg['on_stall']}`")  # fmt: skip
    return (
        f"{data(GOODPUT, 'date')}, commit {data(GOODPUT, 'commit')}, {cfg['steps']} steps, a checkpoint every "
        f"{cfg['ckpt_every']}, time limit {cfg['limit_min']} min, the competent recipe's collective timeout "
        f"{cfg['pg_timeout_s']:.0f} s, multinode's stall settings: {stall}; {data(GOODPUT, 'nodes')} nodes; load "
        f"average {load}, {f1(during['mean'])} mean ({f1(during['max'])} at most) through the run"
    )


@renders("goodput-model-benchmark")
def goodput_model_benchmark() -> str:
    rows = []
    for row in data(GOODPUT_MODEL, "benchmark"):
        costs = ", ".join(f"{GOODPUT_FAULTS[k].split(' ', 1)[1]} {f0(v)}" for k, v in row["fault_cost_s"].items())
        rows.append([GOODPUT_VARIANTS[row["variant"]], pct(row["predicted"]), bold(pct(row["measured"])),
                     points(row["predicted"], row["measured"]), costs or "-"])  # fmt: skip
    return table(["variant", "predicted", "measured", "points", "each fault's allocated seconds (model input)"], rows)


@renders("goodput-model-profile")
def goodput_model_profile() -> str:
    p = data(GOODPUT_MODEL, "profile")
    return (
        f"startup {f1(p['startup_s'])} s, a step {p['step_s'] * 1000:.0f} ms, {f2(p['checkpoint_stall_s'])} s per "
        f"checkpoint, teardown {f1(p['teardown_s'])} s"
    )


@renders("goodput-model-projection")
def goodput_model_projection() -> str:
    rows = []
    for row in data(GOODPUT_MODEL, "projected"):
        lost = row["lost_to"]
        down = row["downtime_s"]
        rows.append([
            row["label"], f"{row['save']}, {f1(row['checkpoint_stall_s'])} s", f0(row["interval_s"]),
            f"{f0(down['node_death'])} / {f0(down['hang'])} / {f0(down['crash'])}", f0(row["expected_downtime_s"]),
            pct(lost["checkpoint_stall"]), pct(lost["downtime"]), pct(lost["recomputed_work"]),
            pct(lost["spare_nodes"], 2), bold(pct(row["goodput"])), f0(row["downtime_for_goal_s"]),
        ])  # fmt: skip
    header = ["at Llama 3's scale", "save, stall", "interval s (Young/Daly)", "downtime s: node / hang / crash",
              "mean downtime s", "lost to stalls", "to downtime", "to recomputed work", "to spares",
              "goodput", "mean downtime s for 97%"]  # fmt: skip
    return table(header, rows)


@renders("goodput-model-llama3")
def goodput_model_llama3() -> str:
    l3 = data(GOODPUT_MODEL, "llama3")
    kinds = l3["by_kind"]
    mtbf = data(GOODPUT_MODEL, "projected", 0, "mtbf_s")
    return (
        f"{l3['gpus']:,} GPUs, {l3['days']} days, {l3['interruptions']} unexpected interruptions ({l3['source']}): "
        f"{kinds['node_death']} of a node's parts (as a node's death), {kinds['hang']} of the network (as a hang), "
        f"{kinds['crash']} of software or corrupted data (as a crash); one every {mtbf / 3600:.1f} h"
    )


@renders("goodput-model-limits")
def goodput_model_limits() -> str:
    return "\n".join(f"- {limit}" for limit in data(GOODPUT_MODEL, "limits"))


@renders("goodput-model-goal")
def goodput_model_goal() -> str:
    goal = data(GOODPUT_MODEL, "goal")
    ours = [r for r in data(GOODPUT_MODEL, "projected") if r["save"] == "async"]
    best = max(ours, key=lambda r: r["goodput"])
    verdict = "met" if best["goodput"] >= goal else "**not met**"
    return (
        f"{verdict}: {best['label']} projects {pct(best['goodput'])} against the goal of {pct(goal, 0)}; at its "
        f"stall of {f1(best['checkpoint_stall_s'])} s per checkpoint the goal needs a mean downtime of at most "
        f"{f0(best['downtime_for_goal_s'])} s per interruption, and the measured one is "
        f"{f0(best['expected_downtime_s'])} s"
    )


# --- The matrix of features and faults: tests/cluster/test_matrix_cluster.py ----------------------------------

MATRIX = "benchmarks/results-matrix.json"  # one run of the matrix test, every case (MULTINODE_MATRIX_RESULT)
MATRIX_FEATURES = {  # the result's key -> the column: each feature as the user sets it
    "spare_nodes": "spare_nodes",
    "on_straggler": "on_straggler",
    "node_check": "node_check",
    "on_stall": "on_stall",
    "max_restarts": "max_restarts",
    "max_requeues": "max-requeues",
    "retries": "--retries",
    "trackers": "trackers",
}


@renders("matrix")
def matrix() -> str:
    """Every case: its fault and features, how it ended (the test holds it to the documented outcome), the steps it
    computed again, the ledger's productive node-seconds against the training's own clock, and what `multinode
    status` said."""
    rows = []
    for case in data(MATRIX, "cases"):
        if field(case, "got") != field(case, "expected"):
            raise MissingResult(f"{MATRIX}: {case['case']} did not end as documented: a failed run's file")
        said = "<br>".join(field(case, "status_says"))
        rows.append(
            [case["case"], field(case, "event"), *(str(field(case, k)) for k in MATRIX_FEATURES),
             field(case, "ends"), str(field(case, "lost_steps")),
             f"{f1(field(case, 'productive_node_s'))} / {f1(field(case, 'training_clock_node_s'))}", said or "-"]
        )  # fmt: skip
    header = ["case", "fault", *MATRIX_FEATURES.values(), "how it ends (as documented)", "steps computed again",
              "productive node-s: ledger / training's clock", "`multinode status` says"]  # fmt: skip
    return table(header, rows)


@renders("matrix-cost")
def matrix_cost() -> str:
    cases = data(MATRIX, "cases")
    if data(MATRIX, "cases_run") != len(cases):
        raise MissingResult(f"{MATRIX}: {data(MATRIX, 'cases_run')} cases run, {len(cases)} passed")
    load = f"{each(data(MATRIX, 'load_before'), f1)} before, {each(data(MATRIX, 'load_after'), f1)} after"
    slowest = max(cases, key=lambda c: c["wall_s"])
    return (
        f"{len(cases)} cases in {f0(data(MATRIX, 'wall_s'))} s, {data(MATRIX, 'concurrent')} side by side (the "
        f"slowest, {slowest['case']}, {f0(slowest['wall_s'])} s); {data(MATRIX, 'date')}, commit "
        f"{data(MATRIX, 'commit')}, load average {load}"
    )


CKPT_COST = "benchmarks/results-checkpoint-verify.json"  # one run of benchmarks/checkpoint_cost.py
CKPT_COST_H100 = "benchmarks/results-checkpoint-verify-h100.json"  # the same on the lent H100, a GPT-2-medium model


def checkpoint_cost_text(rel: str) -> str:
    def mean(key: str) -> str:
        return f"{data(rel, key, 'mean'):.4f} s"

    text = (
        f"{data(rel, 'checkpoints')} checkpoints of {data(rel, 'checkpoint_bytes') / 1e6:.1f} MB "
        f"({data(rel, 'machine', 'filesystem')}): a save takes {mean('save_s')} mean, of which fsync "
        f"{mean('fsync_s')} ({pct(data(rel, 'fsync_share_of_save'))}, with the ranks' barrier after it), the "
        f"manifest's sha256 {mean('manifest_s')} ({pct(data(rel, 'manifest_share_of_save'))}), verifying the "
        f"published checkpoint {mean('verify_s')} ({pct(data(rel, 'verify_share_of_save'))}); the resume's "
        f"verification {data(rel, 'resume', 'verify_s'):.4f} s of its {data(rel, 'resume', 'restore_s'):.4f} s restore"
    )
    h = data(rel, "manifest_hashing")
    return text + (
        f"; the newest checkpoint's {h['files']} files hashed side by side: {h['one_thread_s']:.4f} s on one thread, "
        f"{h['threads_s']:.4f} s on {h['threads']} threads ({h['speedup']:.2f}x, medians of {h['repeat']})"
    )


@renders("checkpoint-cost")
def checkpoint_cost() -> str:
    return checkpoint_cost_text(CKPT_COST)


@renders("checkpoint-cost-h100")
def checkpoint_cost_h100() -> str:
    return checkpoint_cost_text(CKPT_COST_H100)


CKPT_ASYNC = "benchmarks/results-checkpoint-async.json"  # checkpoint_cost.py: sync and async saves in one run, CPU
CKPT_ASYNC_H100 = "benchmarks/results-checkpoint-async-h100.json"  # the same on the lent H100, a GPT-2-medium model


def checkpoint_async_text(rel: str) -> str:
    """The stall per checkpoint, synchronous against asynchronous saves, from one run of checkpoint_cost.py."""
    sync, asyn = data(rel, "modes", "sync"), data(rel, "modes", "async")

    def mean(mode: dict[str, Any], key: str) -> str:
        return f"{field(mode, key)['mean']:.2f} s"

    second = ", ".join(f"{name} {mean(asyn, key)}" for name, key in
                       [("writing the copies", "write_s"), ("fsync", "fsync_s"), ("the manifest", "manifest_s"),
                        ("verifying", "verify_s")])  # fmt: skip
    launches = 2 if "resume" in sync else 1  # the last save of each launch is apart (final_stall_s)
    return (
        f"{sync['checkpoints']} checkpoints of {asyn['checkpoint_bytes'] / 1e6:.1f} MB per mode, "
        f"{sync['checkpoints'] - launches} of them between steps ({data(rel, 'ranks')} "
        f"rank{'s' if data(rel, 'ranks') > 1 else ''}, {data(rel, 'machine', 'filesystem')}): "
        f"the training stood still **{mean(sync, 'stall_s')}** per checkpoint with synchronous saves, "
        f"**{mean(asyn, 'stall_s')}** with asynchronous ones ({1 / data(rel, 'stall_ratio'):.1f}x less; of it the "
        f"host-memory copy {mean(asyn, 'snapshot_s')}); beside the training: {second}; a step "
        f"{sync['step_ms']:.0f} ms against {asyn['step_ms']:.0f} ms; the last save before the exit, which waits for "
        f"the whole write, {mean(sync, 'final_stall_s')} against {mean(asyn, 'final_stall_s')} (means)"
    )


# --- In-job restarts: restart.py -------------------------------------------------------------------------------

RESTART_FAULTS = (
    ("hung rank restarted", "a hung rank (SIGSTOP)"),
    ("crashed rank restarted", "a crashed rank (SIGKILL)"),
)


def _median_range(d: dict[str, float]) -> str:
    return f"{f1(d['median'])} s ({f1(d['min'])}-{f1(d['max'])})"


@renders("restart-times")
def restart_times() -> str:
    rows = []
    for name, label in RESTART_FAULTS:
        e = data(RESTART, "summary", name)
        rows.append(
            [
                label,
                str(e["rounds"]),
                _median_range(e["fault_to_noticed_s"]),
                _median_range(e["fault_to_restart_s"]),
                _median_range(e["fault_to_new_step_s"]),
                _median_range(e["fault_to_relaunched_ranks_s"]),
                f"{f0(e['target_s'])} s: {e['met']} of {e['rounds']}",
                f"{_median_range(e['first_step_to_ranks_s'])}; {_median_range(e['new_step_to_ranks_s'])}",
                ", ".join(f1(x) for x in e["load_average_1m"]),
            ]
        )
    header = ["fault", "rounds", "fault -> noticed", "-> restart decided", "-> new step started",
              "-> relaunched ranks ready", "target: rounds within",
              "a step's start to both ranks ready: first launch; restart", "load average (1 min)"]  # fmt: skip
    return table(header, rows)


@renders("restart-setup")
def restart_setup() -> str:
    return (
        f"{data(RESTART, 'date')}, SLURM {data(RESTART, 'slurm')}, {data(RESTART, 'machine', 'cpus')} CPUs shared with "
        f"other sessions' tests; `{data(RESTART, 'command')}`"
    )


@renders("checkpoint-async")
def checkpoint_async() -> str:
    return checkpoint_async_text(CKPT_ASYNC)


@renders("checkpoint-async-h100")
def checkpoint_async_h100() -> str:
    return checkpoint_async_text(CKPT_ASYNC_H100)


def render_all(files: Iterable[str] = FILES) -> dict[str, tuple[str, str]]:
    """{file: (current text, rendered text)} for every file; every renderer must be used by one of them."""
    used: set[str] = set()
    out = {}
    for rel in files:
        current = (ROOT / rel).read_text()
        out[rel] = (current, render_text(current, rel, used))
    if unused := sorted(set(RENDERERS) - used):
        raise MarkerError(f"renderer(s) no file uses: {', '.join(unused)}")
    return out


def check(files: Iterable[str] = FILES) -> list[str]:
    """A unified diff per file that differs from its rendering; empty when every file is as rendered."""
    diffs = []
    for rel, (current, rendered) in render_all(files).items():
        if current != rendered:
            old, new = current.splitlines(keepends=True), rendered.splitlines(keepends=True)
            diffs.append("".join(difflib.unified_diff(old, new, rel, f"{rel} (rendered)")))
    return diffs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 and print a diff if a file differs")
    args = p.parse_args(argv)
    try:
        rendered = render_all()
    except (MissingResult, MarkerError) as e:
        print(f"render.py: {e}", file=sys.stderr)
        return 2
    changed = [rel for rel, (current, new) in rendered.items() if current != new]
    if args.check:
        for diff in check():
            sys.stdout.write(diff)
        return 1 if changed else 0
    for rel in changed:
        (ROOT / rel).write_text(rendered[rel][1])
        print(f"rendered {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
