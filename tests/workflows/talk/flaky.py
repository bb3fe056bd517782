"""Every worker prints 50 numbered lines per round; the first rank 3 to claim `failed-once` then fails. torchrun
(--rdzv_backend=c10d --max-restarts=1) restarts every worker (a node whose own workers did not fail may restart them
for the membership change, under the same attempt number), and the second round completes. Each worker also writes
its lines to truth/<node>-<pid>.txt itself: what the labelled logs must hold, line for line."""

import os
import socket
import sys

import torch.distributed as dist

LINES = 50
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
worker = f"{socket.gethostname()}-{os.getpid()}"
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
os.makedirs("truth", exist_ok=True)
with open(f"truth/{worker}.txt", "w") as truth:
    for i in range(LINES):
        line = f"FLAKY rank={rank} worker={worker} attempt={attempt} world={world} line={i}"
        print(line, flush=True)  # first the log, then the truth: a worker stopped in between leaves no false gap
        truth.write(line + "\n")
        truth.flush()
if rank == 3:
    try:
        os.close(os.open("failed-once", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        sys.exit("rank 3 fails once")
    except FileExistsError:
        pass
dist.barrier()
dist.destroy_process_group()
print(f"FLAKY-DONE rank={rank} worker={worker}", flush=True)
