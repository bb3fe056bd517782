"""Every rank prints at once, in pieces (text, then a long run of x, then the end, each a separate write), on
stdout and stderr: the job log must still hold each line whole, once, labelled with the rank that wrote it."""

import sys

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()  # all ranks start printing together
for i in range(120):
    sys.stdout.write(f"TALK rank={rank} line={i} ")
    sys.stdout.write("x" * (i * 50))  # up to ~6 KB: far beyond srun's message size
    sys.stdout.write(" END\n")
    if i % 20 == 0:
        sys.stderr.write(f"TALK-ERR rank={rank} line={i}\n")
dist.barrier()
dist.destroy_process_group()
