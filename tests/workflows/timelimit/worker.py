"""Stands in for training without computing anything: it waits (sleeping) for SIGUSR2 and only then finishes.

First run: install a USR2 handler, write results/ckpt/ready<rank>, wait. On the signal every rank "checkpoints"
(ckpt/rank<rank>.json: the signal and the restart it came in), rank 0 writes $MULTINODE_PREEMPT_FILE, all exit 0.
No signal, no exit: the job runs into its time limit (TIMEOUT).
Requeued run (the checkpoint exists): print "resumed from checkpoint ...", rank 0 writes the output, exit 0.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

out, ckpt_dir = Path(sys.argv[1]), Path(sys.argv[2])
rank = int(os.environ["RANK"])
restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
ckpt = ckpt_dir / f"rank{rank}.json"

if ckpt.exists():
    saved = json.loads(ckpt.read_text())
    print(
        f"worker rank {rank}: resumed from checkpoint {ckpt} ({saved['signal']} at restart {saved['restart']})",
        flush=True,
    )
    if rank == 0:  # every rank checkpointed before the first run ended
        saved_all = {p.stem: json.loads(p.read_text()) for p in sorted(ckpt_dir.glob("rank*.json"))}
        out.write_text(json.dumps({"restart": restart, "checkpoints": saved_all}) + "\n")
    sys.exit(0)

got: list[int] = []
signal.signal(signal.SIGUSR2, lambda signum, _frame: got.append(signum))
ckpt_dir.mkdir(parents=True, exist_ok=True)
(ckpt_dir / f"ready{rank}").write_text(f"{os.getpid()}\n")  # the handler is installed
while not got:
    time.sleep(0.5)  # idle: a handler runs between sleeps; nothing here finishes on its own

tmp = ckpt.with_suffix(".tmp")
tmp.write_text(json.dumps({"signal": signal.Signals(got[0]).name, "restart": restart, "rank": rank}))
os.replace(tmp, ckpt)
print(f"worker rank {rank}: got {signal.Signals(got[0]).name} at restart {restart}, checkpointed", flush=True)
if rank == 0:
    Path(os.environ["MULTINODE_PREEMPT_FILE"]).write_text("checkpoint\n")
sys.exit(0)
