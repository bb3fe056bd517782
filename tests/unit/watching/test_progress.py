"""Progress lines from a training's metrics file: the last complete line, formatted, at most once per job per
interval (progress.py). No SLURM involved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.watching import progress
from snakemake_executor_multinode.watching.progress import Progress, ProgressLines
from tests.helpers import Clock


def write_lines(path: Path, *records: dict, tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def test_the_issue_example_line():
    # 18800 steps left at 111575 tokens per step and 184k tokens/s: 11400 s
    record = {"step": 1200, "steps": 20000, "loss": 2.3141, "tokens": 1200 * 111575, "tokens_per_s": 184000.0}
    assert progress.parse(record).describe() == "step 1200/20000 loss 2.31 184k tok/s ETA 3h10m"


def test_what_the_example_training_writes_is_read(tmp_path):
    # a line as workflows/scripts/train.py writes it
    record = {"step": 40, "steps": 100, "loss": 5.1234, "lr": 0.001, "tokens": 40960, "tokens_per_s": 2048.0}
    record |= {"mfu": None, "elapsed": 20.0, "step_ms": 500.0, "time": 1.8e9}
    write_lines(tmp_path / "m.jsonl", record)
    found = progress.read(tmp_path / "m.jsonl")
    assert found == Progress(40, 100, 5.1234, 2048.0, 0.5)
    assert found.eta_s == pytest.approx(30.0)
    assert found.describe() == "step 40/100 loss 5.12 2.0k tok/s ETA 30s"
    assert found.describe(eta=False) == "step 40/100 loss 5.12 2.0k tok/s"


@pytest.mark.parametrize(
    ("record", "per_step"),
    [
        ({"step": 10, "steps": 20, "tokens": 1000, "tokens_per_s": 50.0, "step_ms": 9999}, 2.0),  # the recent rate
        ({"step": 10, "steps": 20, "step_ms": 1500}, 1.5),  # the last step
        ({"step": 10, "steps": 20, "elapsed": 30.0}, 3.0),  # the average so far
        ({"step": 10, "steps": 20}, None),
    ],
)
def test_time_per_step_from_what_the_line_has(record, per_step):
    assert progress.parse(record).seconds_per_step == per_step


def test_the_wall_clock_between_the_last_lines_gives_the_eta_and_one_pause_does_not_rule_it(tmp_path):
    # log every 10 steps, 1 s per step; a 60 s checkpoint between step 30 and 40; tokens/s says 0.1 s per step
    times = {10: 0.0, 20: 10.0, 30: 20.0, 40: 90.0, 50: 100.0, 60: 110.0}
    lines = [{"step": s, "steps": 100, "time": t, "tokens": s * 100, "tokens_per_s": 1000.0} for s, t in times.items()]
    write_lines(tmp_path / "m.jsonl", {"step": 5, "time": -1000.0}, *lines)  # beyond the window: not read
    found = progress.read(tmp_path / "m.jsonl")
    assert found.seconds_per_step == 1.0 and found.describe().endswith("ETA 40s")
    # no time in the lines: the training's own tokens/s
    assert progress.parse(lines[-1] | {"time": None}, [x | {"time": None} for x in lines[:-1]]).seconds_per_step == 0.1


def test_without_a_total_the_line_says_step_and_rate_only():
    assert progress.parse({"step": 7, "tokens_per_s": 1.5e6, "elapsed": 7}).describe() == "step 7 1.5M tok/s"


@pytest.mark.parametrize("bad", [{}, {"step": "7"}, {"step": True}, {"step": float("nan")}])
def test_a_line_without_a_numeric_step_is_no_progress(bad):
    assert progress.parse(bad) is None


def test_a_line_being_written_is_skipped_for_the_last_complete_one(tmp_path):
    path = tmp_path / "m.jsonl"
    write_lines(path, {"step": 1}, {"step": 2}, tail='{"step": 3, "lo')
    assert progress.read(path).step == 2


def test_only_the_tail_of_a_long_file_is_read_and_a_cut_first_line_is_ignored(tmp_path):
    path = tmp_path / "m.jsonl"
    write_lines(path, *({"step": i, "pad": "x" * 100} for i in range(1, 2001)))
    assert path.stat().st_size > 10 * progress.TAIL_BYTES
    assert progress.read(path).step == 2000


def test_no_file_or_a_dangling_link_is_no_progress(tmp_path):
    assert progress.read(tmp_path / "none.jsonl") is None
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "not-yet.jsonl")
    assert progress.read(tmp_path / "link.jsonl") is None
    assert progress.for_log(None) is None


def test_the_metrics_file_lies_beside_the_jobs_first_log(tmp_path):
    log = tmp_path / "rule_train" / "_" / "57.attempt2.log"
    assert JobFiles.from_log(log).metrics == tmp_path / "rule_train" / "_" / "57.attempt2.metrics.jsonl"
    log.parent.mkdir(parents=True)
    write_lines(JobFiles.from_log(log).metrics, {"step": 3, "steps": 9})
    assert progress.for_log(str(log)).describe() == "step 3/9"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59.6, "1m"), (725, "12m05s"), (11400, "3h10m"), (183600, "2d03h"), (14 * 86400, "14d"), (600, "10m")],
)
def test_durations_read_as_two_units(seconds, text):
    assert progress.duration(seconds) == text


@pytest.mark.parametrize(("value", "text"), [(950, "950"), (1500, "1.5k"), (184000, "184k"), (2.5e9, "2.5G")])
def test_rates_are_short(value, text):
    assert progress.human(value) == text


def test_at_most_one_line_per_job_per_interval_and_only_when_the_step_moved(tmp_path):
    clock = Clock()
    lines = ProgressLines(interval=60, clock=clock)
    log = JobFiles.of(tmp_path, "5", 1).log
    metrics = JobFiles.from_log(log).metrics
    assert lines.line("5", "train", log) is None  # no metrics yet: read again only after the interval
    write_lines(metrics, {"step": 1, "steps": 10})
    clock.now = 30
    assert lines.line("5", "train", log) is None
    clock.now = 60
    assert lines.line("5", "train", log) == "train (SLURM job 5): step 1/10"
    write_lines(metrics, {"step": 1, "steps": 10}, {"step": 2, "steps": 10})
    clock.now = 119
    assert lines.line("5", "train", log) is None  # moved, but within the minute
    clock.now = 120
    assert lines.line("5", "train", log) == "train (SLURM job 5): step 2/10"
    clock.now = 180
    assert lines.line("5", "train", log) is None  # the same step again: nothing new to say
    assert lines.line("6", "other", JobFiles.of(tmp_path, "6", 1).log) is None  # each job on its own clock


def test_an_interval_of_0_turns_progress_lines_off(tmp_path):
    log = JobFiles.of(tmp_path, "5", 1).log
    write_lines(JobFiles.from_log(log).metrics, {"step": 1})
    assert ProgressLines(interval=0).line("5", "train", log) is None
    assert ProgressLines(interval=60).line("5", "train", None) is None


def test_the_line_carries_mfu_when_the_training_says_it():
    record = {"step": 1200, "steps": 20000, "loss": 2.3141, "tokens": 1200 * 111575, "tokens_per_s": 184000.0}
    assert (
        progress.parse(record | {"mfu": 0.474}).describe() == "step 1200/20000 loss 2.31 184k tok/s mfu 47.4% ETA 3h10m"
    )
    # null (the training does not know its GPUs' peak) or absent: no mfu at all, never "mfu 0.0%"
    assert "mfu" not in progress.parse(record | {"mfu": None}).describe()
    assert "mfu" not in progress.parse(record).describe()


def test_the_progress_line_snakemake_prints_carries_mfu(tmp_path):
    log = JobFiles.of(tmp_path, "7", 1).log
    write_lines(JobFiles.from_log(log).metrics, {"step": 10, "steps": 20, "tokens_per_s": 2048.0, "mfu": 0.5})
    line = ProgressLines(interval=60, clock=Clock()).line("7", "train", log)
    assert line == "train (SLURM job 7): step 10/20 2.0k tok/s mfu 50.0%"


def test_event_records_after_the_last_step_line_are_not_the_progress(tmp_path):
    path = tmp_path / "m.jsonl"
    lines = [{"step": 40, "steps": 100, "time": 1.0}, {"event": "checkpoint_begin", "step": 40, "wall": 2.0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    shown = progress.read(path)
    assert shown is not None and shown.step == 40 and shown.steps == 100
