"""Per-job costs that must not grow with history or with the number of running jobs (watching/registry.py,
watching/job_status.py), measured side by side in one run:

1. Reattach's question "the newest earlier submission of these outputs" after 0, 10 and 100 earlier runs of
   `--jobs` jobs each: the index (one file read) against reading the whole history (what it replaced).
2. One status cycle over 10 and `--running` running jobs: the system calls it makes (strace -c, the cycle's
   calls alone: a run of C cycles minus a run of none, divided by C), with the folder listing against one open()
   per job (what it replaced).

    python benchmarks/state_scaling.py [--jobs 500] [--histories 0,10,100] [--running 500] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from snakemake_executor_multinode.contract.jobfiles import RUNS_DIR  # noqa: E402
from snakemake_executor_multinode.watching.registry import Registry, Submission, runs  # noqa: E402

FILE_CALLS = ("openat", "open", "stat", "newfstatat", "statx", "lstat", "fstat", "getdents64", "access", "close")


def history(workdir: Path, n_runs: int, jobs: int) -> None:
    for r in range(n_runs):
        reg = Registry(workdir, f"run{r:03d}")
        for j in range(jobs):
            reg.record(
                Submission(
                    f"run{r:03d}",
                    "shard",
                    {"i": str(j)},
                    (f"out/{j}.txt",),
                    f"mn-{r}-{j}",
                    1,
                    "s.sh",
                    jobid=str(r * jobs + j),
                    submitted_at=float(r),
                )  # fmt: skip
            )


def full_scan(workdir: Path, run_id: str, outputs: tuple[str, ...]) -> Submission | None:
    """The former Registry.latest_for: every record of every run read for each question."""
    best = None
    for sub in runs(workdir / RUNS_DIR):
        if sub.run_id != run_id and sub.jobid is not None and tuple(sorted(sub.outputs)) == outputs:
            if best is None or (sub.submitted_at, sub.ended is not None) > (best.submitted_at, best.ended is not None):
                best = sub
    return best


def reattach_costs(jobs: int, histories: list[int], scans: int) -> list[dict]:
    rows = []
    for n_runs in histories:
        wd = Path(tempfile.mkdtemp(prefix="mn-bench-state-"))
        try:
            start = time.perf_counter()
            history(wd, n_runs, jobs)
            built = time.perf_counter() - start
            now = Registry(wd, "now")
            start = time.perf_counter()
            found = [now.latest_for([f"out/{j}.txt"]) for j in range(jobs)]
            index_ms = (time.perf_counter() - start) / jobs * 1000
            start = time.perf_counter()
            scanned = [full_scan(wd, "now", (f"out/{j}.txt",)) for j in range(scans)]
            scan_ms = (time.perf_counter() - start) / scans * 1000
            assert found[:scans] == scanned, "the index and the history disagree"
            rows.append({
                "earlier_runs": n_runs, "records": n_runs * jobs, "index_ms_per_job": round(index_ms, 3),
                "full_scan_ms_per_job": round(scan_ms, 3), "index_run_total_s": round(index_ms * jobs / 1000, 3),
                "full_scan_run_total_s": round(scan_ms * jobs / 1000, 2), "history_written_s": round(built, 1),
            })  # fmt: skip
        finally:
            shutil.rmtree(wd, ignore_errors=True)
    return rows


CYCLES_CHILD = r"""
import sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[4])
from snakemake_executor_multinode.watching.job_status import JobStatus

class Quiet:  # SLURM is never asked: every job runs, and no sweep is due
    def query(self, ids): return {}
    def live(self, ids): return {}

running, cycles, listing = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "listing"
state = Path(tempfile.mkdtemp(prefix="mn-bench-cycle-"))
(state / "999999.exit").write_text("0 0 other\n")  # one finished job in the folder, not one of these
job_status = JobStatus(state, Quiet(), sweep_seconds=1e9)
if not listing:
    job_status._list = lambda: None  # the former cycle: one open() per running job
ids = [str(1000 + i) for i in range(running)]
for _ in range(cycles):
    out = job_status.poll(ids)
assert cycles == 0 or not any(o.finished for o in out.values())
"""


def syscalls(running: int, cycles: int, listing: bool) -> int:
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as trace:
        cmd = [sys.executable, "-c", CYCLES_CHILD, str(running), str(cycles), "listing" if listing else "open",
               str(REPO)]  # fmt: skip
        subprocess.run(["strace", "-f", "-c", "-o", trace.name, *cmd], check=True, capture_output=True)
        total = 0
        for line in Path(trace.name).read_text().splitlines():
            cols = line.split()
            # % time, seconds, usecs/call, calls, [errors], syscall
            if len(cols) >= 5 and cols[-1] in FILE_CALLS and re.fullmatch(r"\d+", cols[3]):
                total += int(cols[3])
        return total


def cycle_costs(running_counts: list[int], cycles: int) -> list[dict]:
    rows = []
    for running in running_counts:
        row: dict = {"running_jobs": running}
        for listing in (True, False):
            per_cycle = (syscalls(running, cycles, listing) - syscalls(running, 0, listing)) / cycles
            row["listing" if listing else "open_per_job"] = round(per_cycle, 1)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--histories", default="0,10,100", help="earlier runs, comma-separated")
    parser.add_argument("--scans", type=int, default=3, help="full-history reads timed (each reads every record)")
    parser.add_argument("--running", type=int, default=500)
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = {
        "reattach": reattach_costs(args.jobs, [int(h) for h in args.histories.split(",")], args.scans),
        "status_cycle_file_syscalls": cycle_costs(sorted({10, args.running}), args.cycles)
        if shutil.which("strace")
        else "strace not installed",
        "machine": f"{os.cpu_count()} cores",
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
