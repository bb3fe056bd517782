"""A fan-out of N independent one-second jobs and one job after them, side by side in one run, on the same cluster:

  handwritten   N x `sbatch --wrap "sleep 1"` as fast as sbatch returns, then one `--dependency=afterok:<all>` job
                (the floor: no workflow manager)
  hand array    one `sbatch --array=0-(N-1) --wrap "sleep 1"`, then one afterok job (the floor for a job array:
                SLURM starts an array's tasks in its scheduling passes, at most every 2 s, not at submission)
  multinode     `snakemake --executor multinode --jobs N` running the same as N + 1 rules: the N as one job array
  no arrays     the same with --multinode-no-arrays: N paced sbatch calls

Reported per variant: wall time, overhead per job = (wall - the cluster's ideal) / N, where the ideal is
ceil(N / slots) seconds of sleeping, slurmctld RPCs per job (`sdiag`, its own requests excluded), and for Snakemake
its CPU time and peak memory (the child's rusage) and its resident memory over the run (sampled from /proc: the
first and the last quarter's means, for `--long`: is it flat?).

    eval "$(multinode cluster env)"
    python benchmarks/fanout.py [--jobs 500] [--long 2000] [--out FILE [--key NAME]]

`--long N` adds a run of N `sleep 0` jobs (several at a time) through the status loop.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chain_overhead import loadavg, sdiag_rpcs  # noqa: E402  (one sdiag parser and load reader for both)


def slots() -> int:
    """CPUs the cluster's idle nodes offer (each job here takes one)."""
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %c %T"], capture_output=True, text=True, check=True).stdout
    # one line per node and partition (`cluster up --preemption` adds one): each node once
    nodes = {line.split()[0]: line.split()[1:] for line in out.splitlines() if len(line.split()) == 3}
    return sum(int(cpus) for cpus, state in nodes.values() if state in ("idle", "mixed"))


def handwritten(n: int, workdir: Path) -> dict:
    done = workdir / "done"
    ids = []
    start = time.monotonic()
    for _ in range(n):
        proc = subprocess.run(
            ["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 1"],
            capture_output=True, text=True, check=True, cwd=workdir,
        )  # fmt: skip
        ids.append(proc.stdout.strip().split(";")[0])
    subprocess.run(
        ["sbatch", "--parsable", "-o", "/dev/null", f"--dependency=afterok:{':'.join(ids)}", "--wrap", f"touch {done}"],
        capture_output=True, text=True, check=True, cwd=workdir,
    )  # fmt: skip
    while not done.exists():  # the filesystem, not slurmctld, tells us it ended
        time.sleep(0.05)
    return {"wall_s": time.monotonic() - start}


def handwritten_array(n: int, workdir: Path) -> dict:
    done = workdir / "done"
    start = time.monotonic()
    proc = subprocess.run(
        ["sbatch", "--parsable", "-o", "/dev/null", f"--array=0-{n - 1}", "--wrap", "sleep 1"],
        capture_output=True, text=True, check=True, cwd=workdir,
    )  # fmt: skip
    array = proc.stdout.strip().split(";")[0]
    subprocess.run(
        ["sbatch", "--parsable", "-o", "/dev/null", f"--dependency=afterok:{array}", "--wrap", f"touch {done}"],
        capture_output=True, text=True, check=True, cwd=workdir,
    )  # fmt: skip
    while not done.exists():
        time.sleep(0.05)
    return {"wall_s": time.monotonic() - start}


def snakefile(n: int, seconds: int) -> str:
    return (
        f'rule all:\n    input: "gathered.txt"\n\n'
        f'rule shard:\n    output: "shard/{{i}}.txt"\n'
        f'    shell: "sleep {seconds}; echo {{wildcards.i}} > {{output}}"\n\n'
        f'rule gather:\n    input: expand("shard/{{i}}.txt", i=range({n}))\n    output: "gathered.txt"\n'
        f'    shell: "cat {{input}} | wc -l > {{output}}"\n'
    )


def snakemake(
    n: int, workdir: Path, seconds: int = 1, jobs: int | None = None, extra: tuple[str, ...] = (),
    executor: str = "multinode",
) -> dict:  # fmt: skip
    (workdir / "Snakefile").write_text(snakefile(n, seconds))
    cmd = [sys.executable, "-m", "snakemake", "--executor", executor, "--jobs", str(jobs or n), "--quiet", "all"]
    cmd += extra
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    rss: list[int] = []
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sampler = threading.Thread(target=_sample_rss, args=(proc, rss), daemon=True)
    sampler.start()
    _, err = proc.communicate()
    wall = time.monotonic() - start
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"snakemake failed ({proc.returncode}):\n{err[-3000:]}")
    assert (workdir / "gathered.txt").read_text().strip() == str(n)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    quarter = max(1, len(rss) // 4)
    return {
        "wall_s": wall,
        "snakemake_cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
        "snakemake_peak_rss_mb": round(after.ru_maxrss / 1024, 1),
        "rss_first_quarter_mb": round(sum(rss[:quarter]) / quarter / 1024, 1) if rss else None,
        "rss_last_quarter_mb": round(sum(rss[-quarter:]) / quarter / 1024, 1) if rss else None,
    }


def _sample_rss(proc: subprocess.Popen, out: list[int]) -> None:
    """Snakemake's resident memory (kB) once a second while it runs."""
    while proc.poll() is None:
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    out.append(int(line.split()[1]))
        except OSError:
            pass
        time.sleep(1.0)


def measure(name: str, n: int, run, ideal_s: float) -> dict:
    load = loadavg()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        rpc0 = sdiag_rpcs()
        row = run(n, Path(tmp))
        time.sleep(1)  # let the last batch-complete RPC land
        rpcs = sdiag_rpcs() - rpc0
    wall = row.pop("wall_s")
    return {
        "variant": name, "jobs": n, "wall_s": round(wall, 1), "ideal_s": ideal_s,
        "overhead_per_job_s": round((wall - ideal_s) / n, 3), "rpcs_per_job": round(rpcs / (n + 1), 2), **row,
        "loadavg_before": load, "loadavg_after": loadavg(),
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--long", type=int, default=0, help="also run this many `sleep 0` jobs through the status loop")
    ap.add_argument("--long-parallel", type=int, default=24, help="--jobs for the long run")
    ap.add_argument(
        "--official",
        type=int,
        default=0,
        help="also a fan-out of this many jobs with the official "
        "snakemake-executor-plugin-slurm (1 s status checks), beside the floor and multinode",
    )
    ap.add_argument("--out", type=Path)
    ap.add_argument("--key", help="with --out: add the result under this key of the file's JSON object (kept)")
    args = ap.parse_args()
    ideal = float(math.ceil(args.jobs / slots()))
    rows = [
        measure("handwritten sbatch fan-out + afterok", args.jobs, handwritten, ideal),
        measure("multinode (one job array)", args.jobs, snakemake, ideal),
        measure(
            "multinode --multinode-no-arrays",
            args.jobs,
            lambda n, wd: snakemake(n, wd, extra=("--multinode-no-arrays",)),
            ideal,
        ),  # fmt: skip
        measure("handwritten job array + afterok", args.jobs, handwritten_array, ideal),
    ]
    floor, ours, no_arrays, array_floor = (r["overhead_per_job_s"] for r in rows[:4])
    summary = {
        "wall_ratio": round(rows[1]["wall_s"] / rows[0]["wall_s"], 2),
        "wall_ratio_no_arrays": round(rows[2]["wall_s"] / rows[0]["wall_s"], 2),
        "wall_ratio_array_to_hand_array": round(rows[1]["wall_s"] / rows[3]["wall_s"], 2),
    }
    if floor > 0:
        summary["overhead_ratio"] = round(ours / floor, 2)
        summary["overhead_ratio_no_arrays"] = round(no_arrays / floor, 2)
    if array_floor > 0:
        summary["overhead_ratio_array_to_hand_array"] = round(ours / array_floor, 2)
    if args.long:
        rows.append(
            measure(
                f"multinode, {args.long} sleep-0 jobs, --jobs {args.long_parallel}",
                args.long,
                lambda n, wd: snakemake(n, wd, seconds=0, jobs=args.long_parallel),
                0.0,
            )  # fmt: skip
        )
    if args.official:
        small = float(math.ceil(args.official / slots()))
        rows += [
            measure("handwritten, small fan-out", args.official, handwritten, small),
            measure("multinode, small fan-out", args.official, snakemake, small),
            measure(
                "official slurm plugin, small fan-out, 1 s checks",
                args.official,
                lambda n, wd: snakemake(n, wd, executor="slurm", extra=("--seconds-between-status-checks", "1")),
                small,
            ),  # fmt: skip
        ]
    result = {"rows": rows, "summary": summary, "slots": slots()}
    print(json.dumps(result, indent=1))
    if args.out:
        whole = result
        if args.key:
            whole = json.loads(args.out.read_text()) if args.out.exists() else {}
            whole[args.key] = result
        args.out.write_text(json.dumps(whole, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
