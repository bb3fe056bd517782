"""What verified checkpoints cost per checkpoint (issue 38, part 1), and what the training stalls for with
asynchronous saves against synchronous ones (issue 48, part 3), for the example model (workflows/config.yaml's train
section) on 2 CPU ranks (torchrun, gloo). Beside it, side by side on the newest checkpoint's files: its manifest hashed
on one thread and on the threads train.py uses (checkpoint.hash_threads), alternately, --repeat times each.

    python benchmarks/checkpoint_cost.py [--ckpt-every 5] [--work-dir /var/tmp] [--out results-checkpoint-async.json]
        [--set JSON] [--num-docs N] [--nproc 2] [--repeat 3] [--modes sync async]

--set overrides keys of the training config (a larger model on a GPU machine: where CUDA is there, train.py uses
it); --num-docs the generated corpus.

For each mode (ckpt_async false, then true: side by side in one run, on one corpus) it trains the example in two
launches: to half of its steps (checkpoints every --ckpt-every steps), then on to the end, which resumes (and so
verifies) the newest checkpoint (`--launches 1`: one launch to the end, no resume). Everything is read from the
metrics events the training writes in every run: checkpoint_begin/checkpoint_end (the stall: the time the training
stood still for the save), checkpoint_end's fsync_s, manifest_s and verify_s (sync) or snapshot_s (async),
checkpoint_written's write_s, fsync_s, manifest_s, verify_s, background_s and waited_s (async), resume (verify_s of
restore_s) and the step lines' step_ms (the training's own speed, which a save written beside it may slow). A
launch's last save waits for its whole write (the exit does): it is reported apart (`final_stall_s`), the others as
`stall_s`. A result file written before background_s was recorded (results-checkpoint-async-h100.json) has its
async shares taken over write_s, the writing of the copies alone: only its seconds are quoted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "workflows" / "scripts"
COSTS = ("fsync_s", "manifest_s", "verify_s")
MODES = {"sync": False, "async": True}  # the ckpt_async of each mode


def stats(values: list[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.fmean(values), 6),
        "median": round(statistics.median(values), 6),
        "max": round(max(values), 6),
    }


def launches(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The records of each launch: a resume event starts the next."""
    out: list[list[dict[str, Any]]] = [[]]
    for r in records:
        if r.get("event") == "resume" and out[-1]:
            out.append([])
        out[-1].append(r)
    return out


def summarize(records: list[dict[str, Any]], checkpoint_bytes: int) -> dict[str, Any]:
    """Per checkpoint: the stall (checkpoint_begin to checkpoint_end: the wall seconds the training stood still),
    apart for each launch's last save (`final_stall_s`, which waits for the whole write before the exit); the seconds
    fsync, the manifest and the verification took, with their share of the save (sync: of the stall; async: of the
    second half beside the training, background_s: from the stall's end to the checkpoint verified); async: the
    host-memory copy (snapshot_s), writing the copies (write_s) and the stall waiting for the save (waited_s); the
    mean step time (step_ms); the resume's verification of its restore."""
    stalls, finals = [], []
    for launch in launches(records):
        begins = {r["step"]: r["wall"] for r in launch if r.get("event") == "checkpoint_begin"}
        ends = [r for r in launch if r.get("event") == "checkpoint_end"]
        for e in ends:
            (finals if e is ends[-1] else stalls).append(e["wall"] - begins[e["step"]])
    ends = [r for r in records if r.get("event") == "checkpoint_end"]
    written = [r for r in records if r.get("event") == "checkpoint_written"]
    asynchronous = bool(written)
    costs = written if asynchronous else ends
    out: dict[str, Any] = {
        "ckpt_async": asynchronous,
        "checkpoints": len(ends),
        "checkpoint_bytes": checkpoint_bytes,
        "stall_s": stats(stalls),
        "final_stall_s": stats(finals),
    }
    whole = [r["background_s"] for r in written] if asynchronous else stalls + finals
    for key in COSTS:
        out[key] = stats([r[key] for r in costs])
        out[f"{key[:-2]}_share_of_save"] = round(sum(r[key] for r in costs) / sum(whole), 4)
    if asynchronous:
        out["snapshot_s"] = stats([r["snapshot_s"] for r in ends])
        out["write_s"] = stats([r["write_s"] for r in written])
        out["background_s"] = stats(whole)
        out["waited_s"] = stats([r["waited_s"] for r in written])
    out["step_ms"] = round(statistics.fmean(r["step_ms"] for r in records if "event" not in r), 3)
    resumes = [r for r in records if r.get("event") == "resume"]
    if resumes:
        out["resume"] = {"verify_s": resumes[-1]["verify_s"], "restore_s": resumes[-1]["restore_s"]}
    return out


def hashing(step_dir: Path, repeat: int) -> dict[str, Any]:
    """One thread against checkpoint.hash_threads on the same files, alternately (the page cache serves both alike:
    the checkpoint was just written and verified)."""
    sys.path.insert(0, str(SCRIPTS))
    import checkpoint

    files = checkpoint.data_files(step_dir)
    threads = checkpoint.hash_threads(len(files))
    took: dict[int, list[float]] = {1: [], threads: []}
    for _ in range(repeat):
        for n in took:
            t0 = time.perf_counter()
            checkpoint.manifest(step_dir, threads=n)
            took[n].append(time.perf_counter() - t0)
    one, many = statistics.median(took[1]), statistics.median(took[threads])
    return {
        "files": len(files),
        "threads": threads,
        "one_thread_s": round(one, 6),
        "threads_s": round(many, 6),
        "speedup": round(one / many, 2),
        "repeat": repeat,
    }


def gpu_name() -> str | None:
    """The GPU train.py runs on (None: CPU ranks)."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def launch(data: Path, work: Path, cfg: dict[str, Any], nproc: int) -> None:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    argv += [str(SCRIPTS / "train.py"), "--data-dir", str(data), "--out", str(work / "model.pt")]
    argv += ["--ckpt-dir", str(work / "ckpt"), "--metrics", str(work / "metrics.jsonl"), "--config-json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([*argv, json.dumps(cfg)], capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"train.py failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    """argv: the arguments after the script's name (None: sys.argv's)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--work-dir", default="/var/tmp", help="where checkpoints are written (a disk, not tmpfs)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results-checkpoint-async.json"))
    p.add_argument("--set", default="{}", help="JSON object: training config keys over workflows/config.yaml's")
    p.add_argument("--num-docs", type=int, help="generated documents (default: workflows/config.yaml's)")
    p.add_argument("--repeat", type=int, default=3, help="hashings of the newest checkpoint per thread count")
    p.add_argument("--modes", nargs="+", default=["sync", "async"], choices=list(MODES), help="ckpt_async off, on")
    p.add_argument("--launches", type=int, default=2, choices=[1, 2], help="1: no resume (a shorter run)")
    given = sys.argv[1:] if argv is None else argv
    args = p.parse_args(given)
    config = yaml.safe_load((REPO / "workflows" / "config.yaml").read_text())
    overrides = json.loads(args.set)
    cfg = {**config["train"], "ckpt_every": args.ckpt_every, "keep_ckpts": 2, **overrides}
    work = Path(tempfile.mkdtemp(prefix="ckpt-cost-", dir=args.work_dir))
    try:
        d = config["data"]
        subprocess.run(
            [sys.executable, str(SCRIPTS / "preprocess.py"), "--out-dir", str(work / "data")]
            + ["--num-docs", str(args.num_docs or d["num_docs"]), "--seed", str(d["seed"])],
            check=True,
            capture_output=True,
        )
        t0 = time.perf_counter()
        modes: dict[str, Any] = {}
        for mode in args.modes:
            run_dir = work / mode
            mode_cfg = {**cfg, "ckpt_async": MODES[mode]}
            t1 = time.perf_counter()
            if args.launches == 2:
                launch(work / "data", run_dir, {**mode_cfg, "stop_after": cfg["steps"] // 2}, args.nproc)
            launch(work / "data", run_dir, mode_cfg, args.nproc)
            records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
            newest = sorted((run_dir / "ckpt").glob("step_*"))[-1]
            size = sum(f.stat().st_size for f in newest.rglob("*") if f.is_file())
            modes[mode] = {"wall_s": round(time.perf_counter() - t1, 1), **summarize(records, size)}
        fs = subprocess.run(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "-T", str(work)], capture_output=True, text=True)
        result = {
            "what": "checkpoints: the stall per checkpoint, synchronous and asynchronous saves side by side, and the "
            "cost of verified checkpoints, for the example model (workflows/config.yaml train)"
            + (f", with {args.set}" if overrides else ""),
            "command": shlex.join(["python", "benchmarks/checkpoint_cost.py", *given]),
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "config": {k: cfg[k] for k in ("plugin", "n_layer", "d_model", "steps", "ckpt_every")},
            "ranks": args.nproc,
            "machine": {
                "cpus": os.cpu_count(),
                "gpu": gpu_name(),
                "python": platform.python_version(),
                "filesystem": " ".join(fs.stdout.split()),
                "load": [round(x, 2) for x in os.getloadavg()],
            },
            "wall_s": round(time.perf_counter() - t0, 1),
            "modes": modes,
            "manifest_hashing": hashing(newest, args.repeat),
        }
        if {"sync", "async"} <= set(modes):
            result["stall_ratio"] = round(modes["async"]["stall_s"]["mean"] / modes["sync"]["stall_s"]["mean"], 4)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
