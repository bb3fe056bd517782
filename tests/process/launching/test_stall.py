"""The progress watchdog's parts without a cluster: what counts as progress, the workers it asks for stacks, and
the verdict that names the rank whose stack differs (the whole on the real cluster: tests/cluster/
test_stall_cluster.py).

Here the tests that start processes (the process tier); the others: tests/unit/launching/test_stall.py."""

from __future__ import annotations

import os

from snakemake_executor_multinode.launching import stall


def test_without_py_spy_the_stack_says_so(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert stall.dump(os.getpid()) == ["no stack: py-spy is not installed on this node (pip install py-spy)"]


def test_py_spy_dumps_a_live_python_process():
    import subprocess
    import sys

    code = "import time\nprint('looping', flush=True)\nwhile True: time.sleep(0.1)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "looping\n"  # in its loop, past start-up
        lines = stall.dump(child.pid)
    finally:
        child.kill()
        child.wait()
    assert any("<module> (<string>:3)" in line for line in lines), lines
