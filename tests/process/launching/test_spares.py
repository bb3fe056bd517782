"""Spare nodes: which nodes a launch trains on, and the launcher's relaunch on a spare (the real run is in
tests/cluster/test_spare_nodes_cluster.py); a node a stalled step's head cannot reach (a network split) is one.

Here the tests that start processes (the process tier); the others: tests/unit/launching/test_spares.py."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.launching import launcher, liveness, stall
from snakemake_executor_multinode.launching.launcher import StepEnd
from tests.helpers import BARRIER, finder, write_stacks

# --- a stall: the node holding the ranks that differ is replaced, when a spare is left ------------------------------


# srun whose step the launcher's gentle stop (USR1) ends
SRUN_STOPS = "trap 'exit 1' USR1; while :; do sleep 0.1; done"


def stalled_step(
    tmp_path: Path,
    nodes: Sequence[str],
    stacks: dict[int, tuple[str, str]],
    answering: Sequence[str],
    srun_body: str = SRUN_STOPS,
    **launch: object,
) -> tuple[StepEnd, Path, Path, Path]:
    """A step of `nodes` that makes no progress under on_stall requeue (a 1 s stall timeout), run by the launcher's
    supervision (launch_step, with `launch`): its ranks' stacks are `stacks` (rank -> node, innermost frame), the
    `answering` nodes have written theirs all. How it ended, its stall marker, requeue request and failed-node
    marker."""
    stem = str(JobFiles.of(tmp_path, "9", 1).prefix)
    write_stacks(stem, stacks)
    for node in answering:
        stall.done_file(stem, node).write_text("done\n")
    marker, preempt, failed = tmp_path / "9.stalled", tmp_path / "9.preempted", tmp_path / "9.failed-node"
    env = {
        protocol.LOG_STEM_VAR: stem,
        protocol.STALL_TIMEOUT_VAR: "1",
        protocol.ON_STALL_VAR: "requeue",
        protocol.STALL_FILE_VAR: str(marker),
        protocol.PREEMPT_FILE_VAR: str(preempt),
        protocol.FAILED_NODE_FILE_VAR: str(failed),
    }
    srun = tmp_path / "srun"
    srun.write_text(f"#!/bin/bash\n{srun_body}\n")
    srun.chmod(0o755)
    with pytest.MonkeyPatch.context() as mp:  # the training has begun (when: tests/unit/launching/test_stall.py)
        mp.setattr(stall.LaunchStart, "check", lambda self: True)
        end = launcher.launch_step([str(srun)], env, nodes, **launch)
    return end, marker, preempt, failed


def stalled(tmp_path: Path, spare_left: bool, restartable: bool = False) -> tuple[StepEnd, Path, Path]:
    """A step that makes no progress under on_stall requeue, whose rank 2 on node2 differs: how it ended, its
    stall marker and its requeue request. `restartable`: an in-job restart is left (launching/restarts.py)."""
    nodes = ["node1", "node2"]
    stacks = {0: ("node1", BARRIER), 1: ("node1", BARRIER), 2: ("node2", "sleep (t.py:3)")}
    end, marker, preempt, _ = stalled_step(
        tmp_path, nodes, stacks, nodes, spare_left=spare_left, restartable=restartable
    )
    return end, marker, preempt


def test_a_stall_with_a_spare_left_blames_the_odd_node_and_records_no_verdict(tmp_path, capfd):
    end, marker, preempt = stalled(tmp_path, spare_left=True)
    assert end.code == protocol.EXIT_STALLED and end.failure is not None
    assert (end.failure.node, end.failure.rank, end.failure.what) == ("node2", 1, launcher.STALLED_WHAT)
    assert not marker.exists() and not preempt.exists()  # neither the watchdog's verdict nor a requeue
    assert "node node2 holds the rank(s) that differ" in capfd.readouterr().err


def test_a_stall_without_a_spare_is_recorded_and_requeued_as_before(tmp_path):
    end, marker, preempt = stalled(tmp_path, spare_left=False)
    assert end.code == protocol.EXIT_STALLED and end.failure is None
    assert marker.read_text().startswith("stalled: no progress") and preempt.read_text() == "stalled\n"


def test_a_stall_without_a_spare_but_with_a_restart_left_goes_back_unrecorded_for_the_restart(tmp_path):
    """Neither the watchdog's verdict nor the requeue request: the launcher restarts the training in the job, or
    else records the verdict itself (launcher.end_stall; tests/unit/launching/test_restarts.py)."""
    end, marker, preempt = stalled(tmp_path, spare_left=False, restartable=True)
    assert end.code == protocol.EXIT_STALLED and end.failure is None
    assert end.stalled.startswith("stalled: no progress for 1s on any rank") and "rank 2 differs" in end.stalled
    assert not marker.exists() and not preempt.exists()
    (tmp_path / "spare").mkdir()
    with_spare, marker, preempt = stalled(tmp_path / "spare", spare_left=True, restartable=True)
    assert with_spare.failure is not None and with_spare.failure.node == "node2" and not with_spare.stalled  # a spare


# --- a network split under a stalled step (issue 38, part 5) ----------------------------------------------------------
# The head asks every node whether it answers; a node it cannot reach is named and blamed: replaced by a spare where one
# is left, else named for the retry to exclude and never requeued (the real split: test_network_split_cluster.py).


# the launcher's stall check


# srun as in a split: the gentle stop (USR1) ends the head's task, which srun reports; srun then waits on the
# cut-off node's task for ever, SIGTERM ("forcing job termination") or not.
SRUN_WAITS_ON_NODE2 = (
    "trap 'echo \"srun: error: node1: task 0: Exited with exit code 1\" >&2' USR1; trap '' TERM\n"
    "while :; do sleep 0.1; done"
)


def split_step(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    down: Sequence[str],
    spare_left: bool,
    nodes: Sequence[str],
    srun_body: str = SRUN_STOPS,
) -> tuple[StepEnd, Path, Path, Path, float]:
    """A stalled step under on_stall requeue whose ranks all wait alike (a split), run by the launcher's supervision
    on the head node1; `down`: the nodes that do not answer it. How it ended, its stall marker, requeue request and
    failed-node marker, and how long the stall took to end. The unreachable nodes never write their stacks."""
    monkeypatch.setattr(launcher.socket, "gethostname", lambda: "node1")
    monkeypatch.setattr(launcher.liveness, "slurmd_port", lambda env: 6818)
    real = liveness.split
    monkeypatch.setattr(launcher.liveness, "split", lambda *a: real(*a, find=finder(down)))
    answering = [n for n in nodes if n not in down]
    stacks = {i: (n, BARRIER) for i, n in enumerate(nodes) if n not in down}
    spares = ["node3"] if spare_left else []
    t0 = time.monotonic()
    end, marker, preempt, failed = stalled_step(
        tmp_path, nodes, stacks, answering, srun_body, spare_left=spare_left, spares=spares
    )
    return end, marker, preempt, failed, time.monotonic() - t0


def test_with_a_spare_left_the_unreachable_node_is_named_at_once_and_blamed_for_the_spare(tmp_path, monkeypatch, capfd):
    nodes = ["node1", "node2"]
    # a gentle stop's grace far beyond any run of this test: the step can only end because it is not waited for
    monkeypatch.setattr(stall, "STOP_GRACE_S", 3600.0)
    monkeypatch.setattr(stall, "STOP_GRACE_BARE_S", 3600.0)
    end, marker, preempt, failed, _ = split_step(tmp_path, monkeypatch, ["node2"], True, nodes, SRUN_WAITS_ON_NODE2)
    assert end.code == protocol.EXIT_STALLED and end.failure is not None
    assert (end.failure.node, end.failure.rank, end.failure.what) == ("node2", 1, launcher.UNREACHABLE_WHAT)
    assert not marker.exists() and not preempt.exists() and not failed.exists()  # the spare replaces it
    # neither node2's stacks nor its task's end, which can never come, are waited for (nor the gentle stop's grace:
    # the step ended at all)
    err = capfd.readouterr().err
    assert "every reachable node's task has ended; not waiting for node2" in err, err
    said = err.index("node node2 (node_rank 1) is unreachable from the head node node1: its slurmd (port 6818)")
    assert err.index(stall.NOTICED) < said < err.index("ending the step to replace node node2"), err
    assert "a spare takes its place" in err


def test_without_a_spare_the_unreachable_node_is_named_for_the_retry_and_the_stall_is_not_requeued(
    tmp_path, monkeypatch, capfd
):
    end, marker, preempt, failed, _ = split_step(tmp_path, monkeypatch, ["node2"], False, ["node1", "node2"])
    assert end == StepEnd(protocol.EXIT_STALLED)  # no failure for a spare to take: the launcher ends with 87
    assert failed.read_text() == "node2\n"  # the job status watch reads it; Snakemake's retry runs with --exclude=node2
    assert not preempt.exists()  # a requeue would run on node2 again
    verdict = marker.read_text()
    assert verdict.startswith("stalled: no progress for 1s on any rank")
    assert f"; node node2 is {launcher.UNREACHABLE_WHAT}; not requeued: a requeue would run on node2 again" in verdict
    err = capfd.readouterr().err
    assert "no spare left: the retry excludes it" in err and "FAILED: stalled" in err


def test_a_head_cut_off_from_every_node_is_named_itself_and_not_replaced(tmp_path, monkeypatch, capfd):
    end, marker, preempt, failed, _ = split_step(tmp_path, monkeypatch, ["node2", "node3"], True, ["node1", "node2"])
    assert end == StepEnd(protocol.EXIT_STALLED) and failed.read_text() == "node1\n"
    assert not preempt.exists() and f"the head node node1 {launcher.UNREACHABLE_HEAD}" in marker.read_text()
    assert "the head node node1 is cut off: no other node of the job answers it (node2, node3" in capfd.readouterr().err


def test_a_stall_where_every_node_answers_is_judged_by_the_stacks_as_before(tmp_path, monkeypatch):
    end, marker, preempt, failed, _ = split_step(tmp_path, monkeypatch, [], False, ["node1", "node2"])
    assert end == StepEnd(protocol.EXIT_STALLED) and preempt.read_text() == "stalled\n"  # requeued, as ever
    assert not failed.exists() and "unreachable" not in marker.read_text()
