"""Rank 3 says why and fails; the others wait in a barrier that never completes."""

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} ready", flush=True)
if rank == 3:
    print("rank 3: the data shard is corrupt, giving up", flush=True)
    raise RuntimeError("corrupt shard")
dist.barrier()
