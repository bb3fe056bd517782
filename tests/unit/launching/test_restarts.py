"""Hangs noticed by the training's own pace, and a crashed or stalled training restarted in the same job (issue 48,
parts 1 and 2): the adaptive stall timeout from a sequence of step times, the restart decision with its budget and
crash-loop rule, and the launcher's relaunch loop that follows it (the real runs: tests/cluster/
test_restart_cluster.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.launching import launcher, node_check, restarts, stall
from snakemake_executor_multinode.launching.launcher import Allocation, Failure, StepEnd
from tests.helpers import Clock, fake_steps

T0 = 1_765_000_000.0  # a wall-clock time: the training's lines say when they were written


def step_lines(walls: list[float], first_step: int = 1) -> list[str]:
    return [json.dumps({"step": first_step + i, "loss": 1.0, "wall": w}) for i, w in enumerate(walls)]


def pace_of(lines: list[str], since: float = T0) -> stall.Pace:
    pace = stall.Pace(since_wall=since)
    for line in lines:
        pace.feed(line, now=T0 + 10_000)
    return pace


# --- part 1: the adaptive timeout --------------------------------------------------------------------------------


def test_sub_second_steps_get_the_floor_a_hang_is_noticed_within_a_minute():
    pace = pace_of(step_lines([T0 + 0.2 * i for i in range(50)]))
    assert stall.adaptive_timeout(pace) == stall.PACE_FLOOR_S == 30.0
    assert pace.reached == 50


def test_slower_steps_get_ten_times_their_longest_recent_interval():
    pace = pace_of(step_lines([T0, T0 + 8, T0 + 20, T0 + 29]))  # intervals 8, 12, 9
    assert stall.adaptive_timeout(pace) == pytest.approx(120.0)


def test_only_the_last_twenty_intervals_count():
    walls = [T0, T0 + 60] + [T0 + 60 + 0.5 * i for i in range(1, 21)]  # one slow first step (compilation), then fast
    assert stall.adaptive_timeout(pace_of(step_lines(walls[:21]))) == pytest.approx(600.0)  # 60 s is among the last 20
    assert stall.adaptive_timeout(pace_of(step_lines(walls))) == stall.PACE_FLOOR_S  # 21 later intervals: it left


def test_before_the_second_step_line_the_long_budget_applies():
    assert stall.adaptive_timeout(pace_of([])) == stall.LONG_S == 1800.0  # startup: imports, the checkpoint's load
    assert stall.adaptive_timeout(pace_of(step_lines([T0]))) == stall.LONG_S  # one line: no interval yet
    resume = json.dumps({"event": "resume", "step": 40, "wall": T0, "restore_s": 3.0})
    assert stall.adaptive_timeout(pace_of([resume, *step_lines([T0 + 1], 41)])) == stall.LONG_S
    assert pace_of([resume]).reached is None  # a resume is no step of this launch


def test_a_checkpoint_save_gets_the_long_budget_and_its_time_is_no_step_interval():
    lines = step_lines([T0, T0 + 0.5, T0 + 1.0])
    begin = json.dumps({"event": "checkpoint_begin", "step": 3, "wall": T0 + 1.0})
    end = json.dumps({"event": "checkpoint_end", "step": 3, "wall": T0 + 121.0})
    assert stall.adaptive_timeout(pace_of([*lines, begin])) == stall.LONG_S  # saving
    after = pace_of([*lines, begin, end, *step_lines([T0 + 121.5], 4)])
    assert stall.adaptive_timeout(after) == stall.PACE_FLOOR_S  # the 120 s save did not become a step interval
    assert list(after.intervals) == [0.5, 0.5, 0.5]


def test_an_earlier_launchs_lines_read_again_from_a_rewritten_file_do_not_count():
    old = step_lines([T0 - 100 + 30 * i for i in range(3)])  # 30 s apart, written before this launch
    new = step_lines([T0 + 1, T0 + 1.2, T0 + 1.4], 10)
    pace = pace_of([*old, *new])
    assert stall.adaptive_timeout(pace) == stall.PACE_FLOOR_S and pace.reached == 12


def test_lines_without_a_time_are_timed_when_read_and_odd_lines_are_skipped():
    pace = stall.Pace(since_wall=T0)
    for line, now in (('{"step": 1}', T0 + 1), ("not json", T0 + 2), ("[1, 2]", T0 + 3), ('{"step": 2}', T0 + 7)):
        pace.feed(line, now)
    assert list(pace.intervals) == [6.0] and pace.reached == 2


def test_the_watchdog_follows_the_pace_a_hang_of_sub_second_steps_is_a_stall_after_the_floor(tmp_path):
    metrics = tmp_path / "m.jsonl"
    clock, pace = Clock(), stall.Pace(since_wall=T0)
    dog = stall.Watchdog(lambda: stall.adaptive_timeout(pace), [metrics], clock)
    for i, line in enumerate(step_lines([T0 + 0.2 * i for i in range(20)])):
        clock.now = 0.2 * i
        with open(metrics, "a") as fh:
            fh.write(line + "\n")
        pace.feed(line, T0)
        assert not dog.stalled()
    hung = clock.now  # the last step line; then nothing
    clock.now = hung + 29.0
    assert not dog.stalled()
    clock.now = hung + 30.5
    assert dog.stalled() and dog.limit == 30.0


def test_the_launchers_watchdog_is_adaptive_when_the_job_script_says_auto_and_fixed_when_it_says_seconds(tmp_path):
    stem = str(JobFiles.of(tmp_path, "7", 1).prefix)
    metrics = tmp_path / "m.jsonl"
    env = {protocol.LOG_STEM_VAR: stem, protocol.METRICS_FILE_VAR: str(metrics)}
    auto = launcher.StallCheck(env | {protocol.STALL_TIMEOUT_VAR: protocol.STALL_AUTO}, ["node1", "node2"])
    assert auto.watchdog.timeout() == stall.LONG_S  # nothing written yet: startup
    now = time.time()
    metrics.write_text("".join(f"{line}\n" for line in step_lines([now + 0.1 * i for i in range(5)])))
    assert auto.read_pace() == 5 and auto.watchdog.timeout() == stall.PACE_FLOOR_S
    fixed = launcher.StallCheck(env | {protocol.STALL_TIMEOUT_VAR: "600"}, ["node1", "node2"])
    assert fixed.watchdog.timeout() == stall.LONG_S  # this launch's training has not begun: its start is spared
    with metrics.open("a") as fh:
        fh.write(step_lines([now + 1], 6)[0] + "\n")
    fixed.read_pace()
    assert fixed.watchdog.timeout() == 600  # a user's stall_timeout wins over the pace
    assert launcher.StallCheck(env | {protocol.STALL_TIMEOUT_VAR: "0"}, ["node1"]).watchdog.timeout() == 0
    assert launcher.StallCheck(env, ["node1"]).watchdog.timeout() == 0  # unset (a hand-written script): off


# --- part 2: the restart decision --------------------------------------------------------------------------------


def test_a_crash_loop_is_failed_launches_in_a_row_none_beyond_the_first_ones_step():
    assert restarts.crash_loop([40, 40, 40], 3)
    assert restarts.crash_loop([100, 40, 39], 3)  # the later ones got less far
    assert not restarts.crash_loop([40, 40, 41], 3)  # the third got further: progress
    assert not restarts.crash_loop([40, 40], 3)  # two failures are no loop yet
    assert restarts.crash_loop([None, None, None], 3)  # no step line at all: no progress either
    assert restarts.crash_loop([12, None, None], 3)  # a launch that died before its first step made none
    assert not restarts.crash_loop([None, 5, 5], 3)
    assert restarts.crash_loop([7, 40, 40, 40], 3)  # the last three
    assert not restarts.crash_loop([40, 40, 40], 0)  # 0: no bound


def test_the_restart_decision_budget_then_crash_loop():
    budget = restarts.Budget(max_restarts=3, crash_loop_runs=3)
    assert restarts.why_not(budget, 0, [40]) is None
    assert restarts.why_not(budget, 1, [40, 80]) is None
    assert restarts.why_not(budget, 2, [40, 40, 40]) == (
        "a crash loop: 3 launches in a row failed without progress (none beyond step 40)"
    )
    assert restarts.why_not(budget, 2, [None, None, None]) == (
        "a crash loop: 3 launches in a row failed without progress (before any step line)"
    )
    assert restarts.why_not(budget, 3, [40, 80, 120, 160]) == "its restarts are used up (3 of max_restarts 3)"
    assert restarts.why_not(restarts.Budget(0, 3), 0, [40]) == "max_restarts is 0"
    assert restarts.why_not(restarts.Budget(5, 0), 4, [40] * 5) is None  # no crash-loop bound: the budget alone


def test_the_budget_comes_from_the_job_script_and_a_hand_written_script_has_none():
    env = {protocol.MAX_RESTARTS_VAR: "3", protocol.CRASH_LOOP_RUNS_VAR: "4"}
    assert restarts.Budget.from_env(env) == restarts.Budget(3, 4)
    assert restarts.Budget.from_env({}) == restarts.Budget(0, 0)
    assert restarts.Budget.from_env({protocol.MAX_RESTARTS_VAR: "x"}) == restarts.Budget(0, 0)


# --- part 2: the launcher's relaunch loop ----------------------------------------------------------------------

ALLOC = Allocation("77", ("node1", "node2"), gpus_per_node=1, cpus_per_task=2, master_addr="10.0.0.1",
                   master_port=20308)  # fmt: skip
CRASH = Failure("node2", 1, 1, "Exited with exit code 1")


def restart_env(tmp_path: Path, max_restarts: int = 3, crash_loop_runs: int = 3) -> dict[str, str]:
    marker = tmp_path / "77.failed-node"
    return {
        protocol.LOG_STEM_VAR: str(JobFiles.of(tmp_path, "77", 1).prefix),
        protocol.FAILED_NODE_FILE_VAR: str(marker),
        protocol.STALL_FILE_VAR: str(tmp_path / "77.stalled"),
        protocol.PREEMPT_FILE_VAR: str(tmp_path / "77.preempted"),
        protocol.MAX_RESTARTS_VAR: str(max_restarts),
        protocol.CRASH_LOOP_RUNS_VAR: str(crash_loop_runs),
    }


def test_a_crashed_rank_on_a_live_node_is_restarted_on_the_same_nodes_in_the_same_job(tmp_path, monkeypatch, capfd):
    env = restart_env(tmp_path)
    Path(env[protocol.FAILED_NODE_FILE_VAR]).write_text("node2\n")  # as report_failure wrote it
    started = fake_steps(monkeypatch, [StepEnd(1, CRASH, reached=40), StepEnd(0, reached=100)])
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == 0
    # the same nodes, MULTINODE_RELAUNCH 1, a port of its own (the failed step's store may linger)
    assert started == [(("node1", "node2"), "0", "20308"), (("node1", "node2"), "1", "20309")]
    err = capfd.readouterr().err
    assert "restarting the training on the same nodes (node node2 exited with 1); relaunch 1, restart 1 of" in err
    assert not Path(env[protocol.FAILED_NODE_FILE_VAR]).exists()  # a later failure names its own node, if any


def test_a_dead_node_without_a_spare_is_no_restart_the_job_fails_naming_it_as_before(tmp_path, monkeypatch):
    env = restart_env(tmp_path)
    dead = Failure("node2", 1, 1, "not answering", victim="node1")
    started = fake_steps(monkeypatch, [StepEnd(1, dead)])
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == 1
    assert len(started) == 1


def test_with_a_spare_left_a_failed_node_still_goes_to_the_spare(tmp_path, monkeypatch, capfd):
    env = restart_env(tmp_path) | {protocol.TRAIN_NODES_VAR: "2"}
    alloc = Allocation("77", ("node1", "node2", "node3"), 1, 2, "10.0.0.1", 20308)
    started = fake_steps(monkeypatch, [StepEnd(1, CRASH, reached=40), StepEnd(0)])
    assert launcher.launch_with_spares(alloc, [], ["train.py"], env, None) == 0
    assert [s[0] for s in started] == [("node1", "node2"), ("node1", "node3")]
    assert "replacing node node2 (exited with 1) with spare node3; relaunch 1" in capfd.readouterr().err


def test_a_crash_loop_stops_the_restarts_with_the_failing_steps_code(tmp_path, monkeypatch, capfd):
    env = restart_env(tmp_path)
    started = fake_steps(monkeypatch, [StepEnd(1, CRASH, reached=40)] * 3 + [StepEnd(0)])
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == 1
    assert [s[1] for s in started] == ["0", "1", "2"]  # two restarts; the third failure at step 40 ends it
    err = capfd.readouterr().err
    said = "not restarted in the job: a crash loop: 3 launches in a row failed without progress (none beyond step 40)"
    assert said in err
    assert "restart 2 of max_restarts 3" in err and "restart 3 of" not in err


def test_a_training_that_progresses_between_failures_is_stopped_by_its_budget(tmp_path, monkeypatch, capfd):
    env = restart_env(tmp_path, max_restarts=2)
    ends = [StepEnd(1, CRASH, reached=step) for step in (40, 80, 120)] + [StepEnd(0)]
    started = fake_steps(monkeypatch, ends)
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == 1
    assert len(started) == 3
    assert "not restarted in the job: its restarts are used up (2 of max_restarts 2)" in capfd.readouterr().err


def test_max_restarts_0_ends_the_job_at_the_first_crash_as_before(tmp_path, monkeypatch):
    env = restart_env(tmp_path, max_restarts=0)
    started = fake_steps(monkeypatch, [StepEnd(3, Failure("node2", 1, 3, "Exited with exit code 3"))])
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == 3
    assert len(started) == 1


@pytest.mark.parametrize(
    "end",
    [
        StepEnd(143),  # stopped from outside (scancel, the time limit): no failed task
        StepEnd(1),  # srun could not run the step: no node is blamed
    ],
)
def test_an_end_without_a_failed_rank_or_stall_is_no_restart(tmp_path, monkeypatch, end):
    started = fake_steps(monkeypatch, [end, StepEnd(0)])
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], restart_env(tmp_path), None) == end.code
    assert len(started) == 1


def test_a_stall_after_the_budget_is_spent_says_so_in_its_verdict(tmp_path, monkeypatch):
    env = restart_env(tmp_path, max_restarts=1)
    said = "stalled: no progress for 30s on any rank; stacks in x.log"
    ends = [StepEnd(1, CRASH, reached=40), StepEnd(87, stalled=said, reached=90)]
    started = fake_steps(monkeypatch, ends)
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == protocol.EXIT_STALLED
    assert len(started) == 2
    assert Path(env[protocol.STALL_FILE_VAR]).read_text() == (
        f"{said}; not restarted: its restarts are used up (1 of max_restarts 1)\n"
    )
    assert not Path(env[protocol.PREEMPT_FILE_VAR]).exists()  # on_stall fail


def test_a_stall_of_a_training_that_checkpointed_for_the_time_limit_is_recorded_without_a_restart(
    tmp_path, monkeypatch
):
    env = restart_env(tmp_path)
    Path(env[protocol.PREEMPT_FILE_VAR]).write_text("40\n")
    said = "stalled: no progress for 30s on any rank; stacks in x.log"
    started = fake_steps(monkeypatch, [StepEnd(87, stalled=said, reached=40), StepEnd(0)])
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == protocol.EXIT_STALLED
    assert len(started) == 1 and Path(env[protocol.STALL_FILE_VAR]).read_text() == f"{said}\n"


def test_a_training_that_checkpointed_for_the_time_limit_is_left_to_the_job_scripts_requeue(tmp_path, monkeypatch):
    env = restart_env(tmp_path)
    Path(env[protocol.PREEMPT_FILE_VAR]).write_text("40\n")
    started = fake_steps(monkeypatch, [StepEnd(1, CRASH, reached=40), StepEnd(0)])
    # the step ended with the checkpoint (a task that failed after it is no crash): 0, the job script requeues
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == 0
    assert len(started) == 1


def test_a_stall_is_restarted_without_a_verdict_and_one_past_the_budget_is_recorded_saying_why(tmp_path, monkeypatch):
    env = restart_env(tmp_path, max_restarts=1) | {protocol.ON_STALL_VAR: "requeue"}
    said = "stalled: no progress for 30s on any rank; stacks in x.log"
    started = fake_steps(monkeypatch, [StepEnd(87, stalled=said, reached=40), StepEnd(87, stalled=said, reached=90)])
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == protocol.EXIT_STALLED
    assert [s[0] for s in started] == [("node1", "node2")] * 2
    verdict = Path(env[protocol.STALL_FILE_VAR]).read_text()
    assert verdict == f"{said}; not restarted: its restarts are used up (1 of max_restarts 1)\n"
    assert Path(env[protocol.PREEMPT_FILE_VAR]).read_text() == "stalled\n"  # on_stall requeue, once none is left


def test_a_node_that_fails_its_check_before_the_restart_is_not_kept(tmp_path, monkeypatch, capfd):
    env = restart_env(tmp_path) | {protocol.NODE_CHECK_COMMAND_VAR: "site-check"}
    answers, checked = [{}, {"node2": "its command exited with 1"}], []

    def run_check(argv: object, env: object, nodes: list[str], limit: float, out: object) -> tuple:
        checked.append(list(nodes))
        return answers.pop(0), 0

    monkeypatch.setattr(node_check, "run_step", run_check)
    started = fake_steps(monkeypatch, [StepEnd(1, CRASH)])
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == 1
    assert checked == [["node1", "node2"], ["node1", "node2"]]  # the failed node checked again before the restart
    assert [s[0] for s in started] == [("node1", "node2")]
    assert Path(env[protocol.FAILED_NODE_FILE_VAR]).read_text() == "node2\n"  # the retry excludes it
    assert "restarting the training on the same nodes" in capfd.readouterr().err


def test_a_node_that_failed_the_network_preflight_is_no_restart_its_node_is_at_fault(tmp_path, monkeypatch):
    code = protocol.EXIT_PREFLIGHT
    started = fake_steps(monkeypatch, [StepEnd(code, Failure("node2", 1, code, f"Exited with exit code {code}"))])
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], restart_env(tmp_path), None) == code
    assert len(started) == 1
