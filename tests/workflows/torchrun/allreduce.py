"""A gloo all_reduce across every rank; rank 0 writes what each rank saw as JSON."""

import json
import os
import socket
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
seen = {
    "rank": rank,
    "host": socket.gethostname(),
    "node_rank": int(os.environ["GROUP_RANK"]),
    "local_rank": int(os.environ["LOCAL_RANK"]),
    "omp": os.environ.get("OMP_NUM_THREADS"),
}
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
gathered = [None] * world
dist.all_gather_object(gathered, seen)
if rank == 0:
    with open(sys.argv[1], "w") as fh:
        json.dump({"world_size": world, "sum": total.item(), "ranks": gathered}, fh)
dist.destroy_process_group()
