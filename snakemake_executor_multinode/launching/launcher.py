"""`multinode torchrun [torchrun options] SCRIPT [ARGS]`: one torchrun per node of the SLURM allocation.

Inside an allocation (our job script or a hand-written one) it starts ONE srun step with one task per node
(`srun --nodes=N --ntasks-per-node=1 --kill-on-bad-exit=1 ...`); each task runs torchrun with
`--node_rank=$SLURM_NODEID`, filling in --nnodes, --nproc_per_node (GPUs per node), --master_addr and
--master_port. torchrun's agent starts with SIGUSR2 ignored (USR2's default action would kill it), and each node's
labeller (nodelog.py) passes SLURM's `--signal=USR2@T` on to the workers, which checkpoint: with proctrack/cgroup
SLURM signals only the step's task, not its children.
If one node's torchrun fails, the others are stopped at once and the launcher names the failing node.
Started by a user as one task per node of an srun step (`srun --ntasks-per-node=1 multinode torchrun ...`) it
runs that node's torchrun directly. Outside SLURM the same command runs a one-node torchrun.
"""

from __future__ import annotations

import importlib.util
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from snakemake_executor_multinode.contract import container_spec, node_events, protocol
from snakemake_executor_multinode.contract.jobfiles import LOCAL_RUNS_DIR, JobFiles
from snakemake_executor_multinode.contract.protocol import EXIT_PREEMPTED
from snakemake_executor_multinode.launching import (
    container,
    liveness,
    network_check,
    node_check,
    nodelog,
    preemption,
    restarts,
    spares,
    stall,
    straggler,
)
from snakemake_executor_multinode.launching.allocation import (
    Allocation,
    allocation,
    count_devices,
    hostnames,
    read_allocation,
)
from snakemake_executor_multinode.launching.metrics_tail import MetricsTail
from snakemake_executor_multinode.launching.torchrun_flags import option_value, split_torchrun_args

__all__ = ["split_torchrun_args"]  # re-exported: torchrun's flags live in torchrun_flags.py

# The rendezvous backends a SLURM allocation can use: static (torchrun's default with --master_addr, ranks from
# --node_rank) and c10d (a TCP store on the head node; the rendezvous assigns the ranks and lets torchrun restart
# failed workers within the job, --max-restarts).
RDZV_BACKENDS = ("static", "c10d")

# The node rank of a task of the launcher's step: expanded by each task's shell, on its node. With one task per
# node, SLURM numbers the step's nodes in the allocation's order, so node 0 is the head (MASTER_ADDR).
SLURM_NODE_RANK = "$SLURM_NODEID"

# What srun says when a task ends badly (srun's own messages; one task per node, so a task names its node).
TASK_FAILED = re.compile(r"^srun: error: (?P<node>[^\s:]+): tasks? (?P<task>\d+)[\d,\-]*: (?P<what>.+?)\s*$")
NODE_FAILED = re.compile(r"^srun: error: Node failure on (?P<node>[^\s,]+)")
NODE_FAILURE = "node failure"  # a Failure's `what` for NODE_FAILED
STEP_CANCELLED = re.compile(r"\*\*\* (STEP|JOB) \S+ ON \S+ CANCELLED")  # scancel, time limit, preemption
EXITED = re.compile(r"Exited with exit code (\d+)")
SIGNAL_CODES = {signal.strsignal(s): 128 + s for s in signal.Signals}  # srun names a fatal signal by strsignal()
# When one node's torchrun fails, srun's --kill-on-bad-exit asks slurmctld to stop the step: SIGTERM, then SIGKILL
# after the cluster's KillWait (30 s by default), so a worker that handles SIGTERM while it hangs in a collective
# holds the step (and srun) that long. The launcher also sends srun a SIGTERM ("forcing job termination", SIGKILL to
# every task; it helps when it reaches srun first), and stops waiting for srun this long after the failure: it
# kills srun and returns the failure, the job script ends, and SLURM's end-of-job cleanup stops what is left.
STOP_WAIT_S = 5.0
DEAD_NODE_WAIT_S = 0.5  # time for srun's SIGKILL to reach the live nodes' tasks


def log(msg: str) -> None:
    print(f"[multinode torchrun] {msg}", file=sys.stderr, flush=True)


def _refuse(flag: str, why: str) -> SystemExit:
    return SystemExit(f"multinode torchrun: {flag}: {why}")


def _given(opts: Sequence[str], name: str) -> str | None:
    """A flag's value under either spelling (--a_b / --a-b); "" for a flag given without a value."""
    names = (name, name.replace("_", "-"))
    value = option_value(opts, *names)
    return "" if value is None and any(t in names for t in opts) else value


def rdzv_backend(opts: Sequence[str]) -> str:
    backend = _given(opts, "--rdzv_backend") or "static"
    if backend not in RDZV_BACKENDS:
        raise _refuse("--rdzv_backend", f"{backend!r} is not available here; allowed: {', '.join(RDZV_BACKENDS)}")
    return backend


def check_user_flags(alloc: Allocation, opts: Sequence[str]) -> None:
    """torchrun's flags as a user writes them for one node, judged against the allocation: a value the launcher
    would set anyway is accepted, a different one would desynchronise the nodes and is refused, saying why."""
    if _given(opts, "--node_rank") is not None:
        raise _refuse(
            "--node_rank", "the launcher gives each node its rank (SLURM_NODEID, in the allocation's order); drop it"
        )
    if _given(opts, "--standalone") is not None:
        raise _refuse(
            "--standalone",
            f"this allocation has {len(alloc.nodes)} node(s); the launcher sets the "
            "rendezvous (outside SLURM, multinode torchrun runs standalone)",
        )
    n = len(alloc.nodes)
    nnodes = _given(opts, "--nnodes")
    if nnodes is not None and nnodes not in (str(n), f"{n}:{n}"):
        raise _refuse(
            "--nnodes",
            f"{nnodes!r}, but the allocation has {n} node(s) ({','.join(alloc.nodes)}); drop it or write --nnodes={n}",
        )
    for flag, ours in (("--master_addr", alloc.master_addr), ("--master_port", str(alloc.master_port))):
        value = _given(opts, flag)
        if value is not None and value != ours:
            raise _refuse(
                flag,
                f"{value!r}, but the launcher's rendezvous is {alloc.master_addr}:"
                f"{alloc.master_port} (MASTER_ADDR:MASTER_PORT); drop it",
            )
    backend = rdzv_backend(opts)
    endpoint = _given(opts, "--rdzv_endpoint")
    if endpoint is not None and (backend != "c10d" or endpoint != f"{alloc.master_addr}:{alloc.master_port}"):
        raise _refuse(
            "--rdzv_endpoint",
            f"{endpoint!r}; the launcher puts the endpoint on the head node "
            f"({alloc.master_addr}:{alloc.master_port}) with --rdzv_backend=c10d; drop it",
        )
    restarts = _given(opts, "--max_restarts")
    if backend == "static" and restarts not in (None, "0"):
        raise _refuse(
            "--max_restarts",
            "needs --rdzv_backend=c10d: with the static rendezvous torch 2.13's "
            "restarted workers find the previous attempt's peer addresses and fail",
        )
    for flag in ("--redirects", "--tee"):
        if _given(opts, flag) is not None:
            raise _refuse(
                flag,
                "the launcher keeps every rank's output: labelled lines in the job log, each "
                "node's in <job log>.<node>.out; --log-dir keeps torchrun's per-rank files too",
            )


def nproc_for(alloc: Allocation, opts: Sequence[str]) -> int:
    """Processes per node: the user's --nproc_per_node (a number, or gpu / cpu / auto as torchrun reads them, here
    counted from the allocation), else the node's GPUs (fake ones count), else 1."""
    given = _given(opts, "--nproc_per_node")
    if given is None:
        return max(alloc.gpus_per_node, 1)
    if given == "gpu" or (given == "auto" and alloc.gpus_per_node):
        if not alloc.gpus_per_node:
            raise _refuse(
                "--nproc_per_node=gpu",
                "this allocation has no GPUs (ask for them with the rule's gpus resource or --gpus-per-node)",
            )
        return alloc.gpus_per_node
    if given in ("cpu", "auto"):
        return max(alloc.cpus_per_task, 1)
    if not given.isdigit() or int(given) < 1:
        raise _refuse("--nproc_per_node", f"{given!r}; allowed: a positive integer, gpu, cpu or auto")
    return int(given)


# Flags the builder writes itself; a user's equal value (accepted above) is dropped so each appears once.
_BUILT = ("--nproc_per_node", "--nnodes", "--master_addr", "--master_port", "--rdzv_backend", "--rdzv_endpoint")


def _strip_built(opts: Sequence[str]) -> list[str]:
    names = {n for b in _BUILT for n in (b, b.replace("_", "-"))}
    out, skip = [], False
    for token in opts:
        if skip:
            skip = False
        elif token in names:
            skip = True
        elif token.split("=", 1)[0] not in names:
            out.append(token)
    return out


def torchrun_command(
    opts: Sequence[str],
    script: Sequence[str],
    *,
    nproc: int | str,
    alloc: Allocation | None = None,
    node_rank: int | str = SLURM_NODE_RANK,
    python: str = sys.executable,
) -> list[str]:
    """The torchrun command line, the same builder for every mode. Without an allocation: a one-node
    `--standalone` torchrun. With one: this node's part of the allocation's run (`node_rank` is a number, or
    SLURM_NODE_RANK for the launcher's step, where each node's shell fills it in)."""
    cmd = [python, "-m", "torch.distributed.run"]
    if alloc is None:
        cmd += ["--standalone", f"--nproc_per_node={nproc}"]
    elif rdzv_backend(opts) == "c10d":
        cmd += [
            f"--nnodes={len(alloc.nodes)}",
            f"--nproc_per_node={nproc}",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint={alloc.master_addr}:{alloc.master_port}",
        ]
        if _given(opts, "--rdzv_id") is None:
            cmd.append(f"--rdzv_id={alloc.job_id}")
    else:
        cmd += [
            f"--nnodes={len(alloc.nodes)}",
            f"--nproc_per_node={nproc}",
            f"--node_rank={node_rank}",
            f"--master_addr={alloc.master_addr}",
            f"--master_port={alloc.master_port}",
        ]
    return [*cmd, *_strip_built(opts), *script]


def labelled(
    torchrun: Sequence[str], nproc: int, opts: Sequence[str], python: str = sys.executable, echo: bool = False
) -> list[str]:
    """torchrun under the node's labeller (nodelog.py): every line says which node and rank wrote it, kept in the
    node's own file, which the launcher copies into the job log (`echo`: the labeller writes to stdout itself, for
    a user's own srun step). Under c10d (from the user's `opts`) the rendezvous, not the node order, gives ranks."""
    flags = ["--dynamic"] if rdzv_backend(opts) == "c10d" else []
    flags += ["--echo"] if echo else []
    return [python, "-m", "snakemake_executor_multinode.launching.nodelog", f"--nproc={nproc}", *flags, "--", *torchrun]


def agent_script(torchrun: Sequence[str], preflight: Sequence[str] = ()) -> str:
    """The shell line every task of the launcher's step runs (`bash -c`). torchrun's agent starts with USR2
    ignored (an inherited ignore; the workers' own handler overrides it). `--node_rank=$SLURM_NODEID` is the one
    word the node's shell expands; every other word is quoted."""
    rank_word = f"--node_rank={SLURM_NODE_RANK}"
    at = torchrun.index(rank_word) if rank_word in torchrun else -1  # the first: a user's --node_rank is refused
    words = ['--node_rank="$SLURM_NODEID"' if i == at else shlex.quote(t) for i, t in enumerate(torchrun)]
    check = f"{shlex.join(preflight)} || exit $?; " if preflight else ""  # network preflight (network_check.py)
    return f'trap "" USR2; {check}exec {" ".join(words)}'


def srun_command(
    alloc: Allocation,
    opts: Sequence[str],
    script: Sequence[str],
    python: str = sys.executable,
    box: container_spec.ContainerSpec | None = None,
    nodelist: bool = False,
    overlap: bool = False,
) -> list[str]:
    """The one srun step that starts torchrun on every node: what `run_step` runs, and what tests check.
    Explicit CPUs (srun 22.05 does not inherit --cpus-per-task) and --mem=0: all of the job's memory on each node,
    not a DefMemPerCPU-sized slice. The step inherits the job's GPUs on every node. `nodelist`: the step runs on
    exactly `alloc.nodes`, a part of a job's allocation that holds spare nodes (spares.py); `overlap`: it may share
    the survivors' resources with a failed step that SLURM still holds (its dead node never reports the end)."""
    check_user_flags(alloc, opts)
    n = len(alloc.nodes)
    nproc = nproc_for(alloc, opts)
    # --- containers (container.py): `box` wraps each node's torchrun; pyxis adds srun flags instead ---
    bare = torchrun_command(opts, script, nproc=nproc, alloc=alloc, python=container.python(box, python))
    node = container.node_task(
        box, bare, lambda t: labelled(t, nproc, opts, python), workdir=os.getcwd(), gpus_per_node=alloc.gpus_per_node
    )
    torchrun = node.argv
    srun = [
        "srun",
        f"--nodes={n}",
        f"--ntasks={n}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={alloc.cpus_per_task}",
        "--mem=0",
        # Kept, measured (2 runs each, 2-node gloo job): without it a node's death is noticed as fast (6.6 vs
        # 6.5 s) and a rank's crash too (0.9 vs 1.6 s: noise); with it slurmctld stops the step itself, so a
        # failed node also ends the others when the launcher cannot (killed, hung).
        "--kill-on-bad-exit=1",
        "--export=ALL",
        f"--job-name={spares.STEP_NAME}",
    ]
    if nodelist:  # SLURM numbers the step's nodes in the allocation's order, as the roster lists them
        srun.append(f"--nodelist={','.join(alloc.nodes)}")
    if overlap:
        srun.append("--overlap")
    # --- network preflight (network_check.py): on every node before torchrun, when $MULTINODE_NETWORK_CHECK is set ---
    preflight = network_check.command(alloc, nproc, python, contained=box is not None)
    return [*srun, *node.srun_flags, "bash", "-c", agent_script(torchrun, preflight), "multinode-agent"]


def worker_env(alloc: Allocation, nproc: int, env: Mapping[str, str], opts: Sequence[str] = ()) -> dict[str, str]:
    """OMP threads = the node's CPUs shared by its processes (Snakemake's shell set it to the rule's threads)."""
    omp = str(max(1, alloc.cpus_per_task // max(nproc, 1)))
    out = dict(env) | {"OMP_NUM_THREADS": omp, "MASTER_ADDR": alloc.master_addr, "MASTER_PORT": str(alloc.master_port)}
    if rdzv_backend(opts) == "c10d":
        # torch 2.13's workers otherwise share the rendezvous store across restarts, and a restarted gloo group
        # reads the previous attempt's peer addresses ("Connection refused"): a fresh store per attempt.
        out.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return out


@dataclass(frozen=True)
class Failure:
    node: str
    rank: int
    code: int
    what: str
    victim: str = ""  # set when `node` does not answer: the node whose task failed first, after losing its peer

    @property
    def node_down(self) -> bool:
        """The node is gone: its slurmd did not answer the launcher (a victim failed first), or SLURM itself declared
        a node failure (after SlurmdTimeout, when no live rank failed on the lost peer before)."""
        return bool(self.victim) or self.what == NODE_FAILURE


class StepWatch:
    """Reads srun's stderr as it passes through: the first task that ends badly names the failing node, unless
    the step was stopped from outside first (scancel, time limit, a signal to the launcher)."""

    def __init__(self, nodes: Sequence[str]) -> None:
        self.nodes = tuple(nodes)
        self.failure: Failure | None = None
        self.stopped = False
        self.ended: set[str] = set()  # the nodes whose task srun reported ended badly (or whose node failed)
        self._partial = b""

    def feed(self, data: bytes) -> Failure | None:
        """Takes a chunk of srun's stderr; returns the failure it reports first, once."""
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()[-4096:]
        found = None
        for raw in lines:
            found = self.line(raw.decode(errors="replace")) or found
        return found

    def line(self, text: str) -> Failure | None:
        if self.failure is None and not self.stopped and STEP_CANCELLED.search(text):
            self.stopped = True
            return None
        m = TASK_FAILED.match(text) or NODE_FAILED.match(text)
        if m is None:
            return None
        named = [m["node"]]
        if "[" in m["node"]:  # a range, for tasks of several nodes ending alike in one message
            try:
                named = hostnames(m["node"]) or named
            except (OSError, subprocess.CalledProcessError):
                pass
        self.ended.update(named)  # also once the step is stopped: a stalled step's nodes as their tasks end
        if self.failure is not None or self.stopped:
            return None
        node = named[0]
        groups = m.groupdict()
        # one task per node: the task id is the node rank torchrun was given (SLURM_NODEID)
        rank = int(groups["task"]) if groups.get("task") else self.nodes.index(node) if node in self.nodes else -1
        what = groups.get("what") or NODE_FAILURE
        exited = EXITED.search(what)
        code = int(exited[1]) if exited else SIGNAL_CODES.get(what.removesuffix(" (core dumped)"), 1)
        self.failure = Failure(node, rank, code, what)
        return self.failure


@dataclass(frozen=True)
class StepEnd:
    """How a step ended: the launcher's exit code, and the node to blame when one failed (not a stall, not a stop
    from outside). `stalled`: the verdict of a stall the step was ended for and that was not recorded, because a
    restart may follow (the caller records it when none does); `reached`: the highest step of the launch's metrics
    step lines (None: none), the restart policy's measure of progress."""

    code: int
    failure: Failure | None = None
    stalled: str = ""
    reached: float | None = None


def run_step(argv: Sequence[str], env: Mapping[str, str], nodes: Sequence[str]) -> int:
    return launch_step(argv, env, nodes).code


# What a stalled step's Failure says of the node whose ranks the watchdog found differing (a spare replaces it).
STALLED_WHAT = "stalled: its ranks differ from the others' in the stall watchdog's stacks"
# ... and of a stalled step's node the head cannot reach (a network split: liveness.split).
UNREACHABLE_WHAT = "unreachable from the head node: its slurmd does not answer (a network split)"
UNREACHABLE_HEAD = "reaches no other node of the job: it is cut off (a network split)"


def launch_step(
    argv: Sequence[str],
    env: Mapping[str, str],
    nodes: Sequence[str],
    spare_left: bool = False,
    spares: Sequence[str] = (),
    restartable: bool = False,
) -> StepEnd:
    """Runs the srun step, its stderr passed through; the first failing node is logged and written to
    $MULTINODE_FAILED_NODE_FILE (first failure wins) as soon as srun reports it, and the step is killed (see
    STOP_WAIT_S). `spare_left`: a stall whose odd ranks are on one node, or one of whose nodes the head cannot reach,
    ends with that node blamed, for a spare to replace, instead of the stall's verdict and requeue; so does a
    straggler under on_straggler replace. `spares`: the job's unused nodes, also asked on a stall (liveness.split).
    `restartable`: in-job restarts are on (restarts.py): a stall every node answers in ends with its verdict
    unrecorded (StepEnd.stalled), for the caller to restart the training or else record it (end_stall)."""
    proc = subprocess.Popen(list(argv), env=dict(env), stderr=subprocess.PIPE)
    assert proc.stderr is not None
    stalls = StallCheck(env, nodes, replaceable=spare_left, spares=spares, restartable=restartable)
    watch = StepWatch(nodes)
    stragglers = straggler.StragglerCheck(env, nodes, replaceable=spare_left, log=log)

    def forward(signum: int, _frame: object) -> None:
        watch.stopped = watch.stopped or watch.failure is None  # stopped from outside: no node failed
        if proc.poll() is None:
            proc.send_signal(signum)

    before = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = _supervise(proc, watch, env, stalls, stragglers)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    reached = stalls.read_pace()  # the lines written up to the end count too
    return _step_end(code, reached, env, nodes, watch, stalls, stragglers)


def _step_end(
    code: int,
    reached: float | None,
    env: Mapping[str, str],
    nodes: Sequence[str],
    watch: StepWatch,
    stalls: StallCheck,
    stragglers: straggler.StragglerCheck,
) -> StepEnd:
    """How a supervised step ended, said in the log: a straggler blamed, a stall (its odd node for a spare, its
    verdict for a restart, or recorded), a failed node, or srun's own exit code."""
    if code == 0:
        return StepEnd(0, reached=reached)
    if (slow := stragglers.blamed) is not None and stalls.verdict is None:
        what = slow.describe(stragglers.settings.factor, stragglers.settings.window_s)
        log(f"step ended: {what}")
        slow_end = Failure(slow.node, list(nodes).index(slow.node), code, what)
        return StepEnd(code if code > 0 else 1, slow_end, "", reached)
    if stalls.verdict is not None and stalls.odd_node is not None:
        if stalls.split is not None:
            log(f"{stalls.verdict}; ending the step to replace node {stalls.odd_node}")
            what = UNREACHABLE_WHAT
        else:
            log(f"{stalls.verdict}; node {stalls.odd_node} holds the rank(s) that differ")
            what = STALLED_WHAT
        odd = Failure(stalls.odd_node, list(nodes).index(stalls.odd_node), protocol.EXIT_STALLED, what)
        return StepEnd(protocol.EXIT_STALLED, odd, "", reached)
    if stalls.verdict is not None and stalls.unrecorded and stalls.restartable:
        log(f"step ended: {stalls.verdict}")
        return StepEnd(protocol.EXIT_STALLED, None, stalls.verdict, reached)
    if stalls.verdict is not None:
        if stalls.unrecorded:
            end_stall(env, stalls.verdict)
        else:  # a split's verdict, recorded when it was found (_split_verdict)
            log(f"FAILED: {stalls.verdict}")
        return StepEnd(protocol.EXIT_STALLED, reached=reached)
    if watch.failure is not None:
        f = watch.failure
        log(f"FAILED: node {f.node} (node_rank {f.rank}) {failure_why(f)}")
        return StepEnd(f.code, f, "", reached)
    log(f"srun exited with {code}" + (" after the step was stopped" if watch.stopped else ""))
    return StepEnd(code if code > 0 else 1, reached=reached)


def end_stall(env: Mapping[str, str], message: str) -> int:
    """A stall no restart follows, recorded as `on_stall` says (stall.record) and said; the launcher's exit code."""
    recorded = stall.record(env, message, env.get(protocol.ON_STALL_VAR, "fail"))
    for error in recorded.errors:
        log(f"ERROR: {error}")
    log(f"{recorded.verdict}; requeued to resume" if recorded.requeue else f"FAILED: {recorded.verdict}")
    return protocol.EXIT_STALLED


def failure_why(f: Failure) -> str:
    if f.what in (STALLED_WHAT, UNREACHABLE_WHAT) or f.what.startswith(straggler.WHAT):
        return f.what
    return "does not answer: the node is down" if f.node_down else f"exited with {f.code}"


def _supervise(
    proc: subprocess.Popen,
    watch: StepWatch,
    env: Mapping[str, str],
    stalls: StallCheck,
    stragglers: straggler.StragglerCheck,
) -> int:
    assert proc.stderr is not None
    fd, out = proc.stderr.fileno(), sys.stderr.buffer
    give_up: float | None = None  # set by a failure
    told = 0.0  # when srun was told to end the step (SIGTERM)
    gentle: float | None = None  # a stalled (or straggling) step's gentle end: srun is forced to end it then
    while True:
        if give_up is not None and time.monotonic() >= give_up:
            waited = time.monotonic() - told
            log(f"srun still waits for the step {waited:.1f} s after being told to end it: not the launcher")
            proc.kill()  # SLURM ends what is left of the step with the job
            break
        wait = 1.0 if give_up is None else max(0.0, min(1.0, give_up - time.monotonic()))
        # no progress for stall_timeout (stacks taken), or a straggler for a spare to replace (on_straggler replace)
        if give_up is None and gentle is None and (stalls.due() or stragglers.due()):
            watch.stopped = True  # the tasks' ends that follow are the launcher's doing, no node's failure
            stall.stop_file(stalls.stem).write_text(f"{time.time()}\n")
            proc.send_signal(signal.SIGUSR1)  # srun passes it to every node's task: SIGTERM to its torchrun
            gentle = time.monotonic() + stall.stop_grace(container.from_env(env) is not None)
        if give_up is None and gentle is not None and stalls.only_cut_off_left(watch.ended):
            # a split: every node the head reaches has ended its task; srun would wait on the cut-off node's
            log(f"every reachable node's task has ended; not waiting for {', '.join(stalls.split_nodes())}")
            proc.send_signal(signal.SIGTERM)
            told = time.monotonic()
            give_up = told + DEAD_NODE_WAIT_S
        if give_up is None and gentle is not None and time.monotonic() >= gentle:
            proc.send_signal(signal.SIGTERM)  # srun: "forcing job termination"
            told = time.monotonic()
            give_up = told + STOP_WAIT_S
        if select.select([fd], [], [], wait)[0]:
            data = os.read(fd, 65536)
            if not data:
                break
            out.write(data)
            out.flush()
            if (failed := watch.feed(data)) is not None:
                proc.send_signal(signal.SIGTERM)  # srun: "forcing job termination", SIGKILL to every task
                told = time.monotonic()
                give_up = told + STOP_WAIT_S
                watch.failure = failed = blame(failed, watch.nodes, env)  # ~1 s at most
                report_failure(failed, env)
                if failed.node_down:  # a dead node never reports its task's end: srun would wait for nothing
                    give_up = min(give_up, time.monotonic() + DEAD_NODE_WAIT_S)
        elif proc.poll() is not None:
            break
    return proc.wait()


class StallCheck:
    """The progress watchdog on the head node (stall.py), ticked by the supervising loop about once a second."""

    def __init__(
        self,
        env: Mapping[str, str],
        nodes: Sequence[str],
        replaceable: bool = False,
        spares: Sequence[str] = (),
        restartable: bool = False,
    ) -> None:
        value = env.get(protocol.STALL_TIMEOUT_VAR, "0")
        self.on_stall = env.get(protocol.ON_STALL_VAR, "fail")
        self.env, self.nodes, self.stem = env, list(nodes), nodelog.log_stem(env)
        node_files = [JobFiles(Path(self.stem)).node_out(n) for n in nodes] if self.stem else []
        metrics = env.get(protocol.METRICS_FILE_VAR)
        paths = [*node_files, Path(metrics)] if metrics else node_files
        # The training's pace, from this launch's metrics lines (written on the head node or a node whose clock
        # agrees: an earlier launch's lines, read again from a rewritten file, are older)
        self.pace = stall.Pace(since_wall=time.time() - straggler.WALL_SLACK_S)
        self.metrics = MetricsTail(Path(metrics) if metrics else None)
        self.adaptive = value == protocol.STALL_AUTO
        self.start = stall.LaunchStart(node_files, Path(metrics) if metrics else None)
        fixed = int(value) if value.isdigit() else 0
        timeout: Callable[[], float] = (
            (lambda: stall.adaptive_timeout(self.pace))
            if self.adaptive
            else lambda: stall.fixed_timeout(fixed, self.start)
        )
        self.watchdog = stall.Watchdog(timeout if paths else 0, paths)
        self.asked: float | None = None  # when every node was asked for its stacks
        self.verdict: str | None = None
        # A spare can take the place of the node holding the odd ranks: then nothing is recorded (no verdict for
        # the job status watch, no requeue), the launcher relaunches instead.
        self.replaceable = replaceable
        self.odd_node: str | None = None
        # A network split: the nodes the head cannot reach, asked when the stall is noticed (liveness.split); the
        # unreachable node is blamed whatever the stacks say (in a split every rank waits alike).
        self.spares = list(spares)
        self.split: liveness.Split | None = None
        # The verdict of a stall every node answers in is recorded once the step has ended (end_stall); with in-job
        # restarts on (restarts.py) the launcher decides: it restarts the training, or else records it, saying why.
        self.restartable = restartable
        self.unrecorded = False

    def read_pace(self) -> float | None:
        """Takes the metrics lines written since the last call; the highest step this launch reached."""
        now = time.time()
        for line in self.metrics.lines():
            self.pace.feed(line, now)
        return self.pace.reached

    def due(self) -> bool:
        """True once, when the step should end: the stacks of every node are in (or STACKS_WAIT_S passed)."""
        self.read_pace()
        if self.verdict is not None:
            return False
        if self.asked is None:
            if not self.watchdog.stalled():
                return False
            when = datetime.now().astimezone().isoformat(timespec="seconds")
            rule = (
                f" (the adaptive timeout: {stall.adaptive_rule(self.pace)})"
                if self.adaptive
                else stall.fixed_rule(self.start)
            )
            log(f"{stall.NOTICED} {when}: no progress for {self.watchdog.limit:.0f} s on any rank: taking every "
                f"rank's stack{rule}")  # fmt: skip
            self.split = self._probe()
            stall.request_file(self.stem).write_text(f"{time.time()}\n")
            self.asked = time.monotonic()
        cut = self.split.unreachable if self.split else ()
        done = all(stall.done_file(self.stem, n).exists() for n in self.nodes if n not in cut)
        if not done and time.monotonic() - self.asked < stall.STACKS_WAIT_S:
            return False
        message = stall.verdict(self.stem, self.nodes, self.watchdog.limit, str(JobFiles(Path(self.stem)).log))
        if self.split is not None:
            return self._split_verdict(message, self.split)
        if self.replaceable and (node := stall.odd_node(self.stem, self.nodes)) is not None:
            self.verdict, self.odd_node = message, node
            return True
        self.verdict, self.unrecorded = message, True  # recorded after the step's end, unless a restart follows
        return True

    def split_nodes(self) -> tuple[str, ...]:
        """The step's nodes the head could not reach when the stall was noticed."""
        return tuple(n for n in self.nodes if self.split and n in self.split.unreachable)

    def only_cut_off_left(self, ended: set[str]) -> bool:
        """Whether a split's stopped step waits only on nodes that cannot hear the stop (every other one ended)."""
        cut = self.split_nodes()
        return bool(cut) and self.verdict is not None and all(n in ended for n in self.nodes if n not in cut)

    def _probe(self) -> liveness.Split | None:
        """Every other node of the step and every spare asked from here (~1 s, ~2 s with a node that does not
        answer); a node the head cannot reach is named in the log at once."""
        if len(self.nodes) < 2:
            return None
        here = socket.gethostname().split(".")[0]
        port = liveness.slurmd_port(self.env)
        found = liveness.split(here, self.nodes, self.spares, port)
        if found is None:
            return None
        if found.head:
            log(
                f"the head node {here} is cut off: no other node of the job answers it ({', '.join(found.unreachable)}"
                f": slurmd port {port}, asked twice); it is named for the retry to exclude"
            )
            return found
        for node in found.unreachable:
            where = f"node_rank {self.nodes.index(node)}" if node in self.nodes else "a spare"
            then = ""
            if node == found.node:
                then = "; a spare takes its place" if self.replaceable else "; no spare left: the retry excludes it"
            log(
                f"node {node} ({where}) is unreachable from the head node {here}: its slurmd (port {port}) does not "
                f"answer, asked twice (a network split, or the node is down){then}"
            )
        return found

    def _split_verdict(self, message: str, found: liveness.Split) -> bool:
        """A node the head cannot reach: with a spare left (and not the head itself) it is blamed for the spare to
        replace, nothing recorded; otherwise it is named in $MULTINODE_FAILED_NODE_FILE and the step fails, never
        requeued: a requeue would run on the same nodes again, where the retry leaves the node out."""
        node = found.node
        said = f"the head node {node} {UNREACHABLE_HEAD}" if found.head else f"node {node} is {UNREACHABLE_WHAT}"
        message += f"; {said}"
        if self.replaceable and not found.head and node in self.nodes:
            self.verdict, self.odd_node = message, node
            return True
        name_failed_node(self.env, node)
        if self.on_stall == "requeue":
            message += f"; not requeued: a requeue would run on {node} again (the retry leaves it out)"
        recorded = stall.record(self.env, message, "fail")
        for error in recorded.errors:
            log(f"ERROR: {error}")
        self.verdict = recorded.verdict
        return True


def blame(
    failed: Failure,
    nodes: Sequence[str],
    env: Mapping[str, str],
    find_dead: Callable[[Sequence[str], int], list[str]] | None = None,
) -> Failure:
    """The node to blame for the first failed task. When a node dies, the live nodes' ranks fail first (their peer
    vanished) and srun names one of them: so every other node's slurmd is asked first (in parallel, ~1 s at most),
    and a node that does not answer is blamed, the first failing node named as its victim."""
    here = socket.gethostname().split(".")[0]  # the launcher runs here: this node is not dead
    dead = (find_dead or liveness.unreachable)([n for n in nodes if n != here], liveness.slurmd_port(env))
    if not dead or failed.node in dead:
        return failed
    node = dead[0]
    return Failure(node, nodes.index(node), failed.code, "not answering", victim=failed.node)


def name_failed_node(env: Mapping[str, str], node: str) -> None:
    """The node the retry excludes, in $MULTINODE_FAILED_NODE_FILE; a marker that cannot be written is said."""
    if (error := protocol.record_failed_node(env.get(protocol.FAILED_NODE_FILE_VAR, ""), node)) is not None:
        log(f"ERROR: {error}")


def report_failure(failed: Failure, env: Mapping[str, str]) -> None:
    if failed.victim:
        log(
            f"node {failed.node} (node_rank {failed.rank}) does not answer (its slurmd is unreachable: the node is "
            f"down); node {failed.victim} failed after it, having lost its peer; stopping the other nodes"
        )
    elif failed.node_down:
        log(f"node {failed.node} (node_rank {failed.rank}) {stall.NODE_FAILURE_SAID}; stopping the others")
    else:
        how = f"with exit code {failed.code}" if EXITED.search(failed.what) else f"({failed.what})"
        log(f"node {failed.node} (node_rank {failed.rank}) failed {how}; stopping the other nodes")
    name_failed_node(env, failed.node)


def step_command(
    env: Mapping[str, str], opts: Sequence[str], script: Sequence[str], python: str = sys.executable
) -> tuple[list[str], dict[str, str]]:
    """Inside an `srun --ntasks-per-node=1 multinode torchrun ...` step: this node's torchrun, no further srun."""
    nodes = hostnames(env["SLURM_STEP_NODELIST"])
    if int(env.get("SLURM_STEP_NUM_TASKS", len(nodes))) != len(nodes):
        raise SystemExit(
            "multinode torchrun: inside an srun step, start one task per node "
            "(srun --ntasks-per-node=1 multinode torchrun ...)"
        )
    # the same on every node without talking to each other: the port from job and step id
    alloc = allocation(env, nodes, int(env.get("SLURM_CPUS_PER_TASK") or 1), int(env.get("SLURM_STEP_ID", 0)))
    check_user_flags(alloc, opts)
    nproc = nproc_for(alloc, opts)
    rank = int(env["SLURM_NODEID"])  # the step's nodes in the allocation's order, as in the launcher's own step
    cmd = torchrun_command(opts, script, nproc=nproc, alloc=alloc, node_rank=rank, python=python)
    return labelled(cmd, nproc, opts, python, echo=True), worker_env(alloc, nproc, env, opts)


# What `--help` adds above torchrun's own options: the flags the launcher writes in an allocation.
FILLED_IN = """\
Inside a SLURM allocation the launcher fills in, for every node:
  --nnodes            the allocation's node count (an equal value is accepted; another is refused)
  --nproc_per_node    the node's GPUs, else 1 (yours wins: a number, or gpu / cpu / auto counted from the
                      allocation)
  --node_rank         SLURM_NODEID (yours is refused: the launcher gives each node its rank)
  --master_addr/--master_port   the head node's address and a port derived from the job id (equal values are
                      accepted); with --rdzv_backend=c10d: --rdzv_endpoint on the head node and --rdzv_id = job id
  --redirects/--tee   owned: each line of the job log is labelled [<node> rank<R>], and each node's output is kept
                      in <job log>.<node>.out; --log-dir keeps torchrun's per-rank files as well
Everything else (--max-restarts, --rdzv_backend=c10d, --local-ranks-filter, -m, --no-python, ...) is torchrun's.
Outside SLURM it runs one torchrun here with what a job gives the training where one machine has it: the profile's
NCCL block and variables (SNAKEMAKE_MULTINODE_ENV_PROFILE, SNAKEMAKE_MULTINODE_PROFILE_FILE), a metrics file and a
preempt file under {local_runs}/; a checkpoint on SIGUSR2 ends it with {exit_preempted} (docs/first-job.md).
torchrun and the training run with this Python: {python}.
"""


def print_help(python: str = sys.executable) -> int:
    print(__doc__)
    print(FILLED_IN.format(python=python, local_runs=LOCAL_RUNS_DIR, exit_preempted=EXIT_PREEMPTED))
    print("torchrun's options (python -m torch.distributed.run --help):\n", flush=True)
    return subprocess.call([python, "-m", "torch.distributed.run", "--help"])


def check_nodes(
    roster: spares.Roster, gpus_per_node: int, env: Mapping[str, str], relaunch: int, lost: list[node_events.NodeEvent]
) -> int | None:
    """The node check (node_check.py) over every usable node before a launch: a failing node is dropped like a dead
    one, before the training starts there. None: launch; else the launcher's exit code, the first failing node in
    $MULTINODE_FAILED_NODE_FILE for the retry to exclude (too few good nodes left). A spare's takeover that could not
    be recorded is added to `lost`."""
    wanted = node_check.settings(env)
    if not node_check.wanted(wanted, gpus_per_node):
        return None
    nodes = roster.usable()
    t0 = time.monotonic()
    argv = node_check.srun_command(nodes, gpus_per_node)
    limit = wanted.timeout + node_check.STEP_GRACE_S
    bad, code = node_check.run_step(argv, env, nodes, limit, lambda line: print(line, file=sys.stderr, flush=True))
    if not bad and code != 0:  # no node said anything: srun could not run the step, which blames no node
        log(f"the node check's step failed (srun exit {code}) before any node reported: no node is blamed")
    log(f"node check: {len(nodes) - len(bad)} of {len(nodes)} node(s) ok in {time.monotonic() - t0:.1f} s")
    chosen = roster.chosen()
    for node, spare in roster.exclude(list(bad)).items():
        took = f"spare {spare} takes its place" if spare else "no spare left" if node in chosen else "a spare: unused"
        log(f"node {node} failed its node check: {bad[node]}; {took}")
        event = node_events.NodeEvent(
            node_events.CHECK_FAILED, node, f"failed its node check: {bad[node]}", spare or "", relaunch
        )
        if not spares.record(env, event, log) and event.spare_took_over:
            lost.append(event)
    if roster.enough():
        return None
    first = next(iter(bad))
    log(
        f"FAILED: {len(roster.usable())} good node(s) left, the training needs {roster.train}; node {first} is "
        "named for the retry to exclude"
    )
    name_failed_node(env, first)
    return 1


def unrecorded_exit(code: int, lost: Sequence[node_events.NodeEvent], env: Mapping[str, str]) -> int:
    """The launcher's exit code: the step's, except for a training that checkpointed (its preempt file) after a
    spare's takeover the node events could not hold: EXIT_UNRECORDED, which the job script reads as "a spare
    replaced a node" (it does not requeue itself; the retry resumes) instead of the record's silence."""
    preempt = env.get(protocol.PREEMPT_FILE_VAR, "")
    if code != 0 or not lost or not preempt or not os.path.exists(preempt):
        return code
    log(
        f"the job does not requeue itself: {len(lost)} spare takeover(s) could not be recorded "
        f"({'; '.join(e.describe() for e in lost)})"
    )
    return protocol.EXIT_UNRECORDED


def checkpointed(env: Mapping[str, str]) -> bool:
    """The training checkpointed on the pre-time-limit signal and asked to be requeued: its preempt file."""
    preempt = env.get(protocol.PREEMPT_FILE_VAR, "")
    return bool(preempt) and os.path.exists(preempt)


def after_checkpoint(failed: Failure, env: Mapping[str, str], lost: Sequence[node_events.NodeEvent]) -> int:
    """A task that ended badly after the training had checkpointed on the signal: the step's end is the
    checkpoint's, never a node's failure to replace (a relaunch would train on past the time limit instead of
    requeueing). A repeated signal kills a worker as it leaves (Python drops its handlers at exit; SLURM and the
    nodes' labellers may each deliver USR2). A node that is down stays named for the retry; one that answers is not
    blamed."""
    log(
        f"node {failed.node}'s task ended badly ({failure_why(failed)}) after the training checkpointed on the signal "
        "(its preempt file): the step ended with the checkpoint"
        + ("" if failed.node_down else f"; node {failed.node} is not blamed")
    )
    if not failed.node_down:
        spares.forget_failed_node(env, failed.node, log)
    return unrecorded_exit(0, lost, env)


def launch_with_spares(
    alloc: Allocation,
    opts: Sequence[str],
    script: Sequence[str],
    env: Mapping[str, str],
    box: container_spec.ContainerSpec | None,
) -> int:
    """One step on the training's nodes, and the relaunches after a failed one, each a new step in the same job:
    while a failed step names a node and a spare is left, that node is dropped and the step starts on the survivors
    plus the spare (spares.py); a crash or stall on nodes that still answer starts again on the same nodes while a
    restart is left (restarts.py). Before every launch the node check runs on every usable node (check_nodes): a
    failed node kept for a restart is checked again. Without spares or restarts: one step, as ever."""
    roster = spares.Roster(alloc.nodes, spares.train_nodes(env, len(alloc.nodes)))
    budget = restarts.Budget.from_env(env)
    relaunch, restarted, overlap = 0, 0, False
    lost: list[node_events.NodeEvent] = []  # spares' takeovers the node events could not hold
    reached: list[float | None] = []  # each failed launch's highest step (the crash-loop rule's progress)
    while True:
        if (code := check_nodes(roster, alloc.gpus_per_node, env, relaunch, lost)) is not None:
            return code
        end = _launch(alloc, roster, opts, script, env, box, relaunch, overlap, restartable=budget.max_restarts > 0)
        failed = end.failure
        if failed is not None and checkpointed(env):
            return after_checkpoint(failed, env, lost)
        if end.code == 0:
            return unrecorded_exit(end.code, lost, env)
        reached.append(end.reached)
        if failed is not None and (spare := roster.drop(failed.node)) is not None:
            relaunch += 1
            _replace(failed, spare, relaunch, env, lost)
        else:
            what = restartable_failure(end, env)
            why_not = None if what is None else restarts.why_not(budget, restarted, reached)
            if what is None or why_not is not None:
                return _not_restarted(end, why_not, lost, env)
            relaunch += 1
            restarted += 1
            log(
                f"restarting the training on the same nodes ({what}){stall.RELAUNCHED}{relaunch}, restart {restarted} "
                f"of max_restarts {budget.max_restarts}"
            )
            if failed is not None:
                spares.forget_failed_node(env, failed.node, log)
        overlap = _next_step_overlaps(alloc, env)


def _launch(
    alloc: Allocation,
    roster: spares.Roster,
    opts: Sequence[str],
    script: Sequence[str],
    env: Mapping[str, str],
    box: container_spec.ContainerSpec | None,
    relaunch: int,
    overlap: bool,
    restartable: bool,
) -> StepEnd:
    """One launch: the training's step on the roster's chosen nodes, said in the log, its nodes' lines merged into
    the job log."""
    step = spares.step_allocation(alloc, roster.chosen(), relaunch)
    argv_srun = srun_command(step, opts, script, box=box, nodelist=step.nodes != alloc.nodes, overlap=overlap)
    nproc = nproc_for(step, opts)
    chosen = f"; nodes {','.join(step.nodes)}, {roster.spares_left()} spare(s) left" if roster.has_spares else ""
    log(
        f"job {step.job_id}: {len(step.nodes)} node(s) x {nproc} process(es), "
        f"master {step.master_addr}:{step.master_port}; one srun step, node_rank = SLURM_NODEID{chosen}; "
        f"Python {container.python(box, sys.executable)}"
    )
    step_env = worker_env(step, nproc, env, opts) | {protocol.RELAUNCH_VAR: str(relaunch)}
    with nodelog.Merger(nodelog.log_stem(env), step.nodes):  # the nodes' labelled lines into the job log
        return launch_step(
            argv_srun,
            step_env,
            step.nodes,
            spare_left=roster.spare() is not None,
            spares=roster.idle(),
            restartable=restartable,
        )


def _replace(
    failed: Failure, spare: str, relaunch: int, env: Mapping[str, str], lost: list[node_events.NodeEvent]
) -> None:
    """A failed node dropped for a spare: said, and recorded in the node events (a takeover they could not hold is
    added to `lost`)."""
    log(f"replacing node {failed.node} ({failure_why(failed)}) with spare {spare}{stall.RELAUNCHED}{relaunch}")
    event = node_events.NodeEvent(node_events.REPLACED, failed.node, failure_why(failed), spare, relaunch)
    if not spares.record(env, event, log):
        lost.append(event)
    spares.forget_failed_node(env, failed.node, log)


def _not_restarted(
    end: StepEnd, why_not: str | None, lost: Sequence[node_events.NodeEvent], env: Mapping[str, str]
) -> int:
    """The launcher's exit code for a failed step no relaunch follows; a stall's verdict is recorded now, as
    on_stall says."""
    if why_not is not None:
        log(f"not restarted in the job: {why_not}")
    if end.stalled:
        return end_stall(env, end.stalled + (f"; not restarted: {why_not}" if why_not else ""))
    return unrecorded_exit(end.code, lost, env)


def _next_step_overlaps(alloc: Allocation, env: Mapping[str, str]) -> bool:
    """Whether the next step must overlap the failed one (srun --overlap), after the stall exchange is cleared."""
    spares.clear_stall_exchange(nodelog.log_stem(env), alloc.nodes)
    # SLURM keeps a step that had a dead node until it marks the node down (SlurmdTimeout), and with it the
    # survivors' CPUs and memory: a new step would wait for them that long, so it overlaps the old one instead
    overlap = not spares.wait_step_gone(alloc.job_id)
    if overlap:
        log(
            f"the failed step is still listed {spares.STEP_GONE_WAIT_S:.0f} s after its end (a dead node holds "
            "it): the new step overlaps it (srun --overlap)"
        )
    return overlap


def restartable_failure(end: StepEnd, env: Mapping[str, str]) -> str | None:
    """What a failed step that an in-job restart may follow says of its failure ('stalled: ...', 'node2 exited with
    1'); None for any other end: a dead or unreachable node (a spare's case, or the retry's), a node that failed the
    network preflight (its exit code), a stop from outside (scancel, the time limit), srun failing without a failed
    task, or a training that checkpointed on the pre-time-limit signal (the job script requeues it)."""
    if checkpointed(env):
        return None
    if end.stalled:
        return end.stalled
    failed = end.failure
    if failed is None or failed.node_down or failed.what in (STALLED_WHAT, UNREACHABLE_WHAT):
        return None
    if failed.code == protocol.EXIT_PREFLIGHT:  # the node's network failed its check: the node is at fault
        return None
    if failed.what.startswith(straggler.WHAT):
        return None
    return f"node {failed.node} {failure_why(failed)}"


def refuse_container_without_step(env: Mapping[str, str]) -> None:
    """A container (from the job script's variables) wraps the step the launcher starts: outside SLURM, or inside a
    user's own srun step, it starts none, and the container would be ignored: an error instead."""
    outside = outside_slurm(env)
    if (outside or env.get("SLURM_STEP_ID")) and (box := container.from_env(env)) is not None:
        where = "outside SLURM" if outside else "inside your own srun step"
        raise SystemExit(
            f"multinode torchrun: {where} the profile's container ({container_spec.describe(box)}) cannot be applied: "
            "start the container yourself, or run `multinode torchrun` from the batch script so that it starts "
            "the step (the container comes from the environment profile)"
        )


def outside_slurm(env: Mapping[str, str]) -> bool:
    """No SLURM allocation to launch in: `multinode torchrun` runs a one-node torchrun here."""
    return not env.get("SLURM_JOB_ID") or not (env.get("SLURM_JOB_NODELIST") or env.get("NODELIST"))


def run_outside(opts: Sequence[str], script: Sequence[str], env: Mapping[str, str]) -> int:
    """A one-node torchrun, its lines labelled on the terminal (and, where `env` names a log stem, in that stem's
    node file too). A SIGUSR2 sent to this process reaches the workers, as SLURM's signal before the time limit
    does in a job: torchrun's agent starts with it ignored, and it is passed on to the workers (the ranks)."""
    local_nproc = option_value(opts, "--nproc_per_node", "--nproc-per-node") or str(max(count_devices(env), 1))
    log(f"no SLURM allocation: one-node torchrun with {local_nproc} process(es), Python {sys.executable}")
    nproc = int(local_nproc) if local_nproc.isdigit() else 0  # gpu/cpu/auto: torchrun counts
    torchrun = torchrun_command(opts, script, nproc=local_nproc)
    argv = labelled(torchrun, nproc, opts, echo=bool(nodelog.log_stem(env))) if nproc else torchrun
    before = signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # inherited by the agent (the workers set their own)
    proc = subprocess.Popen(argv, env=dict(env))

    def pass_on(signum: int, _frame: object) -> None:
        if nproc:  # the labeller passes it on to torchrun's workers
            forward(signum, _frame)
        else:
            nodelog.signal_workers(proc.pid, signum)

    def forward(signum: int, _frame: object) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    signal.signal(signal.SIGUSR2, pass_on)
    term = signal.signal(signal.SIGTERM, forward)
    try:
        code = proc.wait()
    finally:
        signal.signal(signal.SIGUSR2, before)
        signal.signal(signal.SIGTERM, term)
    return code if code >= 0 else 128 - code


# The variables an activated environment sets: its folder, which is sys.prefix for that environment's Python.
ACTIVATED_ENV_VARS = ("VIRTUAL_ENV", "CONDA_PREFIX")


def check_python(env: Mapping[str, str], prefix: str = sys.prefix, torch_found: bool | None = None) -> None:
    """torchrun, the network preflight and so the training run with this Python, the one that holds `multinode`
    (sys.executable), not whichever `python` an activated environment puts first on PATH: they need the plugin and
    torch in one interpreter, and this one is fixed by the install, not by PATH's order on a compute node. Without
    torch here that is an error before anything starts; an activated environment that is another one is said."""
    if torch_found is None:
        torch_found = importlib.util.find_spec("torch") is not None  # finds, does not import (seconds)
    if not torch_found:
        raise SystemExit(
            f"multinode torchrun: {sys.executable} (the Python that holds multinode, which runs torchrun and the "
            "training) has no torch: install the plugin into the environment that has your torch, or torch into "
            "this one"
        )
    for var in ACTIVATED_ENV_VARS:
        active = env.get(var, "")
        if active and os.path.realpath(active) != os.path.realpath(prefix):
            log(
                f"WARNING: {var}={active} is activated, but torchrun and the training run with {sys.executable} "
                f"(the Python that holds multinode, prefix {prefix}), with its torch and packages: install the "
                f"plugin into {active} to train with that environment's"
            )


def main(argv: Sequence[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        return print_help()
    opts, script = split_torchrun_args(argv)
    env = dict(os.environ)
    outside = outside_slurm(env)
    refuse_container_without_step(env)
    if outside:
        check_python(env)
        return run_outside(opts, script, env)
    if env.get("SLURM_STEP_ID"):
        cmd, step_env = step_command(env, opts, script)
        if network_check.limit_from_env(env):  # each task here sees only its own node: nothing to check against
            log("network preflight skipped: it runs when `multinode torchrun` starts the step itself")
        log(f"inside step {env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}: {shlex.join(cmd)}")
        # This process is a step task: USR2 would end it. Ignored here, inherited by torchrun's agent; the
        # workers install their own handler.
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        os.execve(cmd[0], cmd, step_env)
    alloc = read_allocation(env)
    box = container.from_env(env)  # the profile's container, from the job script's variables (container.py)
    if box is not None:
        log(f"each node's torchrun runs in {container_spec.describe(box)}")
    else:
        check_python(env)
    code = launch_with_spares(alloc, opts, script, env, box)
    preempt = env.get(protocol.PREEMPT_FILE_VAR)
    checkpointed = code == 0 and bool(preempt) and Path(str(preempt)).exists()
    if (notice := preemption.noticed(env, checkpointed, socket.gethostname().split(".")[0])) is not None:
        log(preemption.verdict(notice, code, checkpointed, env, time.time()))
    elif checkpointed:
        log("training checkpointed on the pre-time-limit signal")
    return EXIT_PREEMPTED if checkpointed else code
