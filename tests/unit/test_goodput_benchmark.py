"""benchmarks/goodput.py's reading of a fault's outcome from the metrics file, which train.py rewrites on resume."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from tests.helpers import REPO


def goodput_module():
    spec = importlib.util.spec_from_file_location("goodput_bench", REPO / "benchmarks" / "goodput.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def metrics(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 9')  # and a line being written
    return path


def step(n: int, wall: float, superseded: bool = False) -> dict:
    return {"step": n, "wall": wall, "loss": 1.0, **({"event": "superseded"} if superseded else {})}


def test_a_fault_after_a_checkpoint_loses_the_steps_since_it_and_resumes_at_the_first_step_after_the_resume(tmp_path):
    g = goodput_module()
    path = metrics(tmp_path / "m.jsonl", [
        step(1, 100.0), step(2, 101.0),
        {"event": "checkpoint_begin", "step": 2, "wall": 101.0}, {"event": "checkpoint_end", "step": 2, "wall": 101.5},
        step(3, 102.0, superseded=True), step(4, 103.0, superseded=True),  # computed again after the fault at 103.2
        {"event": "resume", "step": 2, "wall": 150.0, "restore_s": 1.0},
        step(3, 151.0), step(4, 152.0),
    ])  # fmt: skip
    progress = g.read_progress(path)
    assert progress.step == 4 and progress.resumes == [(2, 150.0)]
    fault = g.FaultResult("admin_requeue", "7", injected_at=103.2, step=4)
    g.settle(fault, progress, progress.records)
    assert (fault.resumed_from, fault.steps_lost) == (2, 2)
    assert fault.first_resumed_step_at == 151.0 and fault.time_to_first_resumed_step_s == 47.8


def test_a_fault_not_yet_resumed_from_stays_open_and_a_resume_before_it_does_not_count(tmp_path):
    g = goodput_module()
    path = metrics(tmp_path / "m.jsonl", [
        {"event": "resume", "step": 0, "wall": 90.0}, step(1, 100.0), step(2, 101.0),
    ])  # fmt: skip
    progress = g.read_progress(path)
    fault = g.FaultResult("hang", "7", injected_at=101.5, step=2)
    g.settle(fault, progress, progress.records)
    assert fault.resumed_from is None and fault.first_resumed_step_at is None


def test_a_checkpoint_at_the_signal_loses_nothing(tmp_path):
    g = goodput_module()
    path = metrics(tmp_path / "m.jsonl", [
        step(5, 100.0), {"event": "checkpoint_begin", "step": 6, "wall": 101.0},
        {"event": "checkpoint_end", "step": 6, "wall": 101.2}, step(6, 101.0),
        {"event": "resume", "step": 6, "wall": 130.0}, step(7, 131.0),
    ])  # fmt: skip
    progress = g.read_progress(path)
    fault = g.FaultResult("time_limit_signal", "7", injected_at=95.0, step=5)
    g.settle(fault, progress, progress.records)
    assert (fault.resumed_from, fault.steps_lost, fault.time_to_first_resumed_step_s) == (6, 0, 36.0)


def test_a_faults_time_is_cut_into_held_queue_startup_restore_and_lost_at_saccts_runs():
    """A requeue: the run it hit ends 10 s after it (held), the next starts 30 s later (queue: not allocated), its
    resume loads for 2 s after 8 s of startup; 4 steps of 0.5 s are computed again (lost)."""
    g = goodput_module()
    runs = [g.Run("7", 0.0, 0.0, 110.0, 2, "REQUEUED", "0:0", "None"),
            g.Run("7", 110.0, 140.0, 300.0, 2, "COMPLETED", "0:0", "None")]  # fmt: skip
    fault = g.FaultResult("admin_requeue", "7", injected_at=100.0, step=40, resumed_from=36, steps_lost=4)
    g.cut(fault, runs, {"event": "resume", "step": 36, "wall": 150.0, "restore_s": 2.0}, step_s=0.5)
    assert (fault.held_s, fault.queue_s, fault.startup_s, fault.restore_s, fault.lost_s) == (10, 30, 8, 2, 2)
    # a spare's relaunch resumes inside the run it hit: all of it held, no queue, no new run's startup
    runs = [g.Run("8", 0.0, 0.0, 300.0, 3, "COMPLETED", "0:0", "None")]
    fault = g.FaultResult("node_death", "8", injected_at=100.0, step=40, resumed_from=36, steps_lost=4)
    g.cut(fault, runs, {"event": "resume", "step": 36, "wall": 125.0, "restore_s": 1.0}, step_s=0.5)
    assert (fault.held_s, fault.queue_s, fault.startup_s, fault.restore_s, fault.lost_s) == (24, 0, 0, 1, 2)
    # not resumed (yet): nothing is cut
    fault = g.FaultResult("hang", "8", injected_at=100.0, step=40)
    g.cut(fault, runs, None, step_s=0.5)
    assert fault.held_s is None and fault.lost_s is None
