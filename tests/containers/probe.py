"""Run by each rank inside the container: says where it runs (the image's marker), after a gloo all-reduce.

probe.py OUTPUT [--wait-usr2]    rank 0 writes every rank's report to OUTPUT (JSON); with --wait-usr2 each
                                 rank first waits (at most 300 s) for SLURM's SIGUSR2, as a training does to
                                 checkpoint, and reports whether it came
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import torch
import torch.distributed as dist


def image_id() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("ID="):
            return line.split("=", 1)[1].strip('"')
    return "?"


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    report = {
        "rank": rank,
        "world": world,
        "node": os.environ.get("SLURMD_NODENAME", socket.gethostname()),
        "image": image_id(),
        "marker": Path("/multinode-probe").exists(),
        "pid1": Path("/proc/1/cmdline").read_bytes().split(b"\0")[0].decode(),
        "sum": total.item(),
        "uid": os.getuid(),
    }
    if "--wait-usr2" in sys.argv:
        got = threading.Event()
        signal.signal(signal.SIGUSR2, lambda *_: got.set())
        print(f"WAITING rank {rank}", flush=True)
        report["usr2"] = got.wait(300)
    print(f"PROBE {json.dumps(report, sort_keys=True)}", flush=True)
    reports: list[dict | None] = [None] * world
    dist.all_gather_object(reports, report)
    if rank == 0:
        Path(sys.argv[1]).parent.mkdir(parents=True, exist_ok=True)
        Path(sys.argv[1]).write_text(json.dumps(reports, sort_keys=True))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
