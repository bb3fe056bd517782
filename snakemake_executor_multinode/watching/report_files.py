"""The efficiency report as files a Snakemake report (`snakemake --report`) shows, each self-contained:
  chart       where each training job's allocation went: one stacked bar per job, one segment per ledger category
              (ledger.py), its length the node-time of that category (SVG: no plotting library needed)
  html        the Markdown report (report.to_markdown) as one HTML page: the same tables, said once
  provenance  one row per output: the rule, SLURM job(s), nodes, code and versions of its record (provenance.py)
A rule marks them with `report(...)` (workflows/Snakefile's `allocation_report`; docs/pipeline.md).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from snakemake_executor_multinode.watching import provenance
from snakemake_executor_multinode.watching.ledger import CATEGORIES
from snakemake_executor_multinode.watching.report import JobUsage, Report, to_markdown

COLOURS = {
    "startup": "#9ecae1",
    "productive": "#2ca25f",
    "checkpoint": "#3182bd",
    "restore": "#756bb1",
    "relaunch": "#fd8d3c",
    "lost": "#de2d26",
    "stalled": "#a50f15",
    "preempted": "#e7ba52",
    "teardown": "#969696",
    "spare": "#fdd0a2",
    "unknown": "#d9d9d9",
}

# the chart's layout, in SVG pixels
LABEL_W, BAR_W, VALUE_W = 230, 420, 110
ROW_H, BAR_H, TOP = 30, 18, 44
LEGEND_ROW_H, LEGEND_PER_ROW = 20, 5


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _bars(report: Report) -> list[JobUsage]:
    """The jobs the report's goodput section lists: training jobs with a ledger."""
    return [j for j in report.jobs if j.training and j.ledger is not None]


def _unit(longest_node_s: float) -> tuple[str, float]:
    """Node-hours, or node-minutes where the longest bar is shorter than one node-hour (a test's jobs)."""
    return ("node-hours", 3600.0) if longest_node_s >= 3600 else ("node-minutes", 60.0)


def _job_label(j: JobUsage) -> str:
    return f"{j.rule}{f' ({j.wildcards})' if j.wildcards else ''} job {j.jobid}"


def ledger_chart(report: Report) -> str:
    """SVG: a stacked bar per training job of where its allocation went, its goodput beside it; a legend below.
    Each segment's tooltip gives its category, node-time and share."""
    jobs = _bars(report)
    title = f"Where the allocation went (run {report.run_id})"
    longest = max((j.ledger.allocated_node_s for j in jobs if j.ledger is not None), default=0.0)
    unit, per = _unit(longest)
    scale = BAR_W / longest if longest > 0 else 0.0
    legend_rows = -(-len(CATEGORIES) // LEGEND_PER_ROW)
    axis_y = TOP + max(len(jobs), 1) * ROW_H + 4
    height = axis_y + 34 + legend_rows * LEGEND_ROW_H + 8
    width = LABEL_W + BAR_W + VALUE_W
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="sans-serif" font-size="12">',
        f"<title>{_e(title)}</title>",
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="8" y="20" font-size="14" font-weight="bold">{_e(title)}</text>',
        f'<text x="{LABEL_W + BAR_W + 8}" y="{TOP - 8}" font-weight="bold">goodput</text>',
    ]
    if not jobs:
        out.append(f'<text x="8" y="{TOP + 18}">no training job (one with GPUs or metrics) among these jobs</text>')
    for row, j in enumerate(jobs):
        x = j.ledger
        assert x is not None
        y = TOP + row * ROW_H
        out.append(f'<text x="{LABEL_W - 8}" y="{y + BAR_H - 4}" text-anchor="end">{_e(_job_label(j))}</text>')
        left = float(LABEL_W)
        for c in CATEGORIES:
            node_s = x.node_seconds[c]
            if node_s <= 0:
                continue
            w = node_s * scale
            tip = f"{_job_label(j)}: {c} {node_s / per:.2f} {unit} ({100 * node_s / x.allocated_node_s:.0f}%)"
            out.append(f'<rect x="{left:.2f}" y="{y}" width="{w:.2f}" height="{BAR_H}" fill="{COLOURS[c]}" '
                       f'data-category="{c}"><title>{_e(tip)}</title></rect>')  # fmt: skip
            left += w
        goodput = f"{100 * x.goodput:.0f}%" if x.known and x.goodput is not None else "unknown"
        out.append(f'<text x="{LABEL_W + BAR_W + 8}" y="{y + BAR_H - 4}">{goodput}</text>')
    out.append(f'<line x1="{LABEL_W}" y1="{axis_y}" x2="{LABEL_W + BAR_W}" y2="{axis_y}" stroke="black"/>')
    for k in range(5):
        tx = LABEL_W + k * BAR_W / 4
        out.append(f'<line x1="{tx:.1f}" y1="{axis_y}" x2="{tx:.1f}" y2="{axis_y + 4}" stroke="black"/>')
        out.append(f'<text x="{tx:.1f}" y="{axis_y + 16}" text-anchor="middle">{k * longest / 4 / per:.2f}</text>')
    out.append(f'<text x="{LABEL_W + BAR_W / 2}" y="{axis_y + 30}" text-anchor="middle">{unit} allocated</text>')
    for k, c in enumerate(CATEGORIES):
        lx = 8 + (k % LEGEND_PER_ROW) * (width - 16) / LEGEND_PER_ROW
        ly = axis_y + 40 + (k // LEGEND_PER_ROW) * LEGEND_ROW_H
        out.append(f'<rect x="{lx:.1f}" y="{ly}" width="12" height="12" fill="{COLOURS[c]}"/>')
        out.append(f'<text x="{lx + 16:.1f}" y="{ly + 10}">{c}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# --- HTML pages -------------------------------------------------------------------------------------------------
STYLE = (
    "body{font-family:sans-serif;font-size:14px;background:white;color:#111;margin:16px}"
    "table{border-collapse:collapse;margin:8px 0}th,td{border:1px solid #bbb;padding:3px 8px;text-align:left}"
    "th{background:#eee}code{background:#f3f3f3;padding:0 3px}"
)
CELL = re.compile(r"((?:[^|\\]|\\.)*)\|")  # a Markdown table cell up to its unescaped '|'


def page(title: str, body: Iterable[str]) -> str:
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{STYLE}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def _inline(text: str) -> str:
    """Escaped, with `code` spans."""
    parts = _e(text).split("`")
    return "".join(f"<code>{p}</code>" if k % 2 else p for k, p in enumerate(parts))


def _cells(line: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in CELL.findall(line.strip()[1:])]


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    head = "".join(f"<th>{_inline(c)}</th>" for c in header)
    body = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def markdown_html(markdown: str) -> list[str]:
    """The subset of Markdown the report writes (headings, paragraphs, tables, list items) as HTML elements."""
    out: list[str] = []
    lines = markdown.splitlines()
    k = 0
    while k < len(lines):
        line = lines[k]
        if line.startswith("|"):
            block = []
            while k < len(lines) and lines[k].startswith("|"):
                block.append(lines[k])
                k += 1
            out.append(_table(_cells(block[0]), [_cells(b) for b in block[2:]]))  # block[1]: |---|
            continue
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{_inline(line[level:].strip())}</h{level}>")
        elif line.startswith("- "):
            out.append(f"<ul><li>{_inline(line[2:])}</li></ul>")
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        k += 1
    return out


def efficiency_html(report: Report) -> str:
    return page(f"Efficiency of run {report.run_id}", markdown_html(to_markdown(report)))


def unknown_chart(why: str) -> str:
    """The chart's place when SLURM's accounting gave nothing to draw: an SVG that says why."""
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" width="640" height="60" viewBox="0 0 640 60" font-family="sans-serif" '
        f'font-size="12"><rect width="640" height="60" fill="white"/><text x="8" y="20" font-size="14" '
        f'font-weight="bold">Where the allocation went: unknown</text><text x="8" y="42">{_e(why)}</text></svg>\n'
    )


def unknown_html(why: str) -> str:
    return page("Efficiency: unknown", [f"<p>{_e(why)}</p>"])


PROVENANCE_COLUMNS = ("output", "rule", "SLURM job", "nodes", "code", "versions", "ended")


def provenance_html(workdir: Path, outputs: Sequence[str]) -> str:
    """One row per output from its provenance record; an output without one says so."""
    rows = []
    for output in outputs:
        record: Mapping[str, Any] | None = provenance.find(workdir, output)
        if record is None:
            rows.append([output, "no record: not made by a job of this plugin", "", "", "", "", ""])
            continue
        s = provenance.summary(record)
        rows.append([output, s.rule, s.jobs, s.nodes, s.code, s.versions, s.ended])
    body = [
        "<h1>Provenance of the outputs</h1>",
        "<p>How each output was made, from its provenance record. The whole record (command, job script hash, "
        "environment profile, every run): <code>multinode provenance OUTPUT</code>; what differs between two: "
        "<code>multinode provenance --diff A B</code>.</p>",
        _table(PROVENANCE_COLUMNS, rows),
    ]
    return page("Provenance of the outputs", body)
