"""A job's preempted runs and their preemptors (watching/preemptions.py): SLURM keeps no record of who preempted a
job, so the preemptor is the first job SLURM started on the run's nodes after its end, submitted before the notice."""

from __future__ import annotations

import json
from datetime import datetime

from snakemake_executor_multinode.slurm.client import SlurmClient, Started
from snakemake_executor_multinode.watching import preemptions
from tests.helpers import FakeSlurm


def at(clock: str) -> float:
    return datetime.fromisoformat(f"2026-12-06T{clock}+00:00").timestamp()


def iso(clock: str) -> str:
    return f"2026-12-06T{clock}+00:00"


RUNS = [
    {"event": "start", "job": "57", "restart": 0, "nodes": "node[1-2]", "time": iso("05:40:00")},
    {"event": "preempted", "job": "57", "restart": 0, "time": iso("05:51:59"), "ends": iso("05:52:19"), "grace_s": 20},
    {"event": "end", "job": "57", "restart": 0, "exit": 85, "time": iso("05:52:30")},
    {"event": "start", "job": "57", "restart": 1, "nodes": "node[2-3]", "time": iso("05:53:00")},
]


def test_a_preempted_run_is_read_from_the_runs_file_with_its_nodes_and_how_it_ended():
    (run,) = preemptions.preempted_runs([*RUNS, "not a line", {"event": "preempted"}])
    assert (run.job, run.restart, run.nodes, run.end, run.exit) == ("57", 0, ("node1", "node2"), at("05:52:30"), 85)


def test_the_preemptor_is_the_first_job_started_on_the_runs_nodes_after_its_end_submitted_before_the_notice():
    (run,) = preemptions.preempted_runs(RUNS)
    started = [
        Started("60", at("05:52:10"), at("05:30:00"), "node2"),  # started before the run's end: a neighbour's
        Started("57", at("05:53:00"), at("05:30:00"), "node[2-3]"),  # the job itself, requeued
        Started("61", at("05:52:31"), at("05:52:20"), "node1"),  # submitted after the notice: not what it waited for
        Started("62", at("05:52:33"), at("05:51:58"), "node4"),  # other nodes
        Started("63", at("05:52:33"), at("05:51:58"), "node[1-2]"),  # the preemptor
    ]
    assert preemptions.preemptor(run, started) == "63"
    assert preemptions.preemptor(run, started[:4]) is None


def test_the_run_is_said_with_its_preemptor_and_whether_it_checkpointed():
    (run,) = preemptions.preempted_runs(RUNS)
    said = run.describe("63")
    assert said.startswith("run 0 preempted by job 63 (SLURM's preemption SIGTERM at ")
    assert ", grace time 20 s, to " in said and said.endswith("); checkpointed"), said
    cut = preemptions.preempted_runs([*RUNS[:2], {**RUNS[2], "exit": 143}])[0]
    assert cut.describe(None).endswith("; not checkpointed in the grace time: resumed from the last checkpoint")
    assert preemptions.preempted_runs(RUNS[:2])[0].describe(None).endswith("; running out its grace time")


def test_the_next_runs_log_line_asks_slurm_once(tmp_path, capsys):
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(json.dumps(line) + "\n" for line in RUNS))
    squeue = "63|2026-12-06T05:52:33|2026-12-06T05:51:58|node[1-2]|N/A|N/A|\n"
    fake = FakeSlurm(squeue=(0, squeue, ""), sacct=(0, "", ""))
    env = {"SLURM_JOB_ID": "57", "SLURM_RESTART_COUNT": "1"}
    assert preemptions.say_previous(str(runs), env, SlurmClient(runner=fake)) == 0
    assert capsys.readouterr().out.startswith("[multinode] run 0 preempted by job 63 (")
    assert fake.count("squeue") == 1 and fake.count("sacct") == 1
    assert preemptions.say_previous(str(runs), {**env, "SLURM_RESTART_COUNT": "2"}, SlurmClient(runner=fake)) == 0
    assert capsys.readouterr().out == ""  # run 1 was not preempted
