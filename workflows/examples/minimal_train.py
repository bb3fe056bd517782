"""The training contract in one script: `multinode torchrun minimal_train.py CKPT STEPS` (docs/training-contract.md)."""

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def log(**record):  # rank 0: a metrics line or event, with its wall-clock time (the goodput ledger cuts time there)
    if dist.get_rank() == 0 and os.environ.get("MULTINODE_METRICS_FILE"):
        with open(os.environ["MULTINODE_METRICS_FILE"], "a") as f:
            print(json.dumps({**record, "wall": time.time()}), file=f, flush=True)


dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
ckpt, steps, stop = sys.argv[1], int(sys.argv[2]), torch.zeros(1)
signal.signal(signal.SIGUSR2, lambda *_: stop.fill_(1))  # only a flag: act at the next step boundary
model = DDP(torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = torch.load(ckpt) if os.path.exists(ckpt) else None  # resume: a requeue reruns this same command
if state:
    model.module.load_state_dict(state["model"]), opt.load_state_dict(state["opt"])
    log(event="resume", step=state["step"])
step = state["step"] if state else 0
while step < steps:
    loss = model(torch.randn(32, 16)).pow(2).mean()
    opt.zero_grad(), loss.backward(), opt.step(), time.sleep(0.05)  # a step's work
    step, flag = step + 1, stop.clone()
    dist.all_reduce(flag, dist.ReduceOp.MAX)  # every rank stops at the same step
    log(step=step, steps=steps, loss=loss.item(), time=time.time())
    if dist.get_rank() == 0 and (flag.item() or step == steps):
        log(event="checkpoint_begin", step=step)
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)  # never a half-written checkpoint
        log(event="checkpoint_end", step=step)
        if flag.item() and os.environ.get("MULTINODE_PREEMPT_FILE"):
            print(step, file=open(os.environ["MULTINODE_PREEMPT_FILE"], "w"), flush=True)
    if flag.item():
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # a second signal must not kill the exit (Python drops handlers)
        break  # exit 0: the job script requeues the job and its rerun resumes
dist.barrier()
dist.destroy_process_group()
