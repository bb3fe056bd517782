"""Benchmark worker for benchmarks/launch.py: stamps when torch is imported and when init_process_group returns.

    launch_worker.py ok     every rank: import torch, init_process_group (gloo), done
    launch_worker.py fail   the last node's local rank 0 dies (exit 3) once every other rank is blocked in a wait
                            that never completes and never notices the death: a C++ TCPStore wait on the
                            rendezvous store (node 0), as a NCCL collective hangs until its timeout. (A gloo
                            collective would notice by itself: the dead peer's sockets close within 50 ms.)
    launch_worker.py fail-term   the same, but the blocked ranks handle SIGTERM (as trainings that save on
                            SIGTERM do) and stay blocked in a wait that notices nothing, not even the rendezvous
                            store going away: only SIGKILL ends them (a NCCL collective with a handler that sets a
                            flag the hung loop never reads)
Stamp lines: "<time> <kind> <host> <pid> <global rank>" appended to $MN_BENCH_STAMPS.
"""

import os
import signal
import socket
import sys
import time
from datetime import timedelta

STAMPS = os.environ["MN_BENCH_STAMPS"]
RANK = int(os.environ["RANK"])


def stamp(kind: str) -> None:
    fd = os.open(STAMPS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{time.time():.6f} {kind} {socket.gethostname()} {os.getpid()} {RANK}\n".encode())
    os.close(fd)


import torch.distributed as dist  # noqa: E402  (the import is what is being timed)

stamp("imported")
dist.init_process_group("gloo")
stamp("init")
if sys.argv[1].startswith("fail"):
    world = dist.get_world_size()
    last_node = int(os.environ["GROUP_WORLD_SIZE"]) - 1
    if int(os.environ["GROUP_RANK"]) == last_node and int(os.environ["LOCAL_RANK"]) == 0:
        # die only once every other rank blocks
        while sum(" blocking " in line for line in open(STAMPS)) < world - 1:
            time.sleep(0.05)
        stamp("dying")
        os._exit(3)
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(hours=1)
    )
    if sys.argv[1] == "fail-term":
        signal.signal(signal.SIGTERM, lambda _sig, _frame: stamp("sigterm-handled"))
        stamp("blocking")
        while True:
            time.sleep(3600)
    stamp("blocking")
    store.wait(["mn-bench-never-set"])
dist.destroy_process_group()
