"""Each rank says BEFORE, waits for the file named by its argument, then says AFTER (no process group: the lines and
their labels are what is tested)."""

import os
import sys
import time
from pathlib import Path

rank = os.environ["RANK"]
print(f"BEFORE rank={rank}", flush=True)
while not Path(sys.argv[1]).exists():
    time.sleep(0.2)
print(f"AFTER rank={rank}", flush=True)
