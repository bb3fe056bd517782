"""The straggler check (launching/straggler.py): busy-time events, the output-rate fallback, the window, the actions.
The tests that start processes: tests/process/launching/test_straggler.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.launching import straggler
from snakemake_executor_multinode.watching import status_view
from tests.helpers import NODES, Job, event

SLOW = {"node1": 0.10, "node2": 0.11, "node3": 0.40}
NORMAL = {"node1": 0.10, "node2": 0.11, "node3": 0.12}


def test_a_ranks_event_gives_each_nodes_busy_seconds_and_anything_else_gives_none():
    read = straggler.ranks_event(event({"node1.cluster.org": 0.5, "node2": 1}, wall=7.5))
    assert read == straggler.RanksEvent(7.5, {"node1": 0.5, "node2": 1.0})
    read = straggler.ranks_event(event({"node1": 0.5, "node2": "x", "node3": -1, "node4": True}, wall=0))
    assert read == straggler.RanksEvent(None, {"node1": 0.5})
    step_line = {"step": 5, "loss": 2.0, "wall": 9.0, "busy_s": {"node1": 0.2}}  # a step line may carry them
    assert straggler.ranks_event(json.dumps(step_line)) == straggler.RanksEvent(9.0, {"node1": 0.2})
    superseded = {**step_line, "event": "superseded"}  # an earlier run's line, kept by a resume
    for line in ('{"step": 5, "loss": 2.0}', json.dumps(superseded), "not json", "[1]", ""):
        assert straggler.ranks_event(line) is None
    assert straggler.ranks_event(json.dumps({"event": "ranks", "busy_s": [1, 2]})) is None


def test_a_node_is_slow_only_above_the_factor_times_the_other_nodes_median():
    assert straggler.slow_nodes({"a": 1.0, "b": 1.0, "c": 1.5}, 1.5) == {}  # at the boundary: not slow
    assert straggler.slow_nodes({"a": 1.0, "b": 1.0, "c": 1.51}, 1.5) == {"c": 1.0}
    assert straggler.slow_nodes({"a": 1.0, "b": 3.0}, 2.0) == {"b": 1.0}  # two nodes: each against the other
    assert straggler.slow_nodes({"a": 5.0}, 1.5) == {}  # nothing to compare with


def test_a_straggler_is_named_once_it_stayed_slow_for_the_window_and_the_training_goes_on(tmp_path):
    job = Job(tmp_path)
    assert not job.at(1, SLOW) and not job.at(6, SLOW) and job.said == []  # slow for 5 s of the 10
    assert not job.at(11, SLOW)  # 10 s: named, warn only
    assert not job.at(16, SLOW) and not job.at(30, SLOW)  # named once
    assert len(job.said) == 1 and job.said[0].startswith("straggler: node node3's ranks 0.4 busy s/step against")
    assert "3.8x > 1.5x for 10 s; on_straggler warn: the training goes on" in job.said[0], job.said
    (rec,) = job.records()
    assert (rec["event"], rec["node"], rec["action"], rec["figure"], rec["median"]) == (
        "straggler", "node3", "warn", 0.4, 0.105,
    )  # fmt: skip
    assert status_view.replacements(str(JobFiles(Path(job.stem)).log)) == (
        "node3 straggler (3.8x the others' busy s/step; warn)"
    )


def test_a_normal_event_starts_the_window_again(tmp_path):
    job = Job(tmp_path)
    job.at(1, SLOW), job.at(5, NORMAL), job.at(8, SLOW), job.at(15, SLOW)
    assert job.said == []  # slow since 8 s only
    job.at(18, SLOW)
    assert len(job.said) == 1 and "node node3" in job.said[0]


def test_replace_with_a_spare_left_ends_the_step_once_blaming_the_straggler(tmp_path):
    job = Job(tmp_path, on="replace", spare=True)
    assert not job.at(1, SLOW) and job.at(11, SLOW)
    assert job.check.blamed is not None and job.check.blamed.node == "node3"
    assert "ending the step to replace it with a spare" in job.said[0]
    assert not job.at(21, SLOW)  # once
    assert [r["action"] for r in job.records()] == ["replace"]


def test_replace_without_a_spare_only_warns_and_says_why(tmp_path):
    job = Job(tmp_path, on="replace", spare=False)
    assert not job.at(1, SLOW) and not job.at(11, SLOW) and job.check.blamed is None
    assert "on_straggler replace, but no spare node is left: warning only" in job.said[0]
    assert [r["action"] for r in job.records()] == ["warn"]


def test_nodes_outside_the_step_and_a_rewritten_metrics_file_are_handled(tmp_path):
    job = Job(tmp_path, nodes=["node1", "node2"])
    job.at(1, {"node1": 0.1, "node2": 0.1, "gone": 9.0})  # a dropped node's figure is not compared
    # a resumed training rewrote the file (a new one, by rename), keeping an earlier launch's events
    old = event({"node1": 0.1, "node2": 0.1}, wall=time.time() - 60)
    (tmp_path / "new").write_text(old + "\n" + old + "\n" + old + "\n")
    (tmp_path / "new").replace(job.metrics)
    job.at(5, {"node1": 0.1, "node2": 0.5})
    job.at(15, {"node1": 0.1, "node2": 0.5})
    assert len(job.said) == 1 and "node node2" in job.said[0]


def test_without_events_each_nodes_output_rate_stands_in(tmp_path):
    job = Job(tmp_path)
    files = {n: JobFiles(Path(job.stem)).node_out(n) for n in NODES}

    def sample(lines: dict[str, int]) -> None:
        for node, n in lines.items():
            with files[node].open("a") as fh:
                fh.write(f"[{node} rank0] item\n" * n)
        job.clock.sleep(straggler.SAMPLE_S)
        job.check.due()

    sample({"node1": 20, "node2": 20, "node3": 5})
    sample({"node1": 20, "node2": 20, "node3": 5})
    assert len(job.said) == 1 and "s/line" in job.said[0] and "node node3" in job.said[0], job.said


def test_an_output_sample_with_a_quiet_node_names_nobody_and_starts_the_window_again(tmp_path):
    """Lockstep training whose rank 0 alone prints: the other nodes write nothing, and are not called slow."""
    job = Job(tmp_path)
    path = JobFiles(Path(job.stem)).node_out("node1")
    for _ in range(3):
        with path.open("a") as fh:
            fh.write("[node1 rank0] step\n" * 30)
        job.clock.sleep(straggler.SAMPLE_S)
        job.check.due()
    assert job.said == [] and job.check.slow_since == {}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, straggler.Settings("warn", 1.5, 120.0)),
        ({"ON_STRAGGLER": "replace", "STRAGGLER_FACTOR": "2", "STRAGGLER_WINDOW": "30"},
         straggler.Settings("replace", 2, 30)),
        ({"ON_STRAGGLER": "kill", "STRAGGLER_FACTOR": "0.5", "STRAGGLER_WINDOW": "x"}, straggler.Settings()),
    ],
)  # fmt: skip
def test_the_launcher_reads_its_settings_from_the_job_scripts_variables(env, expected):
    assert straggler.Settings.from_env({f"MULTINODE_{k}": v for k, v in env.items()}) == expected
