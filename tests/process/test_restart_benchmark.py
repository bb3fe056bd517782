"""benchmarks/restart.py run as a user runs it (the rest: tests/unit/test_restart_benchmark.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import REPO


def test_a_round_whose_tests_fail_writes_nothing(tmp_path):
    """The tests fail here at once (a test file that does not exist in this copy): no result file is written."""
    fake = tmp_path / "repo"
    (fake / "benchmarks").mkdir(parents=True)
    (fake / "benchmarks" / "restart.py").write_text((REPO / "benchmarks" / "restart.py").read_text())
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if k != "MULTINODE_FIGURES_FILE"}
    done = subprocess.run(
        [sys.executable, str(fake / "benchmarks" / "restart.py"), "--rounds", "1", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1 and "nothing is written" in done.stderr, done.stderr
    assert not out.exists()
