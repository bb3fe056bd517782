"""Per-job overhead and slurmctld load of a chain of one-second jobs, side by side in one run.

    eval "$(multinode cluster env)"          # or: --start-cluster (root)
    python benchmarks/chain_overhead.py [--jobs 10] [--repeats 1]

Compared, on the same cluster, one after the other:
  handwritten   `sbatch --dependency=afterok:<previous>` x N, submitted at once (the floor: no workflow manager)
  multinode     `snakemake --executor multinode` running the same chain as N rules
  multinode-inner  the same with --multinode-inner-snakemake (Snakemake started inside every job)
Overhead per job = (wall time - N x 1 s) / N. slurmctld RPCs come from `sdiag` (its own request excluded).
If snakemake-executor-plugin-slurm is installed, it is measured too (with 1-second status checks).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SLEEP = 1


def sdiag_rpcs(by_type: bool = False) -> Any:
    """slurmctld's RPCs so far, its own REQUEST_STATS_INFO left out: the total, or {message type: count}."""
    counts = rpc_counts(subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout)
    return counts if by_type else sum(counts.values())


def rpc_counts(sdiag_out: str) -> dict[str, int]:
    """sdiag's RPC counts by message type, its own REQUEST_STATS_INFO left out (one parser for every benchmark)."""
    section = sdiag_out.split("Remote Procedure Call statistics by message type", 1)[1]
    section = section.split("Remote Procedure Call statistics by user", 1)[0]
    counts = {}
    for line in section.splitlines():
        m = re.match(r"\s*(\S+)\s+\(\s*\d+\)\s+count:(\d+)", line)
        if m and m.group(1) != "REQUEST_STATS_INFO":
            counts[m.group(1)] = int(m.group(2))
    return counts


def handwritten(n: int, workdir: Path) -> float:
    done = workdir / "done"
    prev = None
    start = time.monotonic()
    for i in range(n):
        dep = [f"--dependency=afterok:{prev}"] if prev else []
        cmd = f"sleep {SLEEP}" + (f" && touch {done}" if i == n - 1 else "")
        prev = subprocess.run(
            ["sbatch", "--parsable", "-o", "/dev/null", *dep, "--wrap", cmd],
            capture_output=True,
            text=True,
            check=True,
            cwd=workdir,
        ).stdout.strip()
    while not done.exists():  # the filesystem, not slurmctld, tells us it ended
        time.sleep(0.05)
    return time.monotonic() - start


def snakefile(n: int) -> str:
    rules = [f'rule all:\n    input: "s{n - 1}.txt"\n']
    for i in range(n):
        inp = f'    input: "s{i - 1}.txt"\n' if i else ""
        rules.append(f'rule s{i}:\n{inp}    output: "s{i}.txt"\n    shell: "sleep {SLEEP}; touch {{output}}"\n')
    return "\n".join(rules)


def snakemake_chain(n: int, workdir: Path, executor: str, extra: list[str]) -> tuple[float, float]:
    """The chain's wall time, and Snakemake's fixed cost of one run: the same command again, with nothing to do
    (start, DAG, executor setup, exit), paid once per run, not per job."""
    (workdir / "Snakefile").write_text(snakefile(n))
    cmd = [sys.executable, "-m", "snakemake", "--executor", executor, "--jobs", "1", "--quiet", "all", *extra]
    start = time.monotonic()
    subprocess.run(cmd, cwd=workdir, check=True, capture_output=True, text=True)
    wall = time.monotonic() - start
    start = time.monotonic()
    subprocess.run(cmd, cwd=workdir, check=True, capture_output=True, text=True)
    return wall, time.monotonic() - start


def loadavg() -> list[str]:
    """The machine's load (1, 5, 15 minutes) as /proc/loadavg says it: every result row records it."""
    return Path("/proc/loadavg").read_text().split()[:3]


def measure(name: str, n: int, run) -> dict:
    load = loadavg()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        rpc0 = sdiag_rpcs()
        result = run(n, Path(tmp))
        time.sleep(1)  # let the last batch-complete RPC land
        rpcs = sdiag_rpcs() - rpc0  # (the nothing-to-do run asks slurmctld nothing)
    wall, fixed = result if isinstance(result, tuple) else (result, 0.0)
    return {
        "variant": name,
        "jobs": n,
        "wall_s": round(wall, 2),
        "overhead_per_job_s": round((wall - n * SLEEP) / n, 2),
        # without the once-per-run start (a run with nothing to do): what each further job costs
        "run_start_s": round(fixed, 2),
        "overhead_per_job_after_start_s": round((wall - fixed - n * SLEEP) / n, 2),
        "rpcs_per_job": round(rpcs / n, 1),
        "loadavg_before": load,
        "loadavg_after": loadavg(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--start-cluster", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--append", action="store_true", help="with --json: add the rows to those the file holds")
    ap.add_argument("--no-official", action="store_true", help="skip the official plugin (~7 min a run)")
    args = ap.parse_args()
    if args.start_cluster:
        subprocess.run(["multinode", "cluster", "up"], check=True)
        env = subprocess.run(["multinode", "cluster", "env"], capture_output=True, text=True, check=True).stdout
        for line in env.splitlines():
            key, _, value = line.removeprefix("export ").partition("=")
            os.environ[key] = value
    variants = [
        ("handwritten afterok chain", handwritten),
        ("multinode", lambda n, wd: snakemake_chain(n, wd, "multinode", [])),
        (
            "multinode --multinode-inner-snakemake",
            lambda n, wd: snakemake_chain(n, wd, "multinode", ["--multinode-inner-snakemake"]),
        ),
    ]
    if not args.no_official and importlib.util.find_spec("snakemake_executor_plugin_slurm"):
        variants.append(
            (
                "official slurm plugin, 1 s checks",
                lambda n, wd: snakemake_chain(n, wd, "slurm", ["--seconds-between-status-checks", "1"]),
            )
        )
    rows = [{**measure(name, args.jobs, run), "repeat": i + 1} for i in range(args.repeats) for name, run in variants]
    print(f"{'variant':<42} {'wall s':>7} {'overhead/job s':>15} {'start s':>8} {'after start':>12} {'RPCs/job':>9}")
    for r in rows:
        print(
            f"{r['variant']:<42} {r['wall_s']:>7} {r['overhead_per_job_s']:>15} {r['run_start_s']:>8} "
            f"{r['overhead_per_job_after_start_s']:>12} {r['rpcs_per_job']:>9}"
        )
    # per repeat: each run of multinode against the floor measured just before it (the load of the moment)
    for i in range(args.repeats):
        run = rows[i * len(variants) : (i + 1) * len(variants)]
        base, ours = run[0]["overhead_per_job_s"], run[1]["overhead_per_job_s"]
        after = run[1]["overhead_per_job_after_start_s"]
        if base > 0:
            print(
                f"run {i + 1}: multinode / handwritten overhead per job = {ours / base:.2f}x, "
                f"{after / base:.2f}x after Snakemake's start"
            )
    if args.json:
        kept = json.loads(args.json.read_text()) if args.append and args.json.exists() else []
        args.json.write_text(json.dumps(kept + rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
