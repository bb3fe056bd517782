"""train.py's throughput is wall clock between synchronised points: every metrics line's tokens_per_s is the tokens
since the previous line over the wall-clock gap between the two lines, less the checkpoint time it reports beside
it, and the logged intervals add up to the run's training time (elapsed). Nothing done between two lines (the
per-step preemption check, logging, the data batch) falls outside the interval."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from .helpers import TINY, events, metrics, train

# Checkpoints every 6 steps, lines every 4: some intervals hold a save, some don't.
CFG = {**TINY, "plugin": "torch_ddp", "steps": 24, "log_every": 4, "ckpt_every": 6}


@pytest.mark.slow
def test_logged_tokens_per_s_is_tokens_between_two_lines_over_their_wall_clock_gap(tmp_path: Path, data_dir: Path):
    train(tmp_path, data_dir, CFG)
    rows = metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [4, 8, 12, 16, 20, 24]
    assert sum(r["ckpt_s"] > 0 for r in rows) == 3  # saves at steps 6, 12 and 18 fall in three intervals
    for before, after in zip(rows, rows[1:], strict=False):
        gap = after["time"] - before["time"] - after["ckpt_s"]
        wall_tps = (after["tokens"] - before["tokens"]) / gap
        assert after["tokens_per_s"] == pytest.approx(wall_tps, rel=0.01), (before, after)
        assert after["step_ms"] == pytest.approx(1000 * gap / (after["step"] - before["step"]), rel=0.01)


@pytest.mark.slow
def test_logged_intervals_add_up_to_the_training_time(tmp_path: Path, data_dir: Path):
    train(tmp_path, data_dir, CFG)
    rows = metrics(tmp_path / "metrics.jsonl")
    starts = [0] + [r["step"] for r in rows[:-1]]
    intervals = [r["step_ms"] * (r["step"] - start) / 1000 for r, start in zip(rows, starts, strict=True)]
    assert rows[-1]["elapsed"] == pytest.approx(sum(intervals), rel=0.01)
    # The first line's interval starts when the loop starts; from there on, the wall clock between the first and
    # the last line is the training time of the later lines plus their checkpoints.
    span = rows[-1]["time"] - rows[0]["time"]
    assert span == pytest.approx(sum(intervals[1:]) + sum(r["ckpt_s"] for r in rows[1:]), rel=0.01)


@pytest.mark.slow
def test_every_save_is_bracketed_by_checkpoint_events_and_every_record_carries_its_wall_clock_time(tmp_path, data_dir):
    train(tmp_path, data_dir, CFG)
    marks = [(e["event"], e["step"]) for e in events(tmp_path / "metrics.jsonl")]
    # ckpt_async: each save's second half is said (checkpoint_written) inside the next save's stall, the last one's
    # inside its own (the exit waits for it)
    assert marks == [
        ("checkpoint_begin", 6), ("checkpoint_end", 6),
        ("checkpoint_begin", 12), ("checkpoint_written", 6), ("checkpoint_end", 12),
        ("checkpoint_begin", 18), ("checkpoint_written", 12), ("checkpoint_end", 18),
        ("checkpoint_begin", 24), ("checkpoint_written", 18), ("checkpoint_written", 24), ("checkpoint_end", 24),
    ]  # fmt: skip
    assert all(r["wall"] == r["time"] for r in metrics(tmp_path / "metrics.jsonl"))  # step lines: the same clock
    walls = [e["wall"] for e in events(tmp_path / "metrics.jsonl")]
    assert walls == sorted(walls) and all(isinstance(w, float) for w in walls)


@pytest.mark.slow
def test_every_line_carries_each_nodes_busy_seconds_per_step_below_its_step_time(tmp_path: Path, data_dir: Path):
    """busy_s (the straggler check's figure): one node here (both ranks on this host), its ranks' mean compute time
    per step before the gradient sync, which is part of the step's wall-clock time (step_ms)."""
    train(tmp_path, data_dir, CFG)
    rows = metrics(tmp_path / "metrics.jsonl")
    host = socket.gethostname().split(".")[0]
    assert all(list(r["busy_s"]) == [host] for r in rows), rows
    assert all(0 < r["busy_s"][host] < r["step_ms"] / 1000 for r in rows[1:]), rows  # the first holds start-up
