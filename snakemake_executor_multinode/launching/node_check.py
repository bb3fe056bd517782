"""The node check: every node of the job proves itself before each launch (and relaunch) of the training.

Set by the environment profile's `node_check` key ($MULTINODE_NODE_CHECK, _COMMAND, _TIMEOUT; unset: on, GPUs only):
where `nvidia-smi` exists, `nvidia-smi -L` must list at least the GPUs SLURM granted the node; then the site's own
command (a DCGM diagnostic, a dmesg scan for Xid errors, ...) runs under `bash -c` and must exit 0. The whole check of
one node has the profile's limit (120 s by default).

The launcher (launcher.py) runs it as one short srun step over every usable node of the job, training nodes and
spares alike, one task per node, none killed when another fails (so that every node reports):
    python -m snakemake_executor_multinode.launching.node_check --gpus G
Each node prints its command's output, prefixed, then ONE result line, `[multinode node-check] NODE ok (...)` or
`[multinode node-check] NODE FAILED: why`; the step's output goes to the job log. A node without an ok line (failed,
timed out, unreachable) is bad: the launcher drops it before the training starts there (spares.Roster.exclude).
"""

from __future__ import annotations

import argparse
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from snakemake_executor_multinode.contract import protocol

PREFIX = "[multinode node-check]"
MODULE = "snakemake_executor_multinode.launching.node_check"
STEP_NAME = "node-check"  # the check step's --job-name
OK = re.compile(rf"^{re.escape(PREFIX)} (?P<node>\S+) ok\b")
FAILED = re.compile(rf"^{re.escape(PREFIX)} (?P<node>\S+) FAILED: (?P<why>.*?)\s*$")
OUTPUT_LINES = 200  # of the site command's output, per node, kept in the job log (a DCGM diagnostic prints ~60)
# The launcher waits this long beyond the nodes' own limit for srun: the step's start and end, and a node that
# never answers (its slurmd gone) must not hold the launch longer than that.
STEP_GRACE_S = 30
STOP_WAIT_S = 5  # after the launcher's SIGTERM to a late check step, before its SIGKILL
OFF = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Settings:
    """The check the job script exported from the profile (protocol.NODE_CHECK_*)."""

    on: bool = True
    command: str = ""
    timeout: int = protocol.NODE_CHECK_DEFAULT_S


def settings(env: Mapping[str, str]) -> Settings:
    """The check from the environment; unset is the default check (the profile's absent key, a hand-written script)."""
    on = env.get(protocol.NODE_CHECK_VAR, "1").strip().lower() not in OFF
    raw = env.get(protocol.NODE_CHECK_TIMEOUT_VAR, "").strip() or str(protocol.NODE_CHECK_DEFAULT_S)
    if not raw.isdigit() or int(raw) < 1:
        raise SystemExit(
            f"multinode torchrun: {protocol.NODE_CHECK_TIMEOUT_VAR}={raw!r}: must be the node check's limit in "
            "seconds (a positive integer)"
        )
    return Settings(on=on, command=env.get(protocol.NODE_CHECK_COMMAND_VAR, "").strip(), timeout=int(raw))


# --- one node's side --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """One node's verdict: "" when it passed, else why not; the site command's output lines."""

    why: str = ""
    output: tuple[str, ...] = ()
    gpus_seen: int | None = None  # None: not counted (no GPUs granted, or no nvidia-smi on the node)


def granted_gpus(env: Mapping[str, str], allocation_gpus: int) -> int:
    """The GPUs SLURM granted this node: SLURM_GPUS_ON_NODE, else CUDA_VISIBLE_DEVICES's count, else the
    allocation's GPUs per node (the launcher's --gpus)."""
    on_node = env.get("SLURM_GPUS_ON_NODE", "")
    if on_node.isdigit():
        return int(on_node)
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    if visible and visible not in ("-1", "NoDevFiles"):
        return len([d for d in visible.split(",") if d])
    return allocation_gpus


def run_bounded(argv: Sequence[str], limit_s: float) -> tuple[int | None, list[str]]:
    """Runs `argv` (its stdout and stderr as one) for at most `limit_s`; (exit code, lines), the code None when the
    limit passed. In a session of its own, so that the whole process group goes at the limit: a child holding the
    pipe (a diagnostic's helper) would otherwise keep the check waiting past it."""
    proc = subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=max(limit_s, 0.01))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out.decode(errors="replace").splitlines()
    return proc.returncode, out.decode(errors="replace").splitlines()


def count_gpus(granted: int, limit_s: float, run: Callable[..., tuple[int | None, list[str]]] = run_bounded) -> Outcome:
    """`nvidia-smi -L` lists at least the `granted` GPUs (with cgroup device constraints it lists just those)."""
    code, lines = run(["nvidia-smi", "-L"], limit_s)
    if code is None:
        return Outcome(f"nvidia-smi -L did not answer within {limit_s:.0f} s", tuple(lines))
    if code != 0:
        first = next((line.strip() for line in lines if line.strip()), "(no message)")
        return Outcome(f"nvidia-smi -L failed (exit {code}): {first}", tuple(lines))
    seen = len([line for line in lines if line.startswith("GPU ")])
    if seen < granted:
        return Outcome(f"nvidia-smi -L lists {seen} GPU(s), SLURM granted {granted} on this node", tuple(lines), seen)
    return Outcome(gpus_seen=seen)


def check_this_node(
    env: Mapping[str, str],
    allocation_gpus: int,
    run: Callable[..., tuple[int | None, list[str]]] = run_bounded,
    which: Callable[[str], str | None] = shutil.which,
) -> Outcome:
    """This node's check: its GPUs, then the site's command, within the limit."""
    wanted = settings(env)
    deadline = time.monotonic() + wanted.timeout
    granted = granted_gpus(env, allocation_gpus)
    gpus = Outcome()
    if granted and which("nvidia-smi"):
        gpus = count_gpus(granted, wanted.timeout, run)
        if gpus.why:
            return gpus
    if not wanted.command:
        return gpus
    left = deadline - time.monotonic()
    code, lines = run(["bash", "-c", wanted.command], left)
    if code is None:
        return Outcome(f"its command did not end within {wanted.timeout} s", tuple(lines), gpus.gpus_seen)
    if code != 0:
        # the command itself is in the job script's environment section: its output, above, says more
        return Outcome(f"its command exited with {code}", tuple(lines), gpus.gpus_seen)
    return Outcome("", tuple(lines), gpus.gpus_seen)


def report(node: str, outcome: Outcome, seconds: float) -> list[str]:
    """The node's lines for the job log: the command's output (the last OUTPUT_LINES), then the one result line."""
    output = list(outcome.output)
    cut = len(output) - OUTPUT_LINES
    lines = [f"{PREFIX} {node}| ({cut} earlier line(s) left out)"] if cut > 0 else []
    lines += [f"{PREFIX} {node}| {line}" for line in output[-OUTPUT_LINES:]]
    if outcome.why:
        return [*lines, f"{PREFIX} {node} FAILED: {outcome.why}"]
    seen = "" if outcome.gpus_seen is None else f", {outcome.gpus_seen} GPU(s) visible"
    return [*lines, f"{PREFIX} {node} ok ({seconds:.1f} s{seen})"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=0, help="the allocation's GPUs per node (when SLURM says none)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    started = time.monotonic()
    outcome = check_this_node(os.environ, args.gpus)
    print("\n".join(report(node, outcome, time.monotonic() - started)), flush=True)
    return 1 if outcome.why else 0


# --- the launcher's side: one step over the nodes, the verdicts from its output ---------------------------------------
def wanted(check_settings: Settings, gpus_per_node: int, which: Callable[[str], str | None] = shutil.which) -> bool:
    """Whether a check step is worth its srun (about a second per launch): the site's command, or GPUs to count.
    Whether the nodes have nvidia-smi is judged on this (head) node: the nodes of one job are alike."""
    gpus = gpus_per_node > 0 and which("nvidia-smi") is not None
    return check_settings.on and (bool(check_settings.command) or gpus)


def srun_command(nodes: Sequence[str], gpus_per_node: int, python: str = sys.executable) -> list[str]:
    """The check step: one task per node on exactly `nodes`. --kill-on-bad-exit=0: a failing node must not end the
    others' checks (each reports); --overlap: it never waits for, nor holds back, another step of the job (the GPU
    sampler's; a failed step a dead node still holds); it keeps the job's GPUs, as the training's step does."""
    n = len(nodes)
    return [
        "srun",
        f"--nodes={n}",
        f"--ntasks={n}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(nodes)}",
        "--cpus-per-task=1",
        "--mem=0",
        "--overlap",
        "--kill-on-bad-exit=0",
        "--export=ALL",
        f"--job-name={STEP_NAME}",
        python,
        "-m",
        MODULE,
        f"--gpus={gpus_per_node}",
    ]


@dataclass
class Verdicts:
    """What the check step's output said of each node."""

    nodes: tuple[str, ...]
    ok: set[str]
    failed: dict[str, str]  # node -> why, from its FAILED line

    def feed(self, line: str) -> None:
        if m := OK.match(line):
            self.ok.add(m["node"])
        elif m := FAILED.match(line):
            self.failed.setdefault(m["node"], m["why"])

    def bad(self, timed_out: bool, limit_s: float) -> dict[str, str]:
        """Every node without an ok line, in the job's order, and why. When no node said anything the step itself
        failed (srun could not start it): that blames no node."""
        if not self.ok and not self.failed:
            return {}
        silent = f"no result within {limit_s:.0f} s" if timed_out else "no result: its check never reported"
        return {n: self.failed.get(n, silent) for n in self.nodes if n not in self.ok}


def run_step(
    argv: Sequence[str], env: Mapping[str, str], nodes: Sequence[str], limit_s: float, out: Callable[[str], None]
) -> tuple[dict[str, str], int]:
    """Runs the check step, every line passed to `out` (the job log); (bad node -> why, srun's exit code)."""
    proc = subprocess.Popen(
        list(argv), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    assert proc.stdout is not None
    verdicts, partial, deadline = Verdicts(tuple(nodes), set(), {}), b"", time.monotonic() + limit_s
    fd, timed_out = proc.stdout.fileno(), False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        if not select.select([fd], [], [], min(left, 1.0))[0]:
            continue
        data = os.read(fd, 65536)
        if not data:
            break
        *lines, partial = (partial + data).split(b"\n")
        for raw in lines:
            text = raw.decode(errors="replace")
            out(text)
            verdicts.feed(text)
    if partial:
        out(partial.decode(errors="replace"))
    code = _end(proc) if timed_out else proc.wait()
    return verdicts.bad(timed_out, limit_s), code


def _end(proc: subprocess.Popen) -> int:
    """A check step past its limit: srun ends it on SIGTERM, else it is killed (the job's end stops what is left)."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
