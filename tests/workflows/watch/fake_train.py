"""A stand-in training: three metrics lines where the executor's convention puts them ($MULTINODE_METRICS_FILE),
then it waits until the file named by its argument exists, and writes the last line."""

import json
import os
import sys
import time
from pathlib import Path

STEPS = 10
metrics = Path(os.environ["MULTINODE_METRICS_FILE"])


def line(step: int) -> str:
    # 10 s per step at 184k tokens/s
    record = {"step": step, "steps": STEPS, "loss": 5.0 - step / 10, "tokens": 1840000 * step, "tokens_per_s": 184000.0}
    return json.dumps(record) + "\n"


with metrics.open("a") as fh:
    fh.writelines(line(step) for step in (1, 2, 3))
while not Path(sys.argv[1]).exists():
    time.sleep(0.2)
with metrics.open("a") as fh:
    fh.write(line(STEPS))
