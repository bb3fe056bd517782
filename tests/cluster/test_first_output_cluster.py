"""A training script that writes no metrics, on the real local SLURM cluster: its goodput ledger has startup from the
run's start to the first line one of its ranks printed (each node's labeller writes that time beside the job log),
the rest unknown, and its productive time unknown, never guessed.

The ranks say nothing until the test creates a release file: the test waits for events (files, sacct's record of
the end), and the timeouts only stop hangs.
"""

from __future__ import annotations

import csv
import io
import re
import time
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import JobFiles, StateFolders
from snakemake_executor_multinode.slurm.formats import epoch
from snakemake_executor_multinode.watching.ledger import CATEGORIES
from tests.helpers import ANY_FIRST_LOG, background, figures, multinode, slurm, wait_for

pytestmark = pytest.mark.cluster

SNAKEFILE = """\
BASE = workflow.basedir


rule silent:
    output: "results/silent.txt"
    resources: nodes=2, gpus=1, cpus_per_task=1, runtime=10
    shell: "multinode torchrun {BASE}/silent.py {BASE} && echo done > {output}"
"""
# No metrics and no line before the release: each rank leaves a file to say it runs (its node), waits, prints one
# line, and ends once the test lets it.
SCRIPT = """\
import os, sys, time
from pathlib import Path

here = Path(sys.argv[1])
(here / f"waiting.{os.environ['RANK']}").write_text(os.environ["SLURMD_NODENAME"])
while not (here / "release").exists():
    time.sleep(0.2)
print(f"released rank={os.environ['RANK']}", flush=True)
while not (here / "finish").exists():
    time.sleep(0.2)
"""


def first_log(wd: Path) -> Path | None:
    logs = list((StateFolders(wd).logs / "rule_silent" / "_").glob(ANY_FIRST_LOG))
    return logs[0] if logs else None


def waiting(wd: Path, rank: int) -> str:
    """The node of a rank that waits for the release; "" before it does."""
    path = wd / f"waiting.{rank}"
    return path.read_text() if path.exists() else ""


def goodput_paragraph(wd: Path) -> str:
    status = multinode(wd, "status").stdout
    return next((p for p in status.split("\n\n") if p.startswith("goodput so far")), "")


def test_a_script_without_metrics_has_startup_to_its_first_rank_line_and_the_rest_unknown(slurm_cluster, tmp_path):
    wd = tmp_path / "silent"
    wd.mkdir()
    (wd / "Snakefile").write_text(SNAKEFILE)
    (wd / "silent.py").write_text(SCRIPT)
    with background(wd) as sm:
        wait_for(lambda: all(waiting(wd, r) for r in (0, 1)), "both ranks running", 300, sm.proc)
        log = first_log(wd)
        assert log is not None
        files = JobFiles.from_log(log)
        jobid = log.name.split(".")[0]
        # both nodes run their ranks and have written the launch line, yet no rank printed: no first output time
        nodes = {waiting(wd, r) for r in (0, 1)}
        assert len(nodes) == 2 and all("launching on" in files.node_out(n).read_text() for n in nodes), nodes
        assert files.first_output_time() is None
        shown = rf"^  silent \(job {jobid}\): unknown \(no metrics\) of \S+ GPU-h "
        paragraph = goodput_paragraph(wd)
        assert re.search(shown + r"\(unknown 100%\)$", paragraph, re.M), paragraph  # no rank line yet: unknown
        released = time.time()
        (wd / "release").touch()
        first = wait_for(files.first_output_time, "the first output time", 120, sm.proc)
        assert first >= released, (first, released)
        # the job runs on past its first line (sacct's End is whole seconds: it must not fall before the line); the
        # status shows that time as unknown
        paragraph = wait_for(
            lambda: time.time() > first + 3 and (p := goodput_paragraph(wd)) and "unknown 0%" not in p and p,
            "unknown time in the status",
            120,
            sm.proc,
        )
        assert re.search(shown + r"\(startup \d+%, unknown \d+%\)$", paragraph, re.M), paragraph
        (wd / "finish").touch()
        assert sm.wait() == 0
    text = log.read_text()
    assert all(f"rank{r}] released rank={r}" in text for r in (0, 1)), text
    times = {n: float(files.first_output(n).read_text()) for n in nodes}  # every node wrote its own
    assert files.first_output_time() == first == min(times.values()), (times, first)

    # accounting's record of the run, once slurmdbd has its end
    def ended() -> list[str] | None:
        row = slurm(slurm_cluster, "sacct", "-X", "-n", "-P", "-j", jobid, "-o", "State,Start,End,ElapsedRaw,NNodes")
        fields = row.strip().split("|")
        return fields if fields[0].startswith("COMPLETED") and epoch(fields[2]) is not None else None

    _, start_text, _, elapsed, nnodes = wait_for(ended, "sacct's record of the job's end", 120)
    start = epoch(start_text)
    assert start is not None and int(nnodes) == 2

    out = multinode(wd, "report").stdout
    csv_path = Path(re.search(r"^written: .*?(\S+\.csv)\b", out, re.M)[1])
    row = next(r for r in csv.DictReader(io.StringIO(csv_path.read_text())) if r["scope"] == "job")
    assert row["jobid"] == jobid
    alloc = float(row["alloc_node_s"])
    assert alloc == pytest.approx(int(elapsed) * 2, rel=0.02), (alloc, elapsed)
    startup = float(row["startup_node_s"]) / 2
    figures("first_output", startup_s=round(startup, 2), first_after_start_s=round(first - start, 2), elapsed=elapsed)
    assert startup > 0 and rest_of(row)["unknown"] > 0
    assert abs(start + startup - first) <= 2, (start, startup, first)  # startup ends at the first rank line
    assert row["productive_node_s"] == "" and row["goodput"] == ""  # unknown, never guessed
    rest = rest_of(row)
    assert {c: v for c, v in rest.items() if v} == {"unknown": rest["unknown"]}, rest  # the rest is unknown
    assert float(row["startup_node_s"]) + rest["unknown"] == pytest.approx(alloc)
    line = next(x for x in out.split("## Where the allocation went")[1].splitlines() if x.startswith("| silent |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2] == jobid and cells[4 + CATEGORIES.index("productive")] == "unknown" and cells[-2] == "unknown"


def rest_of(row: dict[str, str]) -> dict[str, float]:
    """The report's node-seconds of every category but startup and productive."""
    return {c: float(row[f"{c}_node_s"]) for c in CATEGORIES if c not in ("startup", "productive")}
