"""A training whose data comes through real DataLoaders with worker processes started by spawn and by forkserver
(tests/training/test_dataloader_usr2.py): on SIGUSR2 it sets a flag, and at the next step boundary it fetches one
more batch from each loader (its workers must still serve), checks that every worker is alive, checkpoints, writes
$MULTINODE_PREEMPT_FILE and exits 0. Rank 0's metrics file gets a `workers` event with the workers' pids once they
run, and a `signalled` event with what it found after the signal.

    multinode torchrun usr2_dataloader.py CKPT [--ignore-usr2-in-workers | --block-usr2]

For where SLURM itself signals every process of a step (proctrack/linuxproc; benchmarks/gpu/slurm_on_device.sh, part
4): --ignore-usr2-in-workers makes each worker ignore USR2 from its start (worker_init_fn); --block-usr2 blocks USR2
in the rank and takes it in a thread, as workflows/examples/minimal_train.py does, so that every process the rank
starts (workers, the forkserver, multiprocessing's resource tracker) starts with it blocked.
"""

import json
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Rows(Dataset):
    def __len__(self):
        return 10**6

    def __getitem__(self, i):
        return torch.full((4,), float(i % 7))


def take_usr2(stop):
    while True:
        signal.sigwait({signal.SIGUSR2})
        stop.fill_(1)


def ignore_usr2(_worker_id):  # module level: spawn and forkserver workers import it by name
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def log(**record):
    if dist.get_rank() == 0:
        with open(os.environ["MULTINODE_METRICS_FILE"], "a") as f:
            print(json.dumps({**record, "wall": time.time()}), file=f, flush=True)


def main():  # spawn and forkserver workers import this file again: nothing runs at import
    dist.init_process_group("gloo")
    stop = torch.zeros(1)
    signal.signal(signal.SIGUSR2, lambda *_: stop.fill_(1))
    if "--block-usr2" in sys.argv:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
        threading.Thread(target=take_usr2, args=(stop,), daemon=True).start()
    init = ignore_usr2 if "--ignore-usr2-in-workers" in sys.argv else None
    loaders = {
        ctx: iter(
            DataLoader(
                Rows(),
                batch_size=8,
                num_workers=1,
                multiprocessing_context=ctx,
                persistent_workers=True,
                worker_init_fn=init,
            )
        )
        for ctx in ("spawn", "forkserver")
    }
    model = torch.nn.Linear(4, 1)
    step = 0
    while True:
        batches = [next(it) for it in loaders.values()]
        loss = sum(model(b).pow(2).mean() for b in batches)
        loss.backward()
        step += 1
        if step == 1:
            log(event="workers", pids={ctx: [w.pid for w in it._workers] for ctx, it in loaders.items()})
        flag = stop.clone()
        dist.all_reduce(flag, dist.ReduceOp.MAX)
        if flag.item():
            for it in loaders.values():
                next(it)  # the workers still serve after the signal
            alive = {ctx: [w.is_alive() for w in it._workers] for ctx, it in loaders.items()}
            log(event="signalled", step=step, alive=alive)
            if dist.get_rank() == 0:
                torch.save({"model": model.state_dict(), "step": step}, sys.argv[1])
                print(step, file=open(os.environ["MULTINODE_PREEMPT_FILE"], "w"), flush=True)
            break
        time.sleep(0.05)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
