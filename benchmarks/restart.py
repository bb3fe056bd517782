"""In-job restarts timed (issue 48, parts 1 and 2): a hung rank and a crashed rank of a 2-node training restarted in
the same SLURM job, with the defaults, on the local SLURM cluster; the time from the fault to the training running
again, against issue 48's targets (a hang 90 s, a crash 45 s: each test states its target with its figures).

The scenarios are tests/cluster/test_restart_cluster.py's two fault tests (the fault by pid, the events waited for,
the verdicts asserted): each run of this script runs them once per round with pytest, and each test writes its
figures (tests/helpers.figures) as JSON lines to $MULTINODE_FIGURES_FILE, read back here. Per fault: each round's
fault -> noticed (the job log's first word of it), -> the restart decided, -> the new step started (the failed one
gone), -> both relaunched ranks ready, with the 1-minute load average then; beside them, the same round's start-up
of a step (its start to both ranks ready) for the first launch and for the restart; the median and range of each; the
rounds that met the target. A round whose tests fail stops the run: no figure of a failed scenario is kept.

    python benchmarks/restart.py [--rounds 3] [--slurm 22.05] [--out benchmarks/results-restart.json]

The cluster is the tests' own (MULTINODE_TEST_CLUSTER_DIR, MULTINODE_TEST_SLURM: tests/helpers.py); one that is up is
reused and left up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TESTS = "tests/cluster/test_restart_cluster.py"
# The figures' names (tests/helpers.figures' first argument) and the test that writes each
SCENARIOS = {
    "hung rank restarted": "test_a_hung_rank_is_noticed_by_the_trainings_pace_and_restarted_in_the_same_job",
    "crashed rank restarted": "test_a_crashed_rank_is_restarted_in_the_same_job",
}
TIMES = ("fault_to_noticed_s", "fault_to_restart_s", "fault_to_new_step_s", "fault_to_relaunched_ranks_s")
# The start-up of a step, measured in the same round: the first launch's and the restart's, side by side
STARTUP = ("first_step_to_ranks_s", "new_step_to_ranks_s")


def pytest_command(python: str = sys.executable) -> list[str]:
    return [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(f"{TESTS}::{t}" for t in SCENARIOS.values())]


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per scenario: each time's median, min and max over the rounds, the load averages, the target and the rounds
    whose training ran again within it."""
    out: dict[str, dict[str, Any]] = {}
    for name in SCENARIOS:
        mine = [r for r in rows if r["test"] == name]
        if not mine:
            continue
        targets = {r["target_s"] for r in mine}
        if len(targets) != 1:
            raise ValueError(f"{name}: the rounds name different targets {sorted(targets)}")
        target = targets.pop()
        entry: dict[str, Any] = {"rounds": len(mine), "target_s": target}
        for key in (*TIMES, *STARTUP):
            values = [float(r[key]) for r in mine]
            entry[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        entry["load_average_1m"] = [r["load_average_1m"] for r in mine]
        entry["met"] = sum(float(r["fault_to_relaunched_ranks_s"]) <= target for r in mine)
        out[name] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slurm", default=os.environ.get("MULTINODE_TEST_SLURM", "22.05"))
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results-restart.json"))
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="restart-bench-") as tmp:
        figures = Path(tmp) / "figures.jsonl"
        env = os.environ | {"MULTINODE_FIGURES_FILE": str(figures), "MULTINODE_TEST_SLURM": args.slurm}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        for n in range(1, args.rounds + 1):
            started = time.time()
            done = subprocess.run(pytest_command(), cwd=REPO, env=env, check=False)
            if done.returncode != 0:
                said = f"round {n}: the tests failed (pytest exit {done.returncode}); nothing is written"
                print(said, file=sys.stderr)
                return 1
            new = [json.loads(x) for x in figures.read_text().splitlines() if x.strip()][len(rows) :]
            rows += [r | {"round": n} for r in new]
            print(f"round {n}: {len(new)} figure lines in {time.time() - started:.0f} s", flush=True)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "slurm": args.slurm,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "command": " ".join(["python", "benchmarks/restart.py", "--rounds", str(args.rounds), "--slurm", args.slurm]),
        "lines": rows,
        "summary": summary(rows),
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
