"""A deadlock as real trainings have them: ranks 0-2 wait in a collective that rank 3 never joins (it sleeps, as a
data loader that waits forever would). Every rank "checkpoints" (ckpt/rank<R>), writes its pid (so the test can tell
that none is left) and one line; after that, nothing: no line, no metrics. gloo's own collective timeout (30 min)
would come much later. A requeued run (on_stall: requeue) finds the checkpoints: every rank resumes and finishes."""

import os
import sys
import time
from pathlib import Path

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
ckpt = Path(f"ckpt/rank{rank}")
if restart > 0 and ckpt.exists():
    print(f"rank {rank}: resumed from {ckpt.read_text().strip()} at restart {restart}", flush=True)
    dist.barrier()
    sys.exit(0)
ckpt.parent.mkdir(exist_ok=True)
ckpt.write_text(f"the checkpoint of rank {rank}\n")
Path("pids").mkdir(exist_ok=True)
Path(f"pids/{rank}").write_text(f"{os.getpid()}\n")
if rank == 3:
    print("rank 3: waiting for a batch that never comes", flush=True)
    time.sleep(3600)  # the blocking line
    sys.exit(1)
print(f"rank {rank}: entering the barrier", flush=True)
dist.barrier()
