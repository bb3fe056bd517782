"""Small process helpers for the sandbox: commands that must succeed, pid files checked by name."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from .spec import ClusterError


def run(cmd: Sequence[str], what: str, log: Path | None = None, timeout: float = 60, **kw) -> str:
    """Run cmd; on failure raise ClusterError naming `what`, the output and the log to read."""
    try:
        if "input" not in kw:
            kw["stdin"] = subprocess.DEVNULL
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, **kw)
    except FileNotFoundError as err:
        raise ClusterError(f"{what}: {cmd[0]} not found") from err
    except subprocess.TimeoutExpired as err:
        raise ClusterError(f"{what}: timed out after {timeout:.0f} s" + _see(log)) from err
    if proc.returncode != 0:
        out = (proc.stderr or proc.stdout).strip()
        raise ClusterError(f"{what} failed (exit {proc.returncode}): {out}" + _see(log))
    return proc.stdout


def _see(log: Path | None) -> str:
    if log is None:
        return ""
    tail = ""
    if log.exists():
        lines = log.read_text(errors="replace").splitlines()[-15:]
        tail = "\n  " + "\n  ".join(lines)
    return f"\nsee {log}{tail}"


def start_detached(cmd: Sequence[str], what: str, env: Mapping[str, str] | None = None) -> None:
    """Start a daemon in its own session with no inherited stdio (slurmdbd keeps a pipe open forever)."""
    try:
        subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
    except FileNotFoundError as err:
        raise ClusterError(f"{what}: {cmd[0]} not found") from err


def wait_for(check, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def pid_from(pidfile: Path, names: Iterable[str]) -> int | None:
    """The pid in pidfile if that process is alive and has one of these names; stale files are removed."""
    try:
        pid = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    name = comm(pid)
    if not name:
        pidfile.unlink(missing_ok=True)
        return None
    if any(name.startswith(n[:15]) for n in names):
        return pid
    return None  # pid reused by an unrelated process: leave it alone


def stop(pids: Sequence[int], grace: float = 10.0) -> None:
    """SIGTERM all at once (each slurm daemon takes ~2 s to exit), SIGKILL what is left after grace; return once each
    is gone from the process table. The daemons are init's children (they daemonized): a dead one stays a zombie
    until init reaps it (about a second here), and `pgrep` still lists it, so its exit alone is not "gone"."""
    started = {pid: _start_time(pid) for pid in pids}
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    if not wait_for(lambda: not any(_alive(p) for p in pids), grace):
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        wait_for(lambda: not any(_alive(p) for p in pids), 5)
    wait_for(lambda: all(_start_time(p) != started[p] for p in pids), REAP_WAIT_S)


REAP_WAIT_S = 10.0  # how long `down` waits for init to reap the daemons it stopped


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/<pid>/stat): None once it is reaped, another value if its pid was
    given to a new process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is gone for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
