"""Reads what benchmarks/gpu/slurm_on_device.sh left behind and prints one JSON object: each part's numbers and every
check of the whole path on the lent GPU (results-first-job-*.json; docs/first-job.md cites it).

    python benchmarks/gpu/first_job_checks.py --work /tmp/first-job --log $OUT/first-job.log

Standard library only. Throughput numbers are medians over the metrics lines (each covers --log-every steps between
two synchronised points: the training reads a flag from the GPU every step), the first line of each run left out
(compilation, warm-up); an interval that holds a checkpoint's save is in the median as it is.
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

BATCH_ROWS = 8192  # slurm_on_device.sh's --batch, one rank: a step's rows


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def steps(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in recs if "event" not in r]


def events(recs: list[dict[str, Any]], name: str) -> list[int]:
    return [r["step"] for r in recs if r.get("event") == name]


def throughput(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median tokens/s, step time and MFU over a run's step lines, its first line left out."""
    lines = steps(recs)[1:]
    if not lines:
        return {}
    tps = statistics.median(r["tokens_per_s"] for r in lines)
    mfus = [r["mfu"] for r in lines if r.get("mfu") is not None]
    return {
        "intervals": len(lines),
        "tokens_per_s_median": round(tps),
        "step_ms_median": round(1000 * BATCH_ROWS / tps, 2),
        "mfu_median": round(statistics.median(mfus), 4) if mfus else None,
        "mfu_max": round(max(mfus), 4) if mfus else None,
    }


def exit_code(log: str, label: str) -> int | None:
    m = re.search(rf"^{re.escape(label)} exit (\d+)", log, re.M)
    return int(m[1]) if m else None


def plain(work: Path, log: str) -> dict[str, Any]:
    recs = records(work / "plain" / "metrics.jsonl")
    return {
        "exit": exit_code(log, "plain torchrun"),
        "last_step": steps(recs)[-1]["step"] if steps(recs) else None,
        "checkpoints": events(recs, "checkpoint_end"),
        **throughput(recs),
    }


def local(work: Path, log: str) -> dict[str, Any]:
    files = sorted(glob.glob(str(work / "local" / ".snakemake/multinode/torchrun/*.metrics.jsonl")))
    first, second = (records(Path(f)) for f in (files + ["", ""])[:2])
    profile = re.search(r"^\[multinode torchrun\] profile (\S+): (.*)$", log, re.M)
    preempted = re.search(r"^\[multinode torchrun\] the training checkpointed on the signal \(step (\d+)", log, re.M)
    return {
        "runs": len(files),
        "exit_signalled": exit_code(log, "local run 1"),
        "exit_rerun": exit_code(log, "local run 2"),
        "profile": profile[1] if profile else None,
        "nccl_socket_ifname": (re.search(r"NCCL_SOCKET_IFNAME=(\S+)", profile[2])[1] if profile else None),
        "checkpointed_on_signal_at": int(preempted[1]) if preempted else None,
        "checkpoints_first_run": events(first, "checkpoint_end"),
        "resumed_at": (events(second, "resume") or [None])[0],
        "last_step": steps(second)[-1]["step"] if steps(second) else None,
        **throughput(first),
    }


def gpu_samples(path: Path | None, after: float | None) -> dict[str, Any]:
    """nvidia-smi's CSV (timestamp, index, utilization %, memory used MiB, memory total MiB), per line."""
    if path is None:
        return {"lines": 0}
    rows = [[c.strip() for c in line.split(",")] for line in path.read_text().splitlines() if line.strip()]
    from datetime import datetime

    def epoch(stamp: str) -> float:
        return datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()

    return {
        "file": path.name,
        "lines": len(rows),
        "gpu_indexes": sorted({r[1] for r in rows}),
        "max_utilization_pct": max(int(r[2]) for r in rows),
        "max_memory_used_mib": max(int(r[3]) for r in rows),
        "memory_total_mib": int(rows[0][4]),
        "lines_after_signal": sum(1 for r in rows if after is not None and epoch(r[0]) > after),
    }


def slurm(work: Path, log: str) -> dict[str, Any]:
    folder = next(iter(glob.glob(str(work / "wf/.snakemake/multinode/logs/rule_train/*/"))), None)
    base = Path(folder) if folder else work
    first_log = next(iter(sorted(base.glob("*.attempt1.log"))), None)
    restart_log = next(iter(sorted(base.glob("*.attempt1.restart1.log"))), None)
    job_text = "".join(p.read_text(errors="replace") for p in (first_log, restart_log) if p)
    recs = records(next(iter(sorted(base.glob("*.attempt1.metrics.jsonl"))), base / "none"))
    smk = (work / "snakemake.log").read_text(errors="replace") if (work / "snakemake.log").exists() else ""
    signalled = re.search(r"^scancel --signal=USR2 (\d+) at ([\d.]+)", log, re.M)
    cvd = re.search(r"^job step: CUDA_VISIBLE_DEVICES=(\S*) SLURM_GPUS_ON_NODE=(\S*)", job_text, re.M)
    srun_cvd = re.search(r"^srun --gres=gpu:1: CUDA_VISIBLE_DEVICES=(\S*)", log, re.M)
    node_check = re.findall(r"\[multinode node-check\] \S+ (?:ok|FAILED).*", job_text)
    nccl = re.search(r"NCCL INFO .*(?:cudaDev|busId).*", job_text)
    progress = re.findall(r"^.*\bstep \d+/\d+ .*$", smk, re.M)
    mfus = [float(m) for line in progress for m in re.findall(r"mfu ([\d.]+)%", line)]
    launcher = re.search(r"\[multinode torchrun\] job \d+: .*", job_text)
    samples_file = next(iter(sorted(base.glob("*.gpu.csv"))), None)
    return {
        "check_exit": exit_code(log, "multinode check"),
        "preview_exit": exit_code(log, "multinode preview"),
        "snakemake_exit": exit_code(log, "snakemake"),
        "srun_gres_cuda_visible_devices": srun_cvd[1] if srun_cvd else None,
        "job_cuda_visible_devices": cvd[1] if cvd else None,
        "job_slurm_gpus_on_node": cvd[2] if cvd else None,
        "launcher_line": launcher[0] if launcher else None,
        "node_check_lines": node_check,
        "nccl_line": nccl[0].strip() if nccl else None,
        "signalled_job": int(signalled[1]) if signalled else None,
        "requeued": "[multinode] requeued" in job_text,
        "checkpointed_line": next(iter(re.findall(r"\[multinode\] checkpointed.*", job_text)), None),
        "resumed_at": (events(recs, "resume") or [None])[0],
        "checkpoints": events(recs, "checkpoint_end"),
        "last_step": steps(recs)[-1]["step"] if steps(recs) else None,
        "progress_lines": len(progress),
        "progress_last": progress[-1].strip() if progress else None,
        "progress_mfu_pct_max": max(mfus) if mfus else None,
        "gpu_samples": gpu_samples(samples_file, float(signalled[2]) if signalled else None),
        **throughput(recs),
    }


def linuxproc_dataloader(work: Path, log: str) -> dict[str, Any]:
    """Part 4: per mode (plain; ignore: the workers ignore USR2; block: the rank blocks it), the exit, and what the
    training found after the signal (every worker alive?) or the DataLoader's complaint that a worker was killed."""
    out = {}
    for mode in ("plain", "ignore", "block"):
        recs = records(work / "dl" / f"metrics-{mode}.jsonl")
        signalled = [r for r in recs if r.get("event") == "signalled"]
        part = re.search(rf"(?s)^dataloader {mode}: scancel(.*?)^dataloader {mode} exit", log, re.M)
        killed = re.search(r"DataLoader worker \(pid[^)]*\) is killed by signal[^.\n]*", part[1]) if part else None
        out[mode] = {
            "exit": exit_code(log, f"dataloader {mode}"),
            "workers_alive_after_signal": signalled[0]["alive"] if signalled else None,
            "worker_killed": killed[0] if killed else None,
        }
    return out


def checks(result: dict[str, Any]) -> dict[str, bool]:
    p, loc, s = result["plain_torchrun"], result["local_multinode_torchrun"], result["slurm_snakemake"]
    return {
        "plain: exit 0, every step, periodic checkpoints, an mfu": p.get("exit") == 0
        and p.get("last_step") is not None
        and len(p.get("checkpoints", [])) >= 2
        and bool(p.get("mfu_median")),
        "local: the profile's NCCL block, exit 85 on the signal, the rerun resumes and finishes": loc.get(
            "nccl_socket_ifname"
        )
        == "^lo,docker"
        and loc.get("exit_signalled") == 85
        and loc.get("exit_rerun") == 0
        and loc.get("resumed_at") is not None
        and loc.get("resumed_at") == loc.get("checkpointed_on_signal_at"),
        "slurm: check, preview and snakemake exit 0": s.get("check_exit") == 0
        and s.get("preview_exit") == 0
        and s.get("snakemake_exit") == 0,
        "slurm: CUDA_VISIBLE_DEVICES from the gres": s.get("job_cuda_visible_devices") not in (None, "")
        and s.get("srun_gres_cuda_visible_devices") not in (None, ""),
        "slurm: the node check passed against the real nvidia-smi": any(" ok " in x for x in s["node_check_lines"])
        and "GPU(s) visible" in " ".join(s["node_check_lines"]),
        "slurm: NCCL on the GPU": bool(s.get("nccl_line")),
        "slurm: GPU samples, busy, and on after the signal": s["gpu_samples"].get("lines", 0) > 0
        and s["gpu_samples"].get("max_utilization_pct", 0) > 0
        and s["gpu_samples"].get("lines_after_signal", 0) > 0,
        "slurm: progress lines with an MFU": bool(s.get("progress_mfu_pct_max")),
        "slurm: checkpointed on USR2, requeued, resumed at that step": s.get("requeued") is True
        and s.get("resumed_at") is not None
        and s.get("last_step") is not None
        and s["resumed_at"] < s["last_step"],
        "linuxproc: with USR2 blocked in the rank, its DataLoader workers survive SLURM's own signal": result[
            "linuxproc_dataloader"
        ]["block"]
        == {"exit": 0, "workers_alive_after_signal": {"spawn": [True], "forkserver": [True]}, "worker_killed": None},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="slurm_on_device.sh's WORK folder")
    ap.add_argument("--log", type=Path, required=True, help="its first-job.log")
    args = ap.parse_args(argv)
    log = args.log.read_text(errors="replace")
    env = re.search(r"^(NVIDIA [^,]+), (\d+) MiB, (\S+)$", log, re.M)
    py = re.search(r"^python (\S+) \S+ torch (\S+) cuda (\S+)$", log, re.M)
    result: dict[str, Any] = {
        "device": {"gpu": env[1], "memory_mib": int(env[2]), "driver": env[3]} if env else None,
        "python": py[1] if py else None,
        "torch": py[2] if py else None,
        "model": f"MLP 3 x Linear(8192, 8192) + Linear(8192, 1), bf16 autocast, {BATCH_ROWS} rows a step, SGD",
        "plain_torchrun": plain(args.work, log),
        "local_multinode_torchrun": local(args.work, log),
        "slurm_snakemake": slurm(args.work, log),
        "linuxproc_dataloader": linuxproc_dataloader(args.work, log),
    }
    result["checks"] = checks(result)
    result["ok"] = all(result["checks"].values())
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
