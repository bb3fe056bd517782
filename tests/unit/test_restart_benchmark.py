"""benchmarks/restart.py: the in-job restarts timed by running the cluster tests that are their scenarios; what it
runs, and how it sums up the figures those tests write (the runs themselves: tests/cluster/test_restart_cluster.py)."""

from __future__ import annotations

import ast
import json

import pytest

from tests.helpers import REPO, figures, load_script

bench = load_script(REPO / "benchmarks" / "restart.py", "restart_bench")


def test_it_runs_exactly_the_fault_tests_that_write_its_figures():
    """Each scenario's test exists, and writes the figures named as the benchmark reads them."""
    tree = ast.parse((REPO / bench.TESTS).read_text())
    tests = {f.name: ast.unparse(f) for f in tree.body if isinstance(f, ast.FunctionDef)}
    for name, test in bench.SCENARIOS.items():
        assert test in tests, test
        assert f"figures({name!r}" in tests[test] or f'figures("{name}"' in tests[test], (name, test)
    cmd = bench.pytest_command("python")
    assert cmd[:3] == ["python", "-m", "pytest"] and [c for c in cmd if "::" in c] == [
        f"{bench.TESTS}::{t}" for t in bench.SCENARIOS.values()
    ]


def row(test: str, noticed: float, restart: float, ranks: float, target: float, load: float = 1.0) -> dict:
    return {"test": test, "fault_to_noticed_s": noticed, "fault_to_restart_s": restart,
            "fault_to_new_step_s": restart + 1, "fault_to_relaunched_ranks_s": ranks, "target_s": target,
            "first_step_to_ranks_s": 20.0, "new_step_to_ranks_s": 21.0, "load_average_1m": load}  # fmt: skip


def test_the_summary_gives_each_times_median_and_range_and_the_rounds_within_the_target():
    hung = "hung rank restarted"
    rows = [row(hung, 30.5, 37.8, 74.5, 90, 22.7), row(hung, 30.8, 63.0, 95.1, 90, 9.9)]
    rows.append(row(hung, 30.4, 34.9, 68.6, 90))
    got = bench.summary(rows)
    assert list(got) == [hung]  # a scenario without rounds is left out, not shown empty
    assert got[hung]["fault_to_relaunched_ranks_s"] == {"median": 74.5, "min": 68.6, "max": 95.1}
    assert got[hung]["fault_to_noticed_s"]["median"] == 30.5
    assert (got[hung]["rounds"], got[hung]["met"], got[hung]["target_s"]) == (3, 2, 90)
    assert got[hung]["load_average_1m"] == [22.7, 9.9, 1.0]
    with pytest.raises(ValueError, match="different targets"):
        bench.summary([row(hung, 1, 2, 3, 90), row(hung, 1, 2, 3, 60)])


def test_a_tests_figures_reach_the_file_a_benchmark_names(tmp_path, monkeypatch):
    out = tmp_path / "figures.jsonl"
    monkeypatch.setenv("MULTINODE_FIGURES_FILE", str(out))
    figures("hung rank restarted", fault_to_restart_s=37.8, target_s=90)
    assert json.loads(out.read_text()) == {"test": "hung rank restarted", "fault_to_restart_s": 37.8, "target_s": 90}
