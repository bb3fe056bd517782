"""The efficiency report without a cluster: sacct's records (recorded on the local cluster, slurm-wlm 22.05.8) into
figures per job, per rule and per run, the suggestions, and the CSV and Markdown. The real run is in
tests/cluster/test_status_view_cluster.py."""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from snakemake_executor_multinode.cli import runs as cli_runs
from snakemake_executor_multinode.contract.jobfiles import JobFiles, StateFolders
from snakemake_executor_multinode.slurm.client import QueryError, SlurmClient
from snakemake_executor_multinode.watching import provenance, report, report_files, status_view
from snakemake_executor_multinode.watching.ledger import CATEGORIES
from snakemake_executor_multinode.watching.registry import Registry, Submission
from snakemake_executor_multinode.watching.report import JobUsage
from tests.helpers import PageTables

# sacct --duplicates -P -n -o JobIDRaw,State,ElapsedRaw,TimelimitRaw,TotalCPU,AllocCPUS,NNodes,MaxRSS,AllocTRES,ReqTRES
# 205: 40 s spinning in the batch step (sampled: MaxRSS) then a 5 s srun step; 239: requeued once, then ran 30 s;
# 440: 2 nodes x 2 GPUs for 16 s; 201: a failed 2-node torchrun step.
SACCT = """\
201|FAILED|5|UNLIMITED|00:04.532|2|2||billing=2,cpu=2,gres/gpu=2,mem=2G,node=2|billing=2,cpu=2,gres/gpu=2,mem=2G,node=2
201.batch|FAILED|5||00:00.126|1|1||cpu=1,gres/gpu=1,mem=1G,node=1|
201.0|FAILED|5||00:04.406|2|2||cpu=2,gres/gpu=2,mem=2G,node=2|
205|COMPLETED|46|5|00:23.963|1|1||billing=1,cpu=1,mem=500M,node=1|billing=1,cpu=1,mem=500M,node=1
205.batch|COMPLETED|46||00:21.771|1|1|221392K|cpu=1,mem=500M,node=1|
205.0|COMPLETED|5||00:02.191|1|1||cpu=1,mem=500M,node=1|
239|REQUEUED|3|Partition_Limit|00:00.002|1|1||billing=1,cpu=1,mem=1G,node=1|billing=1,cpu=1,mem=1G,node=1
239.batch|CANCELLED|3||00:00.002|1|1||cpu=1,mem=1G,node=1|
239|COMPLETED|30|UNLIMITED|00:00.003|1|1||billing=1,cpu=1,mem=1G,node=1|billing=1,cpu=1,mem=1G,node=1
239.batch|COMPLETED|30||00:00.003|1|1|3192K|cpu=1,mem=1G,node=1|
440|COMPLETED|16|30|00:00.112|4|2||billing=4,cpu=4,gres/gpu=4,mem=4G,node=2|billing=4,cpu=4,gres/gpu=4,mem=4G,node=2
440.batch|COMPLETED|16||00:00.112|2|1||cpu=2,gres/gpu=2,mem=2G,node=1|
"""


def rows(text: str = SACCT) -> list[dict[str, str]]:
    return [dict(zip(report.FIELDS, line.split("|"), strict=False)) for line in text.splitlines()]  # JobID: last


def sub(jobid: str, rule: str, at: float = 0.0, **wildcards: str) -> Submission:
    return Submission(
        "run1", rule, wildcards, (f"{rule}.out",), f"mn-run1-{rule}-{jobid}", 1, "", "", jobid, None, "", at
    )


def usage(rule: str = "r", **kw) -> JobUsage:
    base = dict(
        rule=rule,
        wildcards="",
        jobid="1",
        state="COMPLETED",
        runs=1,
        nodes=1,
        gpus_per_node=0,
        cpus_per_node=4,
        elapsed_s=100,
        longest_run_s=100,
        limit_s=3600,
        cpu_s=380.0,
        cpu_alloc_s=400.0,
        mem_req_mb=8192.0,
        peak_rss_mb=6000.0,
        gpu_hours=0.0,
    )
    return JobUsage(**(base | kw))


class FakeAccounting:
    def __init__(self, *answers: str | Exception) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[list[str], bool, bool]] = []

    def accounting(self, ids, fields, steps=False, patient=False):
        self.calls.append((sorted(ids, key=int), steps, patient))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return rows(answer)


def test_an_array_element_is_known_by_its_array_and_task_with_its_own_steps():
    element = (
        "2126|COMPLETED|12|5|00:10.000|1|1||billing=1,cpu=1,mem=1G,node=1||2122_3\n"
        "2126.batch|COMPLETED|12||00:10.000|1|1|102400K|cpu=1,mem=1G,node=1||2122_3.batch\n"
    )
    runs = report.parse_accounting(rows(element))
    assert list(runs) == ["2122_3"] and runs["2122_3"][0].elapsed_s == 12 and runs["2122_3"][0].batch_rss_mb == 100


def test_a_job_line_starts_a_run_and_its_steps_follow():
    runs = report.parse_accounting(rows())
    assert [r.state for r in runs["239"]] == ["REQUEUED", "COMPLETED"]
    spin = runs["205"][0]
    assert (spin.elapsed_s, spin.limit_s, spin.total_cpu_s, spin.alloc_cpus) == (46, 300, 23.963, 1)
    assert spin.mem_mb == 500.0 and spin.peak_rss_mb == pytest.approx(216.2, abs=0.1)  # the batch step's
    assert runs["440"][0].gpus == 4 and runs["440"][0].nodes == 2


def test_figures_per_job_are_sacct_arithmetic():
    runs = report.parse_accounting(rows())
    spin = report.job_usage(sub("205", "spin"), runs["205"])
    assert spin.cpu_efficiency == pytest.approx(23.963 / (46 * 1))  # TotalCPU / (Elapsed x AllocCPUS)
    assert spin.time_used == pytest.approx(46 / 300)
    assert spin.mem_used == pytest.approx(216.203125 / 500)
    requeued = report.job_usage(sub("239", "wait"), runs["239"])
    assert (requeued.runs, requeued.elapsed_s, requeued.longest_run_s, requeued.state) == (2, 33, 30, "COMPLETED")
    assert requeued.limit_s is None and requeued.time_used is None
    train = report.job_usage(sub("440", "train"), runs["440"])
    assert train.gpu_hours == pytest.approx(4 * 16 / 3600)  # gres/gpu of AllocTRES x Elapsed
    assert (train.nodes, train.gpus_per_node, train.cpus_per_node, train.mem_req_mb) == (2, 2, 2, 2048.0)


def test_per_rule_and_per_run_sums():
    fake = FakeAccounting(SACCT)
    subs = [sub("440", "train"), sub("201", "train", at=1), sub("205", "spin"), sub("239", "wait")]
    rep = report.collect("run1", subs, fake)  # type: ignore[arg-type]
    assert len(fake.calls) == 1 and fake.calls[0] == (["201", "205", "239", "440"], True, True)
    train = next(r for r in rep.rules if r.rule == "train")
    assert (train.jobs, train.completed) == (2, 1)
    assert train.gpu_hours == pytest.approx((4 * 16 + 2 * 5) / 3600)
    assert rep.gpu_hours == pytest.approx(train.gpu_hours)


def test_rules_that_waste_more_than_half_get_values_to_request():
    # 100 s of a 1 h limit, a tenth of 4 CPUs, 500 MiB of 8 GiB
    idle = [usage(cpu_s=40.0, cpu_alloc_s=400.0, peak_rss_mb=500.0)]
    assert report.suggest(idle) == {"runtime": 5, "mem_mb": 1024, "cpus_per_task": 1}
    # a GPU rule keeps a CPU per GPU
    gpu = [usage(gpus_per_node=2, cpu_s=10.0, cpu_alloc_s=400.0, longest_run_s=3000, elapsed_s=3000)]
    assert report.suggest(gpu) == {"cpus_per_task": 2}
    # the headroom: 1.5 x the longest run (40 min -> 60), whole GiB over 1.5 x the peak
    assert report.suggest([usage(longest_run_s=1000, limit_s=7200)])["runtime"] == 25
    assert report.suggest([usage(peak_rss_mb=2000.0, mem_req_mb=16384.0)])["mem_mb"] == 3072


def test_a_rule_that_used_what_it_asked_for_gets_no_suggestion_and_nor_does_a_failed_one():
    assert report.suggest([usage(longest_run_s=3000)]) == {}
    assert report.suggest([usage(state="FAILED", cpu_s=0.0, longest_run_s=1)]) == {}
    # memory never sampled (a short job): nothing said about memory
    assert "mem_mb" not in report.suggest([usage(peak_rss_mb=None)])
    # no time limit to compare with
    assert "runtime" not in report.suggest([usage(limit_s=None)])


def test_csv_has_job_rule_and_run_lines_and_markdown_names_the_suggestion(tmp_path):
    subs = [sub("205", "spin"), sub("440", "train", split="a"), sub("239", "wait")]
    rep = report.collect("run1", subs, FakeAccounting(SACCT))  # type: ignore[arg-type]
    csv_path, md_path = report.write(rep, tmp_path)
    assert csv_path == StateFolders(tmp_path).reports / "run1.csv" and md_path.suffix == ".md"
    lines = list(csv.DictReader(io.StringIO(csv_path.read_text())))
    assert [line["scope"] for line in lines] == ["job"] * 3 + ["rule"] * 3 + ["run"]
    spin = next(line for line in lines if line["scope"] == "job" and line["rule"] == "spin")
    assert float(spin["cpu_efficiency"]) == pytest.approx(23.963 / 46, abs=1e-3)
    assert spin["elapsed_s"] == "46" and spin["limit_s"] == "300"
    train = next(line for line in lines if line["scope"] == "job" and line["rule"] == "train")
    assert train["wildcards"] == "split=a" and float(train["gpu_hours"]) == pytest.approx(64 / 3600, abs=1e-4)
    assert float(lines[-1]["gpu_hours"]) == pytest.approx(64 / 3600, abs=1e-4)
    md = md_path.read_text()
    assert "# Efficiency of run run1" in md and "| train |" in md
    spin_rule = next(line for line in lines if line["scope"] == "rule" and line["rule"] == "spin")
    assert spin_rule["suggestion"] == ""  # 46 s of 5 min is within the headroom of a 5-minute floor
    assert "runtime=5" in next(line for line in md.splitlines() if line.startswith("| train |"))


def test_at_the_end_of_a_run_the_query_waits_for_slurmdbd_to_record_the_last_end():
    running = SACCT.replace("440|COMPLETED|16", "440|RUNNING|15")
    sleeps: list[float] = []
    fake = FakeAccounting(running, QueryError("slurmdbd: timed out"), SACCT)
    rep = report.collect("run1", [sub("440", "train")], fake, settle_seconds=30, sleep=sleeps.append)  # type: ignore[arg-type]
    assert [j.state for j in rep.jobs] == ["COMPLETED"] and len(fake.calls) == 3 and sleeps == [1.0, 1.0]


def test_the_settle_wait_is_bounded():
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    fake = FakeAccounting(SACCT.replace("440|COMPLETED|16", "440|RUNNING|15"))
    rep = report.collect("r", [sub("440", "train")], fake, settle_seconds=5, sleep=sleep, clock_=lambda: now[0])  # type: ignore[arg-type]
    assert rep.active and len(fake.calls) == 6  # asked at 0..5 s, then it reports what it has
    assert "still running" in report.summary_lines(rep, Path("r.md"))[-1]


def test_end_of_run_never_fails_the_run(tmp_path):
    Registry(tmp_path, "run1").record(sub("440", "train"))
    down = SlurmClient(runner=lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "sacct: error: disabled"))
    lines = report.end_of_run(tmp_path, "run1", down)
    assert lines and "not written" in lines[0] and "multinode report --run run1" in lines[0]
    assert "--immediate-submit" in report.end_of_run(tmp_path, "run1", down, queued=True)[0]
    assert report.end_of_run(tmp_path, "nothing", down) == []


# --- where the allocation went: the goodput ledger in the report --------------------------------------------------
# 501: 2 nodes x 4 GPUs, requeued: its first run died 30 s after its checkpoint at step 40, its rerun resumed there.
# 502: 1 node, no GPU, no metrics (a shell rule). 503: 1 node x 1 GPU, no metrics: a training whose script is silent.
def t(seconds: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(1_800_000_000 + seconds).isoformat(timespec="seconds")


def timed_row(jobid: str, state: str, elapsed: int, nodes: int, gpus: int, start: float, submit: float) -> str:
    tres = f"billing=1,cpu={nodes},gres/gpu={gpus * nodes},mem=1G,node={nodes}" if gpus else "cpu=1,mem=1G,node=1"
    return (
        f"{jobid}|{state}|{elapsed}|60|00:01.000|{nodes}|{nodes}||{tres}|{tres}|{jobid}"
        f"|{t(start)}|{t(start + elapsed)}|{t(submit)}"
    )


TIMED = "\n".join(
    [
        timed_row("501", "REQUEUED", 300, 2, 4, start=0, submit=-60),
        timed_row("501", "COMPLETED", 200, 2, 4, start=400, submit=300),
        timed_row("502", "COMPLETED", 100, 1, 0, start=0, submit=0),
        timed_row("503", "COMPLETED", 100, 1, 1, start=0, submit=0),
    ]
)


def timed_job(tmp_path: Path, jobid: str, rule: str, metrics: list[dict] | None) -> Submission:
    log = tmp_path / "logs" / f"{jobid}.attempt1.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("[multinode] job\n")
    if metrics is not None:
        base = 1_800_000_000
        lines = [{**m, "wall": base + m["wall"]} for m in metrics]
        JobFiles.from_log(log).metrics.write_text("".join(json.dumps(m) + "\n" for m in lines))
    return Submission("run1", rule, {}, (f"{rule}.out",), f"mn-{jobid}", 1, "", str(log), jobid, None, "", 0.0)


def goodput_report(tmp_path: Path) -> report.Report:
    metrics = [
        {"step": 40, "wall": 100},  # startup 100 s
        {"event": "checkpoint_begin", "step": 40, "wall": 100},
        {"event": "checkpoint_end", "step": 40, "wall": 120},  # checkpoint 20 s
        {"step": 45, "wall": 150},  # lost 30 s, then 150 s of teardown to the run's end at 300
        {"event": "resume", "step": 40, "wall": 450, "restore_s": 10},  # startup 40 s, restore 10 s
        {"step": 50, "wall": 600},  # productive 150 s; the run ends at 600
    ]
    subs = [timed_job(tmp_path, "501", "train", metrics), timed_job(tmp_path, "502", "prep", None)]
    subs.append(timed_job(tmp_path, "503", "silent", None))
    return report.collect("run1", subs, FakeAccounting(TIMED))  # type: ignore[arg-type]


def test_sacct_start_end_and_submit_give_each_run_its_allocation_and_the_job_its_ledger(tmp_path):
    rep = goodput_report(tmp_path)
    train = next(j for j in rep.jobs if j.rule == "train")
    assert train.ledger is not None and train.ledger.known
    assert {k: v for k, v in train.ledger.seconds.items() if v} == {
        "startup": 140, "checkpoint": 20, "lost": 30, "teardown": 150, "restore": 10, "productive": 150,
    }  # fmt: skip
    assert train.ledger.allocated_node_s == 2 * 500 and train.ledger.allocated_gpu_h == pytest.approx(8 * 500 / 3600)
    assert train.ledger.queue_wait_s == 60 + 100
    assert train.ledger.goodput == pytest.approx(150 / 500)


def test_the_markdown_says_where_each_training_jobs_allocation_went_and_the_runs(tmp_path):
    md = report.to_markdown(goodput_report(tmp_path))
    assert "## Where the allocation went" in md
    section = md.split("## Where the allocation went")[1]
    header = next(x for x in section.splitlines() if x.startswith("| rule |"))
    assert header == (
        "| rule | wildcards | job | allocated | startup | productive | checkpoint | restore | relaunch | lost | "
        "stalled | preempted | teardown | spare | unknown | goodput | queue wait |"
    )
    train = next(x for x in section.splitlines() if x.startswith("| train |"))
    shares = "| 28% | 30% | 4% | 2% | 0% | 6% | 0% | 0% | 30% | 0% | 0% | 30% |"
    assert train == f"| train | - | 501 | 1.111 GPU-h {shares} 0:02:40 |"
    silent = next(x for x in section.splitlines() if x.startswith("| silent |"))
    # no metrics and no first output line: all unknown, neither startup nor productive by guess
    shares = "| 0% | unknown | 0% | 0% | 0% | 0% | 0% | 0% | 0% | 0% | 100% | unknown |"
    assert silent.endswith(f"{shares} 0:00:00 |"), silent
    assert "| prep |" not in section  # no GPU, no metrics: not a training job
    total = next(x for x in section.splitlines() if x.startswith("| all training jobs |"))
    assert "| 2 job(s) | 1.139 GPU-h |" in total and "| 30% | 0:02:40 |" in total  # goodput of the jobs it knows
    assert "1 job(s) wrote no metrics" in section


def test_the_csv_has_the_ledgers_node_seconds_per_category_and_productive_empty_when_unknown(tmp_path):
    lines = list(csv.DictReader(io.StringIO(report.to_csv(goodput_report(tmp_path)))))
    train = next(x for x in lines if x["scope"] == "job" and x["rule"] == "train")
    assert float(train["alloc_node_s"]) == 1000 and float(train["productive_node_s"]) == 300
    assert float(train["lost_node_s"]) == 60 and float(train["goodput"]) == pytest.approx(0.3)
    assert float(train["queue_wait_s"]) == 160
    silent = next(x for x in lines if x["scope"] == "job" and x["rule"] == "silent")
    assert silent["productive_node_s"] == "" and silent["goodput"] == "" and float(silent["startup_node_s"]) == 0
    assert float(silent["unknown_node_s"]) == 100
    prep = next(x for x in lines if x["scope"] == "job" and x["rule"] == "prep")
    assert prep["alloc_node_s"] == ""
    run = lines[-1]
    assert float(run["alloc_node_s"]) == 1100 and float(run["productive_node_s"]) == 300
    assert sum(float(run[f"{c}_node_s"]) for c in CATEGORIES) == pytest.approx(1100)


def test_a_running_job_ends_its_last_run_now(tmp_path):
    running = timed_row("504", "RUNNING", 0, 1, 1, start=0, submit=0).replace(f"|{t(0)}|{t(0)}|", f"|{t(0)}|Unknown|")
    sub_ = timed_job(tmp_path, "504", "train", [{"step": 10, "wall": 50}])
    job = report.job_usage(sub_, report.parse_accounting(rows(running))["504"], now=1_800_000_000 + 80)
    assert job.ledger is not None and job.ledger.seconds["startup"] == 50 and job.ledger.seconds["teardown"] == 30


def test_a_run_whose_log_says_the_watchdog_ended_it_is_stalled_after_its_last_progress(tmp_path):
    from snakemake_executor_multinode.launching import stall

    sub_ = timed_job(tmp_path, "505", "train", [{"step": 10, "wall": 50}])
    Path(sub_.log).write_text(f"[multinode] job\n[multinode] {stall.NOTICED} 2026-12-05T01:00:00+00:00: ...\n")
    row = timed_row("505", "FAILED", 100, 1, 1, start=0, submit=0)
    job = report.job_usage(sub_, report.parse_accounting(rows(row))["505"])
    assert job.ledger is not None and job.ledger.seconds["stalled"] == 50 and job.ledger.seconds["teardown"] == 0


def test_a_stall_after_which_the_run_relaunched_its_training_did_not_end_it(tmp_path):
    """An in-job restart (or a spare's replacement) after the watchdog's stall: the run went on and its end, after
    the last progress, is teardown; a second stall after the restart did end it."""
    from snakemake_executor_multinode.launching import stall

    sub_ = timed_job(tmp_path, "506", "train", [{"step": 10, "wall": 50}])
    restarted = (
        f"[multinode torchrun] {stall.NOTICED} 2026-12-05T01:00:00+00:00: ...\n"
        f"[multinode torchrun] restarting the training on the same nodes (stalled: ...){stall.RELAUNCHED}1, ...\n"
    )
    Path(sub_.log).write_text(restarted)
    row = timed_row("506", "COMPLETED", 100, 1, 1, start=0, submit=0)
    job = report.job_usage(sub_, report.parse_accounting(rows(row))["506"])
    assert job.ledger is not None and job.ledger.seconds["teardown"] == 50 and job.ledger.seconds["stalled"] == 0
    Path(sub_.log).write_text(restarted + f"[multinode torchrun] {stall.NOTICED} 2026-12-05T01:01:00+00:00: ...\n")
    job = report.job_usage(sub_, report.parse_accounting(rows(row.replace("COMPLETED", "FAILED")))["506"])
    assert job.ledger is not None and job.ledger.seconds["stalled"] == 50


@pytest.mark.parametrize(
    ("state", "said"),
    [
        ("TIMEOUT", ""),  # a hang that ran into the time limit
        ("NODE_FAIL", ""),  # a dead node: SLURM ended the job after SlurmdTimeout
        ("FAILED", "node node2 (node_rank 1) {said}; stopping the others"),  # the launcher, on SLURM's node failure
    ],
)
def test_a_hang_that_slurm_ended_is_stalled_after_the_last_progress_not_teardown(tmp_path, state, said):
    from snakemake_executor_multinode.launching import stall

    sub_ = timed_job(tmp_path, "507", "train", [{"step": 10, "wall": 50}])
    Path(sub_.log).write_text(f"[multinode] job\n[multinode] {said.format(said=stall.NODE_FAILURE_SAID)}\n")
    row = timed_row("507", state, 400, 1, 1, start=0, submit=0)
    job = report.job_usage(sub_, report.parse_accounting(rows(row))["507"])
    assert job.ledger is not None and job.ledger.seconds["stalled"] == 350 and job.ledger.seconds["teardown"] == 0


def test_a_run_that_ended_by_itself_after_its_last_progress_is_teardown(tmp_path):
    sub_ = timed_job(tmp_path, "508", "train", [{"step": 10, "wall": 50}])
    job = report.job_usage(sub_, report.parse_accounting(rows(timed_row("508", "FAILED", 60, 1, 1, 0, 0)))["508"])
    assert job.ledger is not None and job.ledger.seconds["teardown"] == 10 and job.ledger.seconds["stalled"] == 0


def test_a_silent_jobs_startup_ends_at_each_runs_first_output_and_the_rest_is_unknown(tmp_path):
    """No metrics: each run's startup ends at the first line a rank printed (the earliest of its nodes' first output
    files, a restart's from its own), the rest is unknown, and so is its productive time."""
    sub_ = timed_job(tmp_path, "506", "silent", None)
    files = JobFiles.from_log(sub_.log)
    files.first_output("node2").write_text(f"{1_800_000_000 + 25}\n")
    files.first_output("node1").write_text(f"{1_800_000_000 + 20}\n")  # the earliest node's
    files.restart(1).first_output("node1").write_text(f"{1_800_000_000 + 430}\n")
    requeued = "\n".join([timed_row("506", "REQUEUED", 300, 2, 1, start=0, submit=0),
                          timed_row("506", "COMPLETED", 200, 2, 1, start=400, submit=300)])  # fmt: skip
    job = report.job_usage(sub_, report.parse_accounting(rows(requeued))["506"])
    assert job.ledger is not None and not job.ledger.known
    assert [{k: v for k, v in r.seconds.items() if v} for r in job.ledger.runs] == [
        {"startup": 20, "unknown": 280},
        {"startup": 30, "unknown": 170},
    ]
    assert job.ledger.goodput is None and job.ledger.productive_node_s is None
    rep = report.Report("run1", [job], [], [])
    section = report.to_markdown(rep).split("## Where the allocation went")[1]
    line = next(x for x in section.splitlines() if x.startswith("| silent |"))
    # startup to the first lines, then unknown
    shares = "| 10% | unknown | 0% | 0% | 0% | 0% | 0% | 0% | 0% | 0% | 90% | unknown |"
    assert line == f"| silent | - | 506 | 0.278 GPU-h {shares} 0:01:40 |"


def test_the_markdown_lists_the_nodes_replaced_by_spares_within_a_job(tmp_path):
    rep = goodput_report(tmp_path)
    assert "replaced by spares" not in report.to_markdown(rep)
    train = next(j for j in rep.jobs if j.rule == "train")
    line = {"event": "replaced", "node": "node2", "spare": "node3", "why": "does not answer", "relaunch": 1}
    JobFiles(tmp_path / "logs" / "501.attempt1").replacements.write_text(json.dumps(line) + "\n")
    md = report.to_markdown(report.collect("run1", [timed_job(tmp_path, "501", "train", [{"step": 1, "wall": 1}])],
                                           FakeAccounting(TIMED)))  # type: ignore[arg-type]  # fmt: skip
    assert "| train | - | 501 | node2 -> node3 (does not answer) |" in md, md
    assert train.replaced == ""


# --- the report as files for Snakemake's report (report_files.py; rendered: tests/cluster/test_pipeline_cluster.py)
SVG = "{http://www.w3.org/2000/svg}"


def test_every_ledger_category_has_a_colour():
    assert set(report_files.COLOURS) == set(CATEGORIES)


def test_the_chart_has_a_bar_per_training_job_cut_into_its_ledgers_categories(tmp_path):
    rep = goodput_report(tmp_path)  # train: 2 nodes, 1000 node-s, goodput 30%; silent: no metrics; prep: no GPU
    svg = ET.fromstring(report_files.ledger_chart(rep))
    texts = [t.text for t in svg.iter(f"{SVG}text")]
    assert "train job 501" in texts and "silent job 503" in texts and not any("prep" in (t or "") for t in texts)
    assert "30%" in texts and "unknown" in texts  # silent's goodput is never guessed
    segments = [r for r in svg.iter(f"{SVG}rect") if r.get("data-category")]
    train = [r for r in segments if "train job 501" in r.findtext(f"{SVG}title", "")]
    # the longest bar spans the bar area; each segment's width is its share of the job's node-seconds
    widths = {r.get("data-category"): float(r.get("width", "0")) for r in train}
    assert sum(widths.values()) == pytest.approx(report_files.BAR_W, abs=0.05)
    assert widths["productive"] == pytest.approx(report_files.BAR_W * 0.3, abs=0.05)
    assert set(widths) == {"startup", "checkpoint", "lost", "teardown", "restore", "productive"}  # none of 0 s
    assert "train job 501: productive 5.00 node-minutes (30%)" in [r.findtext(f"{SVG}title") for r in train]
    silent = [r.get("data-category") for r in segments if "silent" in r.findtext(f"{SVG}title", "")]
    assert silent == ["unknown"]
    assert {t for t in texts if t in CATEGORIES} == set(CATEGORIES)  # the legend


def test_a_chart_without_a_training_job_says_so():
    rep = report.Report("run1", [usage("prep")], report.per_rule([usage("prep")]), [])
    svg = report_files.ledger_chart(rep)
    ET.fromstring(svg)  # well-formed
    assert "no training job" in svg and "data-category" not in svg


def test_the_html_page_is_the_markdown_reports_tables(tmp_path):
    rep = goodput_report(tmp_path)
    page = PageTables(report_files.efficiency_html(rep))
    md_tables = [line for line in report.to_markdown(rep).splitlines() if line.startswith("|---")]
    assert len(page.tables) == len(md_tables) >= 3
    assert "Where the allocation went" in page.headings
    goodput = page.tables[-1]
    assert goodput[0][:4] == ["rule", "wildcards", "job", "allocated"]
    assert ["train", "-", "501", "1.111 GPU-h", "28%", "30%"] == next(r for r in goodput if r[0] == "train")[:6]


def test_a_markdown_cell_with_a_bar_and_code_stays_one_cell():
    html = "\n".join(report_files.markdown_html("| a | b |\n|---|---|\n| x \\| y | `<z>` |\nrun `multinode`"))
    assert PageTables(html).tables == [[["a", "b"], ["x | y", "<z>"]]]
    assert "<code>&lt;z&gt;</code>" in html and "<p>run <code>multinode</code></p>" in html


def made_by(tmp_path: Path, run: str, jobid: str, outputs: tuple[str, ...], ended: str | None, at: float) -> None:
    reg = Registry(tmp_path, run)
    sub = Submission(run, "r", {}, outputs, f"mn-{run}-{jobid}", 1, "", "", jobid, None, "", at, ended)
    reg.record(sub)


def test_the_makers_of_outputs_are_the_newest_jobs_that_succeeded_with_them(tmp_path):
    made_by(tmp_path, "a", "10", ("x", "y"), "success", 1.0)
    made_by(tmp_path, "b", "11", ("y",), "success", 2.0)  # y made again
    made_by(tmp_path, "b", "12", ("x",), "failed", 3.0)  # a failed attempt makes nothing
    made_by(tmp_path, "b", "13", ("z",), None, 4.0)  # still running (or never seen to end)
    subs, missing = status_view.makers(tmp_path, ["x", str(tmp_path / "y"), "z", "w"])
    assert [s.jobid for s in subs] == ["10", "11"] and missing == ["z", "w"]


def report_args(tmp_path: Path, **kw) -> argparse.Namespace:
    base = dict(directory=tmp_path, run="latest", outputs=None, chart=None, html=None, provenance=None)
    return argparse.Namespace(**(base | kw))


def test_provenance_without_outputs_and_outputs_no_job_made_are_refused_with_a_message(tmp_path, capsys):
    assert cli_runs.report_command(report_args(tmp_path, provenance=tmp_path / "p.html")) == 2
    assert "--provenance needs --for OUTPUT" in capsys.readouterr().err
    assert cli_runs.report_command(report_args(tmp_path, outputs=["results/x"])) == 1
    assert "no job of the runs in" in capsys.readouterr().err
    assert not (tmp_path / "p.html").exists()


def test_the_command_writes_the_chart_the_page_and_the_provenance_of_the_outputs(tmp_path, monkeypatch, capsys):
    made_by(tmp_path, "a", "501", ("results/model.pt",), "success", 1.0)
    record = provenance.submission(rule="train", wildcards={}, command="train", script="", code={}, environment={},
                                   outputs=["results/model.pt"])  # fmt: skip
    provenance.save_submission(tmp_path, "mn-run-train", record)
    provenance.finish(tmp_path, "mn-run-train", None, {"state": "success"})
    rep = goodput_report(tmp_path)
    monkeypatch.setattr(report, "collect", lambda run, subs, client, settle_seconds: rep)
    out = tmp_path / "out"
    args = report_args(tmp_path, outputs=["results/model.pt"], chart=out / "a.svg", html=out / "e.html",
                       provenance=out / "p.html")  # fmt: skip
    assert cli_runs.report_command(args) == 0
    ET.fromstring((out / "a.svg").read_text())
    assert "Where the allocation went" in (out / "e.html").read_text()
    assert "results/model.pt" in (out / "p.html").read_text()
    assert not (tmp_path / report.REPORTS_DIR).exists()  # the files of a run are a run's
    assert capsys.readouterr().out.count("written:") == 1


def test_without_accounting_the_outputs_report_says_the_figures_are_unknown_and_keeps_the_provenance(
    tmp_path, monkeypatch, capsys
):
    made_by(tmp_path, "a", "501", ("results/model.pt",), "success", 1.0)

    def no_accounting(run, subs, client, settle_seconds=None):
        raise QueryError("sacct: error: Slurm accounting storage is disabled")

    monkeypatch.setattr(report, "collect", no_accounting)
    out = tmp_path / "out"
    args = report_args(tmp_path, outputs=["results/model.pt"], chart=out / "a.svg", html=out / "e.html",
                       provenance=out / "p.html")  # fmt: skip
    assert cli_runs.report_command(args) == 0  # the workflow's report rule goes on
    assert "accounting storage is disabled" in capsys.readouterr().err
    chart = ET.fromstring((out / "a.svg").read_text())
    assert "Where the allocation went: unknown" in "".join(chart.itertext())
    assert "accounting storage is disabled" in (out / "e.html").read_text()
    assert "results/model.pt" in (out / "p.html").read_text()
    # a run's report without accounting stays an error: there is nothing else to show
    assert cli_runs.report_command(report_args(tmp_path)) == 1
    assert "the report needs sacct" in capsys.readouterr().err
