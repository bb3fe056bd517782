"""Stands in for training: on SIGUSR2 it 'checkpoints', tells the launcher through MULTINODE_PREEMPT_FILE and
exits 0; a rerun (SLURM_RESTART_COUNT >= 1) finds the checkpoint and finishes."""

import os
import signal
import sys
import time
from pathlib import Path

out, ckpt = Path(sys.argv[1]), Path(sys.argv[2])
rank = int(os.environ["RANK"])
if ckpt.exists():
    if rank == 0:
        out.write_text(f"resumed from {ckpt.read_text()} restart={os.environ.get('SLURM_RESTART_COUNT')}\n")
    sys.exit(0)
got = []
signal.signal(signal.SIGUSR2, lambda *_: got.append(1))
Path(f"{ckpt}.ready{rank}").write_text("")
deadline = time.time() + 120
while not got and time.time() < deadline:
    time.sleep(0.1)
if not got:
    sys.exit(7)
if rank == 0:
    ckpt.write_text("step-42")
    Path(os.environ["MULTINODE_PREEMPT_FILE"]).write_text("42\n")
sys.exit(0)
