"""Spare nodes: which nodes a launch trains on, and the launcher's relaunch on a spare (the real run is in
tests/cluster/test_spare_nodes_cluster.py); a node a stalled step's head cannot reach (a network split) is one.
The tests that start processes: tests/process/launching/test_spares.py."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.launching import launcher, liveness, spares, stall
from snakemake_executor_multinode.launching.launcher import Allocation, Failure, StepEnd
from snakemake_executor_multinode.watching import status_view
from tests.helpers import BARRIER, finder, write_stacks

ALLOC = Allocation("77", ("node1", "node2", "node3"), gpus_per_node=1, cpus_per_task=2, master_addr="10.0.0.1",
                   master_port=20308)  # fmt: skip


def test_the_training_nodes_come_from_the_job_script_else_the_whole_allocation():
    assert spares.train_nodes({protocol.TRAIN_NODES_VAR: "2"}, 3) == 2
    assert spares.train_nodes({}, 3) == 3
    assert spares.train_nodes({protocol.TRAIN_NODES_VAR: "5"}, 3) == 3  # more than it holds: all of them
    assert spares.train_nodes({protocol.TRAIN_NODES_VAR: "x"}, 3) == 3


def test_a_dropped_node_is_never_chosen_again_and_the_first_spare_takes_its_place():
    roster = spares.Roster(("node1", "node2", "node3", "node4"), 2)
    assert roster.chosen() == ("node1", "node2") and roster.spares_left() == 2
    assert roster.drop("node2") == "node3"
    assert roster.chosen() == ("node1", "node3") and roster.spares_left() == 1
    assert roster.drop("node1") == "node4"
    assert roster.chosen() == ("node3", "node4") and roster.spares_left() == 0
    assert roster.drop("node3") is None and roster.chosen() == ("node3", "node4")  # no spare: nothing changes
    assert roster.drop("node9") is None


def test_a_relaunch_gets_a_port_of_its_own_and_a_new_head_when_the_old_one_was_dropped(monkeypatch):
    monkeypatch.setattr(spares, "head_address", lambda head, peers: f"addr-of-{head}")
    assert spares.step_allocation(ALLOC, ("node1", "node2", "node3"), 0) is ALLOC
    first = spares.step_allocation(ALLOC, ("node1", "node2"), 0)
    assert first.nodes == ("node1", "node2") and (first.master_addr, first.master_port) == ("10.0.0.1", 20308)
    kept_head = spares.step_allocation(ALLOC, ("node1", "node3"), 1)
    assert (kept_head.master_addr, kept_head.master_port) == ("10.0.0.1", 20309)
    new_head = spares.step_allocation(ALLOC, ("node2", "node3"), 2)
    assert (new_head.master_addr, new_head.master_port) == ("addr-of-node2", 20310)


def test_the_step_runs_on_exactly_the_chosen_nodes():
    step = spares.step_allocation(ALLOC, ("node1", "node3"), 1)
    argv = launcher.srun_command(step, [], ["train.py"], nodelist=True)
    assert "--nodes=2" in argv and "--nodelist=node1,node3" in argv
    assert not [a for a in launcher.srun_command(ALLOC, [], ["train.py"]) if a.startswith("--nodelist")]


def fake_steps(
    monkeypatch: pytest.MonkeyPatch,
    ends: list[StepEnd],
    gone: bool = True,
    argvs: list[list[str]] | None = None,
    idle: list[tuple[str, ...]] | None = None,
) -> list[tuple[tuple[str, ...], str, str]]:
    """The launcher's steps replaced: each returns the next of `ends`; what each was started with is recorded
    (its nodes, its MULTINODE_RELAUNCH, its --master_port; its srun line in `argvs`, the spares it was told of in
    `idle`). `gone`: whether SLURM forgets a failed step in time."""
    started: list[tuple[tuple[str, ...], str, str]] = []

    def launch_step(
        argv: Sequence[str], env: dict[str, str], nodes: Sequence[str], spare_left: bool, spares: Sequence[str] = ()
    ) -> StepEnd:
        started.append((tuple(nodes), env[protocol.RELAUNCH_VAR], env["MASTER_PORT"]))
        if argvs is not None:
            argvs.append(list(argv))
        if idle is not None:
            idle.append(tuple(spares))
        return ends.pop(0)

    monkeypatch.setattr(launcher, "launch_step", launch_step)
    monkeypatch.setattr(spares, "wait_step_gone", lambda job: gone)
    monkeypatch.setattr(spares, "head_address", lambda head, peers: f"addr-of-{head}")
    return started


def test_a_failed_node_is_replaced_by_a_spare_and_the_training_relaunched(tmp_path, monkeypatch, capfd):
    stem = JobFiles.of(tmp_path, "77", 1).prefix
    marker = tmp_path / "77.failed-node"
    marker.write_text("node2\n")  # as report_failure wrote it
    env = {protocol.TRAIN_NODES_VAR: "2", protocol.LOG_STEM_VAR: str(stem), protocol.FAILED_NODE_FILE_VAR: str(marker)}
    dead = Failure("node2", 1, 1, "not answering", victim="node1")
    started = fake_steps(monkeypatch, [StepEnd(1, dead), StepEnd(0)])
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == 0
    assert started == [(("node1", "node2"), "0", "20308"), (("node1", "node3"), "1", "20309")]
    err = capfd.readouterr().err
    assert "replacing node node2 (does not answer: the node is down) with spare node3; relaunch 1" in err
    assert "nodes node1,node3, 0 spare(s) left" in err
    (line,) = [json.loads(x) for x in JobFiles(stem).replacements.read_text().splitlines()]
    assert (line["node"], line["spare"], line["relaunch"], line["job"]) == ("node2", "node3", 1, "")
    assert not marker.exists()  # replaced in the job: no node for a retry to exclude
    assert status_view.replacements(str(JobFiles(stem).log)) == "node2 -> node3 (does not answer: the node is down)"


@pytest.mark.parametrize("gone", [True, False])
def test_a_relaunch_overlaps_a_failed_step_that_slurm_still_holds(tmp_path, monkeypatch, capfd, gone):
    env = {protocol.TRAIN_NODES_VAR: "2", protocol.LOG_STEM_VAR: str(tmp_path / "77.attempt1")}
    argvs: list[list[str]] = []
    fake_steps(monkeypatch, [StepEnd(1, Failure("node2", 1, 1, "Exited with exit code 1")), StepEnd(0)], gone, argvs)
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == 0
    assert ["--overlap" in argv for argv in argvs] == [False, not gone]
    assert ["--nodelist=node1,node2" in argvs[0], "--nodelist=node1,node3" in argvs[1]] == [True, True]
    assert ("the new step overlaps it (srun --overlap)" in capfd.readouterr().err) == (not gone)


def test_without_a_spare_left_the_failure_ends_the_launcher_as_before(tmp_path, monkeypatch):
    env = {protocol.TRAIN_NODES_VAR: "2", protocol.LOG_STEM_VAR: str(tmp_path / "77.attempt1")}
    first, second = Failure("node2", 1, 3, "Exited with exit code 3"), Failure("node3", 1, 4, "Exited with exit code 4")
    started = fake_steps(monkeypatch, [StepEnd(3, first), StepEnd(4, second)])
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == 4
    assert [s[0] for s in started] == [("node1", "node2"), ("node1", "node3")]


def test_without_spares_one_step_runs_on_the_whole_allocation(tmp_path, monkeypatch):
    started = fake_steps(monkeypatch, [StepEnd(3, Failure("node2", 1, 3, "Exited with exit code 3"))])
    env = {protocol.LOG_STEM_VAR: str(tmp_path / "77.attempt1")}
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == 3
    assert started == [(ALLOC.nodes, "0", "20308")]


def test_a_failure_that_names_no_node_is_not_replaced(tmp_path, monkeypatch):
    started = fake_steps(monkeypatch, [StepEnd(protocol.EXIT_STALLED)])
    env = {protocol.TRAIN_NODES_VAR: "2", protocol.LOG_STEM_VAR: str(tmp_path / "77.attempt1")}
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == protocol.EXIT_STALLED
    assert len(started) == 1


def test_waiting_for_the_failed_step_stops_once_it_is_gone_or_at_the_limit():
    answers = iter([True, True, False])
    assert spares.wait_step_gone("77", lambda job: next(answers), limit_s=60, sleep=lambda s: None)
    assert not spares.wait_step_gone("77", lambda job: True, limit_s=0, sleep=lambda s: None)


def test_the_first_run_files_of_a_requeued_run(tmp_path: Path):
    files = JobFiles(tmp_path / "77.attempt1.restart2")
    assert files.first_run == JobFiles(tmp_path / "77.attempt1")
    assert JobFiles(tmp_path / "77.attempt1").first_run == JobFiles(tmp_path / "77.attempt1")


# --- a stall: the node holding the ranks that differ is replaced, when a spare is left ------------------------------


def test_the_odd_node_holds_every_rank_that_differs(tmp_path):
    stem = str(JobFiles.of(tmp_path, "7", 1).prefix)
    write_stacks(stem, {0: ("n1", BARRIER), 1: ("n1", BARRIER), 2: ("n2", BARRIER), 3: ("n2", "get (queue.py:180)")})
    assert stall.odd_node(stem, ["n1", "n2"]) == "n2"
    tie = str(JobFiles.of(tmp_path, "8", 1).prefix)
    write_stacks(tie, {0: ("n1", "a (x.py:1)"), 1: ("n2", "b (y.py:2)")})  # no majority: no node to blame
    assert stall.odd_node(tie, ["n1", "n2"]) is None
    alike = str(JobFiles.of(tmp_path, "9", 1).prefix)
    write_stacks(alike, {0: ("n1", BARRIER), 1: ("n2", BARRIER)})
    assert stall.odd_node(alike, ["n1", "n2"]) is None


def test_a_stalled_node_is_replaced_saying_why(tmp_path, monkeypatch, capfd):
    stem = str(tmp_path / "77.attempt1")
    env = {protocol.TRAIN_NODES_VAR: "2", protocol.LOG_STEM_VAR: stem}
    exchange = [stall.request_file(stem), stall.stop_file(stem), *(stall.done_file(stem, n) for n in ALLOC.nodes)]
    for path in exchange:  # what the stalled step left
        path.write_text("x\n")
    odd = Failure("node2", 1, protocol.EXIT_STALLED, launcher.STALLED_WHAT)
    started = fake_steps(monkeypatch, [StepEnd(protocol.EXIT_STALLED, odd), StepEnd(0)])
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == 0
    assert [s[0] for s in started] == [("node1", "node2"), ("node1", "node3")]
    assert f"replacing node node2 ({launcher.STALLED_WHAT}) with spare node3; relaunch 1" in capfd.readouterr().err
    assert not [p for p in exchange if p.exists()]  # the relaunched step starts with no stale request


# --- a network split under a stalled step (issue 38, part 5) ----------------------------------------------------------
# The head asks every node whether it answers; a node it cannot reach is named and blamed: replaced by a spare where one
# is left, else named for the retry to exclude and never requeued (the real split: test_network_split_cluster.py).


# who is blamed


def test_every_node_answering_is_no_split():
    rounds: list[list[str]] = []
    assert liveness.split("n1", ["n1", "n2"], ["n3"], 6818, finder([], rounds)) is None
    assert rounds == [["n2", "n3"]]  # every node but the head's own, spares too; no second round


def test_a_step_node_the_head_cannot_reach_twice_is_blamed():
    rounds: list[list[str]] = []
    found = liveness.split("n1", ["n1", "n2"], ["n3"], 6818, finder(["n2"], rounds))
    assert found == liveness.Split("n2", ("n2",))
    assert rounds == [["n2", "n3"], ["n2"]]  # the second round asks the missing node alone


def test_a_node_that_answers_the_second_time_is_not_blamed():
    assert liveness.split("n1", ["n1", "n2"], ["n3"], 6818, finder([], flaky=["n2"])) is None


def test_in_a_two_node_job_without_spares_the_other_node_is_blamed():
    """One other node: which side is cut off cannot be told from the head; the other node is named."""
    assert liveness.split("n1", ["n1", "n2"], [], 6818, finder(["n2"])) == liveness.Split("n2", ("n2",))


def test_the_head_that_reaches_no_other_node_is_the_one_cut_off():
    found = liveness.split("n1", ["n1", "n2"], ["n3"], 6818, finder(["n2", "n3"]))
    assert found == liveness.Split("n1", ("n2", "n3"), head=True)
    found = liveness.split("n1", ["n1", "n2", "n3"], [], 6818, finder(["n2", "n3"]))
    assert found is not None and found.head and found.node == "n1"


def test_an_unreachable_spare_alone_explains_no_stall_and_the_first_step_node_is_blamed():
    assert liveness.split("n1", ["n1", "n2"], ["n3", "n4"], 6818, finder(["n3"])) is None
    found = liveness.split("n1", ["n1", "n2", "n3"], ["n4"], 6818, finder(["n4", "n3"]))
    assert found == liveness.Split("n3", ("n3", "n4"))  # the step's node, not the spare


def test_srun_s_reports_of_ended_tasks_are_kept_after_the_step_was_stopped():
    watch = launcher.StepWatch(["node1", "node2", "node3"])
    watch.stopped = True  # the launcher's own stop: the ends that follow blame no node
    assert (
        watch.feed(b"srun: error: node1: task 0: Exited with exit code 1\nsrun: error: node3: task 2: Killed\n") is None
    )
    assert watch.failure is None and watch.ended == {"node1", "node3"}


def test_an_unreachable_node_is_replaced_saying_why_and_the_spares_are_asked_too(tmp_path, monkeypatch, capfd):
    stem = JobFiles.of(tmp_path, "77", 1).prefix
    env = {protocol.TRAIN_NODES_VAR: "2", protocol.LOG_STEM_VAR: str(stem)}
    cut = Failure("node2", 1, protocol.EXIT_STALLED, launcher.UNREACHABLE_WHAT)
    idle: list[tuple[str, ...]] = []
    started = fake_steps(monkeypatch, [StepEnd(protocol.EXIT_STALLED, cut), StepEnd(0)], idle=idle)
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == 0
    assert [s[0] for s in started] == [("node1", "node2"), ("node1", "node3")]
    assert idle == [("node3",), ()]  # each step's stall check also asks the job's unused spares
    why = launcher.UNREACHABLE_WHAT
    assert f"replacing node node2 ({why}) with spare node3; relaunch 1" in capfd.readouterr().err
    (line,) = [json.loads(x) for x in JobFiles(stem).replacements.read_text().splitlines()]
    assert (line["node"], line["spare"], line["why"]) == ("node2", "node3", why)
