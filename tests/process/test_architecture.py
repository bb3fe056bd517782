"""The shape of the code, kept: no import circles in the core, the core never imports the adapter, and every
script under benchmarks/ at least imports (or runs at a tiny size), so a rename cannot break one unseen.

Here the tests that start processes (the process tier); the others: tests/unit/test_architecture.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, SITE_STUB


def test_the_snapshot_benchmark_runs_at_a_tiny_size(tmp_path):
    out = tmp_path / "r.json"
    subprocess.run(
        [sys.executable, str(REPO / "benchmarks/snapshot.py"), "--files", "20", "--out", str(out)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    results = json.loads(out.read_text())
    assert results["generated_20_files"]["files"] == 21 and results["example_repository"]["snapshot_dirs"] == 2


def test_the_state_scaling_benchmark_runs_at_a_tiny_size(tmp_path):
    out = tmp_path / "r.json"
    subprocess.run(
        [sys.executable, str(REPO / "benchmarks/state_scaling.py"), "--jobs", "20", "--histories", "0,2", "--running",
         "20", "--cycles", "5", "--out", str(out)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    results = json.loads(out.read_text())
    assert [row["records"] for row in results["reattach"]] == [0, 40]
    cycles = results["status_cycle_file_syscalls"]
    if cycles != "strace not installed":
        assert [row["running_jobs"] for row in cycles] == [10, 20]
        assert cycles[0]["listing"] == cycles[1]["listing"]  # flat: one listing, whatever runs


def test_the_gpu_summary_is_the_steady_tokens_over_their_wall_clock_after_the_first_interval(tmp_path):
    metrics = tmp_path / "m.jsonl"
    # 10 steps of 100 tokens a line; the first interval (the compile) took 50 s, then 1 s, 2 s and 1 s + a 1 s save.
    rows = [
        {"step": 10, "tokens": 1000, "tokens_per_s": 20.0, "mfu": 0.2, "time": 50.0, "loss": 3.0},
        {"step": 20, "tokens": 2000, "tokens_per_s": 1000.0, "mfu": 10.0, "time": 51.0, "ckpt_s": 0.0, "loss": 2.5},
        {"step": 30, "tokens": 3000, "tokens_per_s": 500.0, "mfu": 5.0, "time": 53.0, "ckpt_s": 0.0, "loss": 2.2},
        {"step": 40, "tokens": 4000, "tokens_per_s": 1000.0, "mfu": 10.0, "time": 55.0, "ckpt_s": 1.0, "loss": 2.0},
    ]
    metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks/gpu/summarize.py"), "v", str(metrics)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    summary = json.loads(out.stdout)
    assert summary["tokens_per_s"] == 750 and summary["span_tokens_per_s"] == 750  # 3000 tokens in 4 s
    assert summary["step_ms"] == 133.3 and summary["mfu"] == 7.5 and summary["first_interval_s"] == 50.0


@pytest.mark.parametrize(
    "script", ["benchmarks/launch_worker.py", "benchmarks/launch_probe/sitecustomize.py", "benchmarks/gpu/run.sh"]
)
def test_scripts_that_run_only_inside_a_benchmark_job_compile(script):
    path = REPO / script
    if path.suffix == ".sh":
        subprocess.run(["bash", "-n", str(path)], check=True)
    else:
        compile(path.read_text(), str(path), "exec")


def test_the_bitsandbytes_stand_in_gives_the_base_class_galore_needs_and_refuses_to_be_used():
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from bitsandbytes.optim.optimizer import Optimizer2State\n"
        "class GaLore8bit(Optimizer2State): pass\n"  # what galore_torch and ColossalAI do at import time
        "try:\n    GaLore8bit([])\nexcept RuntimeError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(REPO / SITE_STUB)], capture_output=True, text=True, check=True
    ).stdout
    assert "not installed here" in out


@pytest.mark.parametrize("script", sorted(str(p.relative_to(REPO)) for p in (REPO / "scripts").glob("*.sh")))
def test_every_script_parses(script):
    """scripts/test.sh is CI itself and scripts/example.sh the README's first command: both at least parse."""
    subprocess.run(["bash", "-n", str(REPO / script)], check=True)
