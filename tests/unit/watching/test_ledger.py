"""The goodput ledger (watching/ledger.py), read as its specification: where each allocated second of a job went.
Times are epoch seconds from 0; `line(step, wall)` is a metrics step line, `event(kind, step, wall)` an event."""

from __future__ import annotations

import random
from typing import Any

import pytest

from snakemake_executor_multinode.watching.ledger import CATEGORIES, SKEW_S, TRUNCATION_S, RunSpan, ledger


def line(step: int, wall: float, **extra: Any) -> dict[str, Any]:
    return {"step": step, "wall": wall, **extra}


def event(kind: str, step: int, wall: float, **extra: Any) -> dict[str, Any]:
    return {"event": kind, "step": step, "wall": wall, **extra}


def seconds(result, *, run: int | None = None) -> dict[str, float]:
    got = result.seconds if run is None else result.runs[run].seconds
    return {k: round(v, 6) for k, v in got.items() if v}


def test_startup_is_the_runs_start_to_its_first_metrics_record():
    result = ledger([RunSpan(0, 400, nodes=1)], [], [line(10, 100), line(20, 200), line(30, 300)])
    assert seconds(result)["startup"] == 100


def test_a_first_line_that_says_its_time_per_step_gives_its_own_steps_back_to_the_training():
    result = ledger([RunSpan(0, 300, nodes=1)], [], [line(10, 100, step_ms=2000), line(20, 300)])
    assert seconds(result) == {"startup": 80, "productive": 220}


def test_steps_between_lines_of_the_last_run_are_productive_and_the_rest_after_the_last_line_is_teardown():
    result = ledger([RunSpan(0, 310, nodes=1)], [], [line(10, 100), line(20, 200), line(30, 300)])
    assert seconds(result) == {"startup": 100, "productive": 200, "teardown": 10}
    assert result.goodput == pytest.approx(200 / 310)


def test_a_checkpoint_is_its_begin_to_its_end():
    records = [line(10, 100), event("checkpoint_begin", 20, 200), event("checkpoint_end", 20, 230), line(30, 330)]
    result = ledger([RunSpan(0, 330, nodes=1)], [], records)
    assert seconds(result) == {"startup": 100, "productive": 200, "checkpoint": 30}


def test_a_checkpoint_is_its_begin_to_its_end_whatever_is_said_inside_it():
    # an asynchronous save: the one before is said written inside it (checkpoint_written), and the last save waits for
    # its own write: both inside the save's begin and end, all of it checkpoint; a run that ends inside one too
    records = [line(10, 100), event("checkpoint_begin", 20, 200), event("checkpoint_written", 10, 205),
               event("checkpoint_written", 20, 225), event("checkpoint_end", 20, 230), line(30, 330),
               event("checkpoint_begin", 30, 330), event("checkpoint_written", 20, 335)]  # fmt: skip
    result = ledger([RunSpan(0, 350, nodes=1)], [], records)
    assert seconds(result) == {"startup": 100, "productive": 200, "checkpoint": 50}


def test_restore_is_the_seconds_the_resume_says_loading_took_and_the_time_before_it_startup():
    records = [event("resume", 40, 60, restore_s=20), line(50, 160)]
    result = ledger([RunSpan(0, 160, nodes=1)], [], records)
    assert seconds(result) == {"startup": 40, "restore": 20, "productive": 100}


def test_a_spares_relaunch_inside_a_run_is_relaunch_time_and_the_steps_it_computed_again_are_lost():
    # step 40 saved at 210; a node dies at 240 after step 45; the relaunched step resumes from 40 at 300, having
    # loaded for 15 s; steps 41-45 are computed again
    records = [
        line(40, 200), event("checkpoint_begin", 40, 200), event("checkpoint_end", 40, 210), line(45, 240),
        event("resume", 40, 300, restore_s=15), line(50, 400),
    ]  # fmt: skip
    result = ledger([RunSpan(0, 400, nodes=2)], [], records)
    assert seconds(result) == {"startup": 200, "checkpoint": 10, "lost": 30, "restore": 15, "relaunch": 45,
                               "productive": 100}  # fmt: skip
    assert result.goodput == pytest.approx(100 / 400)


def test_a_relaunch_that_lost_nothing_leaves_the_steps_before_it_productive():
    records = [line(40, 200), event("resume", 40, 260, restore_s=10), line(50, 360)]
    result = ledger([RunSpan(0, 360, nodes=1)], [], records)
    assert seconds(result) == {"startup": 200, "restore": 10, "relaunch": 50, "productive": 100}


def test_a_relaunch_inside_a_run_does_not_move_where_the_run_started_its_first_lines_steps_stay_productive():
    """Found by the matrix of features and faults: a spare's relaunch resumed at step 40 was taken for the run's
    own start, so the first line's 10 steps (2 s each, by its step_ms) fell into startup."""
    records = [
        line(10, 100, step_ms=2000), line(40, 200), event("checkpoint_begin", 40, 200),
        event("checkpoint_end", 40, 210), line(45, 240), event("resume", 40, 300, restore_s=15), line(50, 400),
    ]  # fmt: skip
    result = ledger([RunSpan(0, 400, nodes=2)], [], records)
    assert seconds(result) == {"startup": 80, "productive": 220, "checkpoint": 10, "lost": 30, "restore": 15,
                               "relaunch": 45}  # fmt: skip


def test_a_later_run_that_started_from_scratch_and_relaunched_makes_the_earlier_runs_steps_lost_not_kept():
    """The second run had no checkpoint to resume (it starts at step 1 again); its spare's relaunch later resumed
    from its own checkpoint of step 20. Every step of the first run was computed again."""
    first = [line(10, 100), line(20, 200)]
    second = [
        line(10, 1100), line(20, 1200), event("checkpoint_begin", 20, 1200), event("checkpoint_end", 20, 1210),
        line(25, 1240), event("resume", 20, 1300, restore_s=10), line(30, 1400),
    ]  # fmt: skip
    result = ledger([RunSpan(0, 200, nodes=1), RunSpan(1000, 1400, nodes=1)], [], first + second)
    assert seconds(result, run=0) == {"startup": 100, "lost": 100}


def test_a_job_killed_30_s_after_its_checkpoint_at_step_40_and_resumed_from_step_40_loses_the_steps_after_40():
    first = [line(40, 200), event("checkpoint_begin", 40, 200), event("checkpoint_end", 40, 210), line(45, 240)]
    second = [event("resume", 40, 1050, restore_s=10), line(50, 1150)]
    result = ledger([RunSpan(0, 240, nodes=1), RunSpan(1000, 1150, nodes=1)], [], first + second)
    assert seconds(result, run=0) == {"startup": 200, "checkpoint": 10, "lost": 30}
    assert seconds(result, run=1) == {"startup": 40, "restore": 10, "productive": 100}


def test_a_step_interval_that_straddles_the_resume_step_is_lost_in_proportion():
    first = [line(10, 100), line(20, 200)]  # the rerun resumes from 15: steps 16..20 of the second interval again
    second = [event("resume", 15, 1100), line(20, 1200)]
    result = ledger([RunSpan(0, 200, nodes=1), RunSpan(1000, 1200, nodes=1)], [], first + second)
    assert seconds(result, run=0) == {"startup": 100, "productive": 50, "lost": 50}


def test_without_resume_events_a_rerun_resumed_below_its_first_line_and_above_the_earlier_lines_under_it():
    first = [line(10, 100), line(20, 200), line(30, 300)]
    second = [line(30, 1100), line(40, 1200)]  # resumed from 20 (its first line covers 21..30)
    result = ledger([RunSpan(0, 300, nodes=1), RunSpan(1000, 1200, nodes=1)], [], first + second)
    assert seconds(result, run=0) == {"startup": 100, "productive": 100, "lost": 100}


def test_superseded_lines_a_resume_kept_are_the_lost_work():
    first = [line(10, 100), event("checkpoint_begin", 10, 100), event("checkpoint_end", 10, 110)]
    first.append({**line(20, 210), "event": "superseded"})
    second = [event("resume", 10, 1100), line(20, 1200)]
    result = ledger([RunSpan(0, 220, nodes=1), RunSpan(1000, 1200, nodes=1)], [], first + second)
    assert seconds(result, run=0) == {"startup": 100, "checkpoint": 10, "lost": 100, "teardown": 10}


def test_steps_that_another_job_computed_again_after_resuming_below_them_are_lost():
    # a rank killed while saving step 10 (checkpoint_begin, no end): the job fails; Snakemake's retry is another SLURM
    # job on the same metrics file, and resumes from step 5 at 1100: this job's steps 6-10 were computed again
    job = [line(5, 100), event("checkpoint_begin", 5, 100), event("checkpoint_end", 5, 110), line(10, 160),
           event("checkpoint_begin", 10, 160)]  # fmt: skip
    # the file after the retry's resume: its step lines above 5 marked superseded, then the retry's records
    resumed = [{**r, "event": "superseded"} if "event" not in r and r["step"] > 5 else r for r in job]
    retry = [event("resume", 5, 1100, restore_s=5), line(10, 1200)]
    result = ledger([RunSpan(0, 170, nodes=2)], [], resumed + retry)
    assert seconds(result) == {"startup": 100, "checkpoint": 20, "lost": 50}  # the save of 10: its begin to the end
    alone = ledger([RunSpan(0, 170, nodes=2)], [], job)  # before the retry resumed: nothing said they were lost
    assert seconds(alone) == {"startup": 100, "checkpoint": 20, "productive": 50}


def test_a_resume_before_the_job_started_says_nothing_about_its_steps():
    earlier = [line(8, 40), event("resume", 3, 50)]  # an earlier job's, on the same metrics file
    result = ledger([RunSpan(100, 300, nodes=1)], [], earlier + [line(10, 200), line(20, 300)])
    assert seconds(result) == {"startup": 100, "productive": 100}


def test_after_the_last_progress_a_run_the_watchdog_ended_stalled_and_any_other_tore_down():
    records = [line(10, 100), line(20, 200)]
    stalled = ledger([RunSpan(0, 500, nodes=1, stalled=True)], [], records)
    ended = ledger([RunSpan(0, 500, nodes=1)], [], records)
    assert seconds(stalled) == {"startup": 100, "productive": 100, "stalled": 300}
    assert seconds(ended) == {"startup": 100, "productive": 100, "teardown": 300}


def test_a_job_without_metrics_has_startup_to_its_first_output_line_and_the_rest_unknown():
    result = ledger([RunSpan(0, 1000, nodes=2, first_output=40)], [], [])
    assert seconds(result) == {"startup": 40, "unknown": 960}
    assert not result.known and result.goodput is None and result.productive_node_s is None


def test_a_job_without_metrics_or_a_first_output_time_is_all_unknown_never_startup_by_guess():
    result = ledger([RunSpan(0, 1000, nodes=1)], [], [{"step": 3}])  # a line without a time says nothing
    assert seconds(result) == {"unknown": 1000}
    assert result.goodput is None


def test_a_run_that_never_logged_in_a_job_that_does_is_all_startup():
    result = ledger([RunSpan(0, 50, nodes=1), RunSpan(100, 300, nodes=1)], [], [line(10, 200), line(20, 300)])
    assert seconds(result, run=0) == {"startup": 50}
    assert result.known


def test_node_seconds_and_gpu_hours_weigh_each_run_by_its_nodes_and_gpus_and_goodput_is_their_share():
    records = [line(10, 1800), line(20, 3600)]
    result = ledger([RunSpan(0, 3600, nodes=2, gpus_per_node=4)], [], records)
    assert result.node_seconds["productive"] == 3600 and result.node_seconds["startup"] == 3600
    assert result.gpu_hours["productive"] == 4 and result.allocated_gpu_h == 8
    assert result.goodput == 0.5 and result.share("startup") == 0.5


def start(restart: int, train_nodes: int) -> dict[str, Any]:
    """A runs file's start line that says how many of the allocation's nodes the training runs on."""
    return {"event": "start", "restart": restart, "train_nodes": train_nodes}


def test_a_spares_idle_node_seconds_are_their_own_category_and_productive_counts_the_training_nodes_only():
    """A 2-node training with spare_nodes=1, requeued once: 3 nodes allocated in each run, 2 train. Productive is the
    training's own clock times its 2 nodes; the third node's whole time is spare; the parts add up to sacct's."""
    spans = [RunSpan(0, 100, nodes=3), RunSpan(200, 300, nodes=3)]
    records = [line(10, 40), line(20, 80), event("resume", 20, 220, restore_s=5), line(30, 260), line(40, 300)]
    result = ledger(spans, [start(0, 2), start(1, 2)], records)
    own_clock = (80 - 40) + (300 - 220)  # the intervals between the training's own lines
    assert result.node_seconds["productive"] == pytest.approx(2 * own_clock)
    assert result.node_seconds["spare"] == pytest.approx(1 * 200)
    assert result.allocated_node_s == pytest.approx(3 * 200)  # sacct's allocation: 3 nodes x 2 runs of 100 s
    assert result.seconds["spare"] == 0  # not a part of the run's wall time: a part of its nodes
    assert result.goodput == pytest.approx(2 * own_clock / 600)


def test_a_run_without_a_train_nodes_line_counts_every_allocated_node_as_training():
    result = ledger([RunSpan(0, 100, nodes=3)], [], [line(10, 50), line(20, 100)])
    assert result.node_seconds["spare"] == 0 and result.node_seconds["productive"] == 3 * 50


def test_the_queue_wait_is_beside_the_ledger_not_in_it():
    spans = [RunSpan(100, 200, nodes=1, submit=40), RunSpan(300, 400, nodes=1, submit=250)]
    result = ledger(spans, [], [])
    assert result.queue_wait_s == 110 and result.allocated_s == 200


def test_a_record_just_outside_its_run_is_clamped_into_it_and_one_far_outside_belongs_to_another_job():
    # step 5: an earlier job's, long before; step 20: past sacct's cut-off second, within the clocks' skew
    records = [line(5, 50), line(10, 99), line(20, 200 + TRUNCATION_S + (SKEW_S - TRUNCATION_S) / 2)]
    result = ledger([RunSpan(100, 200, nodes=1)], [], records)
    assert seconds(result) == {"productive": 100}


def test_the_runs_file_gives_each_runs_exit():
    lines = [
        {"event": "end", "job": "7", "restart": 0, "exit": 0},
        {"event": "end", "job": "7", "restart": 1, "exit": 1},
    ]
    result = ledger([RunSpan(0, 10, nodes=1), RunSpan(20, 30, nodes=1)], lines, [])
    assert [(r.restart, r.exit) for r in result.runs] == [(0, 0), (1, 1)]


def random_schedule(rng: random.Random) -> tuple[list[RunSpan], list[dict[str, Any]]]:
    """Runs with requeues, stalls, missing metrics and records a little outside their run (clock skew)."""
    spans, records, t, step = [], [], rng.uniform(0, 1e5), 0
    for _ in range(rng.randint(1, 5)):
        start = t + rng.uniform(0, 500)
        end = start + rng.uniform(0, 5000)
        spans.append(RunSpan(start, end, rng.randint(1, 8), rng.choice([0, 4, 8]), start - rng.uniform(0, 100),
                             rng.random() < 0.3, rng.choice([None, start + rng.uniform(-10, 100)])))  # fmt: skip
        if rng.random() < 0.8:
            step = rng.randint(0, step) if rng.random() < 0.5 else step
            wall = start + rng.uniform(-SKEW_S, 300)
            if step and rng.random() < 0.7:
                records.append(event("resume", step, wall, restore_s=rng.uniform(0, 400)))
            while wall < end + SKEW_S and rng.random() < 0.97:
                wall += rng.uniform(0, 120)
                step += rng.randint(0, 20)
                kind = rng.random()
                if kind < 0.15:
                    records.append(event("checkpoint_begin", step, wall))
                    wall += rng.uniform(0, 60)
                    if rng.random() < 0.9:
                        records.append(event("checkpoint_end", step, wall))
                elif kind < 0.2:
                    records.append({**line(step, wall), "event": rng.choice(["superseded", "something_new"])})
                else:
                    records.append(
                        line(step, wall, **({"step_ms": rng.uniform(0, 9000)} if rng.random() < 0.3 else {}))
                    )
        t = end
    rng.shuffle(spans)  # sacct's order is not the runs' order
    return spans, records


def test_the_parts_add_up_to_the_allocated_time_exactly_for_random_schedules():
    rng = random.Random(20261205)
    for _ in range(2000):
        spans, records = random_schedule(rng)
        result = ledger(spans, [], records)
        allocated = sum(s.end - s.start for s in spans)
        node_s = sum((s.end - s.start) * s.nodes for s in spans)
        gpu_h = sum((s.end - s.start) * s.nodes * s.gpus_per_node for s in spans) / 3600
        assert set(result.seconds) == set(CATEGORIES)
        assert all(v >= -1e-9 for r in result.runs for v in r.seconds.values()), (spans, records)
        for run in result.runs:
            assert sum(run.seconds.values()) == pytest.approx(run.span.end - run.span.start, abs=1e-6)
        # sacct's total, plus at most the second it cut off each run's end (a record written in it)
        late = sum(r.span.end - s.end for r, s in zip(result.runs, sorted(spans, key=lambda x: x.start), strict=True))
        assert 0 <= late <= TRUNCATION_S * len(spans) + 1e-9
        assert result.allocated_s == pytest.approx(allocated + late, abs=1e-6)
        assert result.allocated_node_s >= node_s - 1e-5 and result.allocated_gpu_h >= gpu_h - 1e-8
        if result.known:
            assert result.seconds["unknown"] == 0
        else:
            assert result.goodput is None


def test_records_in_the_second_sacct_cut_off_a_runs_end_still_count():
    """sacct's End 100 means the run ended in [100, 101): steps logged at 100.3 and 100.8 after a checkpoint at 99.9
    and before a requeue are lost work, not nothing (clamped to 100 they would vanish)."""
    records = [line(5, 99.0), event("checkpoint_begin", 5, 99.0), event("checkpoint_end", 5, 99.9),
               line(6, 100.3, event="superseded"), line(7, 100.8, event="superseded"),
               event("resume", 5, 120.0), line(6, 121.0), line(7, 122.0)]  # fmt: skip
    result = ledger([RunSpan(0, 100, nodes=1), RunSpan(110, 122, nodes=1)], [], records)
    assert seconds(result, run=0)["lost"] == 0.9 and result.runs[0].allocated_s == 100.8
    assert seconds(result, run=1) == {"startup": 10, "productive": 2}


def preempted_at(wall: float, restart: int = 0) -> dict[str, Any]:
    """The runs file's line for SLURM's preemption notice (launching/preemption.py)."""
    from datetime import UTC, datetime

    when = datetime.fromtimestamp(wall, UTC).isoformat()
    return {"event": "preempted", "job": "57", "restart": restart, "time": when}


def test_a_preempted_runs_time_from_slurms_notice_to_its_end_is_preempted():
    # preempted at 200 (after step 20); the training saves 205-215 and the run waits for SLURM until 260; the requeued
    # run resumes from step 20 at 300
    records = [
        line(10, 100), line(20, 200), event("checkpoint_begin", 20, 205), event("checkpoint_end", 20, 215),
        event("resume", 20, 300), line(30, 400),
    ]  # fmt: skip
    spans = [RunSpan(0, 260, nodes=2), RunSpan(290, 400, nodes=2)]
    result = ledger(spans, [preempted_at(200)], records)
    assert seconds(result, run=0) == {"startup": 100, "productive": 100, "preempted": 60}
    assert seconds(result, run=1) == {"startup": 10, "productive": 100}
    assert result.node_seconds["preempted"] == 120  # two nodes
    assert set(CATEGORIES) >= {"preempted"}


def test_a_notice_outside_a_run_or_of_another_restart_changes_nothing():
    records = [line(10, 100), line(20, 200)]
    plain = ledger([RunSpan(0, 260, nodes=1)], [], records)
    for lines in ([preempted_at(300)], [preempted_at(150, restart=1)], [{"event": "preempted", "restart": 0}]):
        assert seconds(ledger([RunSpan(0, 260, nodes=1)], lines, records)) == seconds(plain)
