"""How each run of a job ended (run_ends.py), from the lines the job script writes to the runs file, and how
`multinode status` says it."""

from __future__ import annotations

import json
from pathlib import Path

from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.contract.protocol import EXIT_PREEMPTED, EXIT_STALLED
from snakemake_executor_multinode.slurm.client import SlurmClient
from snakemake_executor_multinode.watching import run_ends, status_view
from tests.helpers import FakeSlurm, record


def start(k: int) -> dict:
    return {"event": "start", "job": "7", "restart": k, "nodes": "node[1-2]"}


def end(k: int, code: int, why: str = "") -> dict:
    return {"event": "end", "job": "7", "restart": k, "exit": code, "why": why}


def test_each_run_says_how_it_ended_and_who_requeued_it():
    lines = [
        start(0), {"event": "requeue", "job": "7", "restart": 0, "why": "checkpointed before the time limit"},
        start(1), end(1, 143),  # an admin's `scontrol requeue`: SIGTERM, and a next run
        start(2), end(2, EXIT_STALLED, "stalled: ended by the progress watchdog; failing node node2"),
    ]  # fmt: skip
    assert run_ends.ends(lines, active=False) == [
        "requeued by itself (checkpointed before the time limit)",
        "exit 143, requeued by SLURM",
        "exit 87 (stalled: ended by the progress watchdog; failing node node2)",
    ]
    assert run_ends.describe(lines, active=False).startswith("run 1: requeued by itself (")


def test_an_exit_code_speaks_where_the_line_has_no_why_and_a_job_still_running_says_so():
    assert run_ends.ends([start(0), end(0, EXIT_PREEMPTED)], active=False) == ["exit 85 (checkpointed, not requeued)"]
    assert run_ends.ends([start(0), end(0, 3, "failing node node4")], active=False) == ["exit 3 (failing node node4)"]
    assert run_ends.ends([start(0), end(0, 143), start(1)], active=True) == [
        "exit 143, requeued by SLURM",
        "running",
    ]
    assert run_ends.ends([start(0)], active=False) == ["ended without an end line (killed)"]


def test_one_clean_run_or_a_run_under_way_has_nothing_to_say_and_odd_lines_are_left_out():
    assert run_ends.describe([start(0), end(0, 0)], active=False) == ""
    assert run_ends.describe([start(0)], active=True) == ""
    assert run_ends.describe(["garbage", {"event": "end"}, {"restart": "x"}, start(0), end(0, 0)], False) == ""


def test_status_lists_how_the_runs_of_a_job_ended(tmp_path):
    sub = record(tmp_path, "aaaa1111", "train", "239", at=1.0)
    runs = JobFiles.from_log(sub.log).runs
    runs.parent.mkdir(parents=True)
    Path(sub.log).touch()
    lines = [start(0), end(0, 143), start(1), end(1, EXIT_STALLED, "stalled: ended by the progress watchdog")]
    runs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    sacct = "239|REQUEUED|None|3|30|1|node=1|node=1\n239|FAILED|None|30|30|1|node=1|node=1\n"
    client = SlurmClient(runner=FakeSlurm(squeue=(0, "", ""), sacct=(0, sacct, "")))
    rows = status_view.collect(tmp_path, status_view.run_table(tmp_path)["aaaa1111"], client)
    text = status_view.render("aaaa1111", rows, tmp_path)
    assert (
        "how the runs ended (requeued, stalled, the failing node):\n  train (job 239): run 1: exit 143, requeued by "
        "SLURM; run 2: exit 87 (stalled: ended by the progress watchdog)"
    ) in text, text
