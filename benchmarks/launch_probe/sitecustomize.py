"""Benchmark probe (benchmarks/launch.py puts this folder on PYTHONPATH): every Python process of a benchmark job
that is a torchrun agent, a benchmark worker or a launcher appends one line to $MN_BENCH_STAMPS when it starts:

    <now> <kind> <host> <pid> <process start>

`process start` is the kernel's start time of the process (/proc/self/stat), which `exec` keeps: for a torchrun
agent that is the moment its step task was forked on the node (the `bash -c ... exec` wrapper), i.e. when the
launcher's fan-out reached that node. Outside a benchmark job (no $MN_BENCH_STAMPS) it does nothing.
"""

import os

if os.environ.get("MN_BENCH_STAMPS"):
    import socket
    import time

    def _started() -> float:
        with open("/proc/self/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return time.time() - age

    def _kind() -> str | None:
        with open("/proc/self/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
        if b"torch.distributed.run" in argv:
            return "agent"
        if b"torchrun" in argv or b"per-node-torchrun" in argv:  # before "worker": the script is an argument
            return "launcher"
        if any(a.endswith(b"launch_worker.py") for a in argv):
            return "worker"
        return None

    _k = _kind()
    if _k:
        _line = f"{time.time():.6f} {_k} {socket.gethostname()} {os.getpid()} {_started():.3f}\n"
        _fd = os.open(os.environ["MN_BENCH_STAMPS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(_fd, _line.encode())
        os.close(_fd)
