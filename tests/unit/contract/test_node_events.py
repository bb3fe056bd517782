"""What happened to a job's nodes: one typed record (contract/node_events.py) with one reader, and every file that
decides recovery (the node events, the failed-node marker, SLURM's view of the step) fails loudly, never quietly."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract import node_events, protocol
from snakemake_executor_multinode.contract.node_events import NodeEvent
from snakemake_executor_multinode.launching import launcher, spares

WARNED = NodeEvent(node_events.STRAGGLER, "node2", "straggler: 5x", action="warn", figure=5.0, median=1.0, measure="s")
REPLACED = NodeEvent(node_events.REPLACED, "node2", "does not answer: the node is down", "node3", 1)
NO_SPARE = NodeEvent(node_events.CHECK_FAILED, "node4", "failed its node check: no GPU", "")


def test_events_read_back_as_written_in_order_and_a_warning_is_never_a_replacement(tmp_path):
    path = tmp_path / "job.replacements.jsonl"
    node_events.append(path, WARNED)
    node_events.append(path, NO_SPARE)
    history = node_events.read(path)
    assert [e.kind for e in history.events] == [node_events.STRAGGLER, node_events.CHECK_FAILED]
    assert history.spare_replaced is False and [e.node for e in history.dropped] == ["node4"]
    assert all(e.time for e in history.events)  # stamped when written
    node_events.append(path, REPLACED)
    assert node_events.read(path).spare_replaced is True
    assert node_events.read(path).describe() == (
        "node2 straggler (5.0x the others' s; warn); node4 (failed its node check: no GPU); "
        "node2 -> node3 (does not answer: the node is down)"
    )


def test_a_missing_record_is_a_job_where_nothing_happened_and_an_unreadable_one_is_an_error(tmp_path):
    assert node_events.read(tmp_path / "none.jsonl") == node_events.NodeHistory()
    with pytest.raises(node_events.NodeEventError, match="cannot read the node events"):
        node_events.read(tmp_path)  # a folder: exists, cannot be read


def test_a_damaged_line_makes_the_answer_unknown_unless_a_complete_line_says_a_spare_took_over(tmp_path):
    path = tmp_path / "job.replacements.jsonl"
    path.write_text('{"event": "straggler", "node": "node2", "action": "warn"}\n{"event": "repl\n')
    assert node_events.read(path).damaged == (2,) and node_events.read(path).spare_replaced is None
    node_events.append(path, REPLACED)
    assert node_events.read(path).spare_replaced is True


def test_a_write_that_fails_raises_naming_the_event_and_the_path_and_a_full_disk_its_bytes(tmp_path):
    with pytest.raises(node_events.NodeEventError, match=r"cannot record 'node2 -> node3 .*': cannot write .*gone"):
        node_events.append(tmp_path / "gone" / "job.replacements.jsonl", REPLACED)
    with pytest.raises(node_events.NodeEventError, match=r"cannot write /dev/full: .*bytes needed \(a node event\)"):
        node_events.append(Path("/dev/full"), REPLACED)


@pytest.mark.parametrize(
    ("lines", "answer"),
    [
        (None, node_events.ANSWER_NO),
        ([WARNED], node_events.ANSWER_NO),
        ([WARNED, REPLACED], node_events.ANSWER_YES),
        (["not json\n"], node_events.ANSWER_UNKNOWN),
    ],
)
def test_the_job_scripts_question_is_answered_by_exit_code(tmp_path, lines, answer, capsys):
    path = tmp_path / "job.replacements.jsonl"
    for line in lines or ():
        if isinstance(line, str):
            path.write_text(line)
        else:
            node_events.append(path, line)
    assert node_events.main(["--replaced", str(path)]) == answer
    if answer == node_events.ANSWER_UNKNOWN:
        assert "damaged (line 1)" in capsys.readouterr().err


def test_the_launcher_says_an_event_it_could_not_record_and_the_caller_learns_of_it(tmp_path):
    said: list[str] = []
    env = {protocol.LOG_STEM_VAR: str(tmp_path / "gone" / "42.attempt1"), "SLURM_JOB_ID": "42"}
    assert spares.record(env, REPLACED, said.append) is False
    assert said and said[0].startswith("ERROR: cannot record 'node2 -> node3"), said
    env[protocol.LOG_STEM_VAR] = str(tmp_path / "42.attempt1")
    assert spares.record(env, REPLACED, said.append) is True and len(said) == 1
    assert node_events.read(tmp_path / "42.attempt1.replacements.jsonl").events[0].job == "42"


def test_a_checkpointed_training_after_an_unrecorded_takeover_exits_with_the_code_that_stops_the_requeue(tmp_path):
    preempt = tmp_path / "preempt"
    env = {protocol.PREEMPT_FILE_VAR: str(preempt)}
    assert launcher.unrecorded_exit(0, [REPLACED], env) == 0  # no checkpoint: the training ended, nothing to requeue
    preempt.write_text("step 7\n")
    assert launcher.unrecorded_exit(0, [], env) == 0  # every takeover recorded: the job script reads the record
    assert launcher.unrecorded_exit(1, [REPLACED], env) == 1  # a failure keeps its own code
    assert launcher.unrecorded_exit(0, [REPLACED], env) == protocol.EXIT_UNRECORDED


def test_the_failed_node_marker_names_the_first_failure_and_a_write_that_fails_is_returned_to_be_said(tmp_path):
    marker = tmp_path / "42.failed-node"
    assert protocol.record_failed_node(str(marker), "node2") is None
    assert protocol.record_failed_node(str(marker), "node3") is None  # the first failure wins, quietly: by design
    assert marker.read_text() == "node2\n"
    said = protocol.record_failed_node(str(tmp_path / "gone" / "m"), "node2")
    assert said is not None and "cannot name node node2 in the failed-node marker" in said


def test_a_marker_that_cannot_be_cleared_after_a_replacement_is_said(tmp_path):
    said: list[str] = []
    folder = tmp_path / "marker-is-a-folder"
    folder.mkdir()
    spares.forget_failed_node({protocol.FAILED_NODE_FILE_VAR: str(folder)}, "node2", said.append)
    assert said and "cannot clear the failed-node marker" in said[0]
    spares.forget_failed_node({protocol.FAILED_NODE_FILE_VAR: str(tmp_path / "none")}, "node2", said.append)
    assert len(said) == 1  # no marker: nothing to clear, nothing said


@pytest.mark.parametrize(
    "answer",
    [subprocess.TimeoutExpired(["squeue"], 10), OSError("no squeue"), subprocess.CompletedProcess([], 1, "", "x")],
)
def test_a_squeue_that_does_not_answer_leaves_the_failed_step_listed_never_gone(monkeypatch, answer):
    """Read as gone, the new step would wait for the old one's CPUs until SlurmdTimeout; read as listed, it overlaps."""

    def squeue(*args, **kwargs):
        if isinstance(answer, BaseException):
            raise answer
        return answer

    monkeypatch.setattr(spares.subprocess, "run", squeue)
    assert spares.step_present("42") is True
    assert spares.wait_step_gone("42", limit_s=0.0, sleep=lambda s: None) is False
