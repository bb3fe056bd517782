"""The training contract in one script (docs/training-contract.md):

multinode torchrun minimal_train.py CKPT STEPS [--ckpt-every N] [--width W] [--batch B] [--log-every K]
"""

import argparse
import json
import os
import signal
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense bf16 FLOP/s of one GPU: the mfu's divisor

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("ckpt", help="the checkpoint file (keep it on the shared file system, outside the rule's outputs)")
p.add_argument("steps", type=int, help="optimizer steps in all")
p.add_argument("--ckpt-every", type=int, default=100, help="steps between periodic checkpoints (0: none)")
p.add_argument("--width", type=int, default=16, help="the MLP's width (4096 or more gives a GPU work)")
p.add_argument("--batch", type=int, default=32, help="rows (tokens) per rank and step")
p.add_argument("--log-every", type=int, default=1, help="steps between metrics lines")
p.add_argument("--sleep", type=float, default=0.0, help="seconds of pretended work per step (to try the signal)")
args = p.parse_args()

cuda = torch.cuda.is_available()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)  # before the process group: each rank's NCCL communicator on its own GPU
dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
rank, world = dist.get_rank(), dist.get_world_size()
stop = torch.zeros(1)


def take_usr2():  # USR2 is blocked (below): this thread takes it
    while True:
        signal.sigwait({signal.SIGUSR2})
        stop.fill_(1)  # only a flag: act at the next step boundary


# SIGUSR2 (the signal before the time limit) sets the flag. Blocked rather than handled, so that every process this
# one starts (DataLoader workers, their forkserver, ...) starts with it blocked: where SLURM signals every process of
# the step (proctrack/linuxproc) its default action would kill them, and the training with them.
signal.signal(signal.SIGUSR2, lambda *_: stop.fill_(1))  # a thread started before the block may still get it
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
threading.Thread(target=take_usr2, daemon=True).start()


def log(**record):  # rank 0: a metrics line or event, with its wall-clock time (the goodput ledger cuts time there)
    if rank == 0 and os.environ.get("MULTINODE_METRICS_FILE"):
        with open(os.environ["MULTINODE_METRICS_FILE"], "a") as f:
            print(json.dumps({**record, "wall": time.time()}), file=f, flush=True)


def save(step):  # rank 0 writes a temporary file and renames it: never a half-written checkpoint
    log(event="checkpoint_begin", step=step)
    state = {"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}
    torch.save(state, args.ckpt + ".tmp")
    os.replace(args.ckpt + ".tmp", args.ckpt)
    log(event="checkpoint_end", step=step)


w = args.width
layers = [m for _ in range(3) for m in (torch.nn.Linear(w, w), torch.nn.ReLU())] + [torch.nn.Linear(w, 1)]
model = DDP(torch.nn.Sequential(*layers).to(device))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
params = sum(q.numel() for q in model.parameters())
peak = next((v for k, v in PEAK_BF16.items() if cuda and k in torch.cuda.get_device_name()), None)
state = torch.load(args.ckpt, map_location=device) if os.path.exists(args.ckpt) else None  # resume: a rerun
if state:
    model.module.load_state_dict(state["model"]), opt.load_state_dict(state["opt"])
    log(event="resume", step=state["step"])
step = state["step"] if state else 0
t_last, step_last = time.time(), step
while step < args.steps:
    x = torch.randn(args.batch, w, device=device)
    with torch.autocast(device.type, torch.bfloat16, enabled=cuda):
        loss = model(x).float().pow(2).mean()
    opt.zero_grad(), loss.backward(), opt.step(), time.sleep(args.sleep)
    step, flag = step + 1, stop.to(device)
    dist.all_reduce(flag, dist.ReduceOp.MAX)  # every rank stops at the same step
    stopping = flag.item() > 0
    if step % args.log_every == 0 or stopping or step == args.steps:
        now = time.time()
        tokens_per_s = args.batch * world * (step - step_last) / (now - t_last)
        mfu = 6 * params * tokens_per_s / (peak * world) if peak else None  # 6 FLOPs per weight per row
        log(step=step, steps=args.steps, loss=loss.item(), tokens_per_s=tokens_per_s, mfu=mfu, time=now)
        t_last, step_last = now, step
    if rank == 0 and (stopping or step == args.steps or (args.ckpt_every and step % args.ckpt_every == 0)):
        save(step)
        if stopping and os.environ.get("MULTINODE_PREEMPT_FILE"):
            print(step, file=open(os.environ["MULTINODE_PREEMPT_FILE"], "w"), flush=True)
    if stopping:
        break  # exit 0: the job script requeues the job and its rerun resumes
dist.barrier()
dist.destroy_process_group()
