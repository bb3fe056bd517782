"""Rank 3 fails on its first attempt; torchrun (--rdzv_backend=c10d --max-restarts=1) restarts every worker, and the
second attempt completes."""

import os
import sys

import torch.distributed as dist

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"FLAKY rank={rank} attempt={attempt} world={dist.get_world_size()}", flush=True)
if rank == 3 and attempt == 0:
    sys.exit("rank 3 fails on its first attempt")
dist.barrier()
dist.destroy_process_group()
print(f"FLAKY-DONE rank={rank} attempt={attempt}", flush=True)
