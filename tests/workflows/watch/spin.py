"""Spin on one CPU until this process has used the given CPU-seconds; print the CPU-seconds it used and the
wall-clock seconds that took (their ratio: the share of a core the host gave it)."""

import sys
import time

target = float(sys.argv[1])
start = time.monotonic()
while time.process_time() < target:
    pass
print(f"{time.process_time():.3f} {time.monotonic() - start:.3f}")
