"""`multinode torchrun [torchrun options] SCRIPT [ARGS]`: one torchrun per node of the SLURM allocation.

Inside an allocation (our job script or a hand-written one) it starts, in parallel, one
`srun --nodes=1 --ntasks=1 -w NODE ... torchrun --node_rank=i` per node, filling in --nnodes, --nproc_per_node
(GPUs per node), --master_addr and --master_port. torchrun's agent starts with SIGUSR2 ignored: SLURM's
`--signal=USR2@T` reaches every process of every step, and USR2's default action would kill the agent; the
workers install their own handler and checkpoint. If one node's torchrun fails, the others are stopped within
seconds and the exit names the failing node. Started by a user as one task per node of an srun step
(`srun --ntasks-per-node=1 multinode torchrun ...`) it runs that node's torchrun directly. Outside SLURM the same
command runs a one-node torchrun.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import protocol
from .protocol import EXIT_PREEMPTED

# Flags the launcher decides in a multi-node allocation; a user value would desynchronise the nodes.
OWNED = (
    "--node_rank",
    "--node-rank",
    "--nnodes",
    "--standalone",
    "--rdzv_endpoint",
    "--rdzv-endpoint",
    "--rdzv_backend",
    "--rdzv-backend",
)


def log(msg: str) -> None:
    print(f"[multinode torchrun] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Allocation:
    job_id: str
    nodes: tuple[str, ...]
    gpus_per_node: int
    cpus_per_task: int
    master_addr: str
    master_port: int


@dataclass(frozen=True)
class NodeLaunch:
    node: str
    rank: int
    argv: tuple[str, ...]


def split_torchrun_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(torchrun options, [script, *script args]); uses torchrun's own parser to know which options take values."""
    from torch.distributed.run import get_args_parser  # lazy: torch is only needed once we launch

    parser = get_args_parser()
    takes_value = {opt: action.nargs != 0 for action in parser._actions for opt in action.option_strings}
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return list(argv[:i]), list(argv[i + 1 :])
        if not token.startswith("-") or token == "-":
            break
        name = token.split("=", 1)[0]
        if name not in takes_value:
            raise SystemExit(f"multinode torchrun: unknown torchrun option {token!r}")
        i += 1 if ("=" in token or not takes_value[name]) else 2
    if i >= len(argv):
        raise SystemExit("multinode torchrun: no training script given (usage: multinode torchrun [opts] SCRIPT)")
    return list(argv[:i]), list(argv[i:])


def _option(opts: Sequence[str], *names: str) -> str | None:
    for i, token in enumerate(opts):
        for name in names:
            if token == name and i + 1 < len(opts):
                return opts[i + 1]
            if token.startswith(name + "="):
                return token.split("=", 1)[1]
    return None


def _count_devices(env: Mapping[str, str]) -> int:
    for key in (protocol.GPUS_PER_NODE_VAR, "SLURM_GPUS_ON_NODE"):
        value = env.get(key, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    per_node = env.get("SLURM_GPUS_PER_NODE", "").split(":")[-1]
    if per_node.isdigit() and int(per_node) > 0:
        return int(per_node)
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    if visible and visible not in ("-1", "NoDevFiles"):
        return len([d for d in visible.split(",") if d])
    return 0


def hostnames(nodelist: str) -> list[str]:
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()


def head_address(head: str, peers: Sequence[str]) -> str:
    """The head node's address as its peers reach it; never a loopback entry (Debian maps hostname to 127.0.1.1)."""
    try:
        addr = socket.getaddrinfo(head, None, socket.AF_INET)[0][4][0]
        if not addr.startswith("127."):
            return addr
    except OSError:
        pass
    for peer in peers:
        try:
            peer_addr = socket.getaddrinfo(peer, None, socket.AF_INET)[0][4][0]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((peer_addr, 9))  # UDP connect picks the route; nothing is sent
                return s.getsockname()[0]
        except OSError:
            continue
    return head


def free_port(start: int, tries: int = 50) -> int:
    """The first port from `start` that this (head) node can bind: a busy derived port moves on, not fails."""
    for port in range(start, min(start + tries, 65536)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
                return port
            except OSError:
                continue
    return start


def read_allocation(env: Mapping[str, str]) -> Allocation:
    job_id = env["SLURM_JOB_ID"]
    nodes = tuple(env["NODELIST"].split()) if env.get("NODELIST") else tuple(hostnames(env["SLURM_JOB_NODELIST"]))
    cpus = int(env.get(protocol.CPUS_PER_TASK_VAR) or env.get("SLURM_CPUS_PER_TASK") or 1)
    addr = env.get("MASTER_ADDR") or head_address(nodes[0], nodes[1:])
    port = int(env.get("MASTER_PORT") or protocol.master_port(int(job_id)))
    if socket.gethostname().split(".")[0] == nodes[0]:
        port = free_port(port)
    return Allocation(job_id, nodes, _count_devices(env), cpus, addr, port)


def refuse_owned(opts: Sequence[str]) -> None:
    for name in OWNED:
        if _option(opts, name) is not None or name in opts:
            raise SystemExit(f"multinode torchrun: {name} is set by the launcher inside a SLURM allocation")


def nproc_for(alloc: Allocation, opts: Sequence[str]) -> int:
    """Processes per node: the user's --nproc_per_node, else the node's GPUs (fake ones count), else 1."""
    given = _option(opts, "--nproc_per_node", "--nproc-per-node")
    if given is not None:
        if not given.isdigit() or int(given) < 1:
            raise SystemExit(f"multinode torchrun: --nproc_per_node must be a positive integer, got {given!r}")
        return int(given)
    return max(alloc.gpus_per_node, 1)


def plan(
    alloc: Allocation,
    opts: Sequence[str],
    script: Sequence[str],
    python: str = sys.executable,
) -> list[NodeLaunch]:
    """The srun command line for every node: what `run_nodes` starts, and what tests check."""
    refuse_owned(opts)
    nproc = nproc_for(alloc, opts)
    launches = []
    for rank, node in enumerate(alloc.nodes):
        # Explicit CPUs (srun 22.05 does not inherit --cpus-per-task) and --mem=0: all of the job's memory on
        # the node, not a DefMemPerCPU-sized slice. The step inherits the job's GPUs on its node.
        srun = [
            "srun",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={node}",
            f"--cpus-per-task={alloc.cpus_per_task}",
            "--mem=0",
            "--kill-on-bad-exit=1",
            "--export=ALL",
            f"--job-name=torchrun-node{rank}",
        ]
        torchrun = [
            python,
            "-m",
            "torch.distributed.run",
            f"--nnodes={len(alloc.nodes)}",
            f"--nproc_per_node={nproc}",
            f"--node_rank={rank}",
            f"--master_addr={alloc.master_addr}",
            f"--master_port={alloc.master_port}",
            *_strip_nproc(opts),
        ]
        # The agent ignores USR2 (an inherited ignore); the workers' own handler overrides it.
        agent = ["bash", "-c", 'trap "" USR2; exec "$@"', "multinode-agent", *torchrun, *script]
        launches.append(NodeLaunch(node, rank, tuple(srun + agent)))
    return launches


def _strip_nproc(opts: Sequence[str]) -> list[str]:
    out, skip = [], False
    for token in opts:
        if skip:
            skip = False
            continue
        if token in ("--nproc_per_node", "--nproc-per-node"):
            skip = True
            continue
        if token.startswith(("--nproc_per_node=", "--nproc-per-node=")):
            continue
        out.append(token)
    return out


def worker_env(alloc: Allocation, nproc: int, env: Mapping[str, str]) -> dict[str, str]:
    """OMP threads = the node's CPUs shared by its processes (Snakemake's shell set it to the rule's threads)."""
    omp = str(max(1, alloc.cpus_per_task // max(nproc, 1)))
    return dict(env) | {"OMP_NUM_THREADS": omp, "MASTER_ADDR": alloc.master_addr, "MASTER_PORT": str(alloc.master_port)}


def run_nodes(launches: Sequence[NodeLaunch], env: Mapping[str, str], grace: float = 10.0) -> int:
    procs = {ln.rank: subprocess.Popen(list(ln.argv), env=dict(env)) for ln in launches}
    by_rank = {ln.rank: ln for ln in launches}
    stopping = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    failed: tuple[int, int] | None = None
    while any(p.poll() is None for p in procs.values()):
        for rank, p in procs.items():
            code = p.poll()
            if code not in (None, 0) and failed is None:
                failed = (rank, code)
        if failed is not None and not stopping:
            stopping = True
            rank, code = failed
            log(f"node {by_rank[rank].node} (node_rank {rank}) failed with exit code {code}; stopping the other nodes")
            _stop_all(procs, grace)
        time.sleep(0.2)
    if failed is None:
        failed = next(((r, p.returncode) for r, p in procs.items() if p.returncode != 0), None)
    if failed is not None:
        rank, code = failed
        node = by_rank[rank].node
        log(f"FAILED: node {node} (node_rank {rank}) exited with {code}")
        if path := env.get(protocol.FAILED_NODE_FILE_VAR):
            Path(path).write_text(f"{node}\n")
        return code if code > 0 else 1
    return 0


def _stop_all(procs: Mapping[int, subprocess.Popen], grace: float) -> None:
    alive = [p for p in procs.values() if p.poll() is None]
    for p in alive:
        p.send_signal(signal.SIGTERM)  # srun forwards it to the step's tasks
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.poll() is None for p in alive):
        time.sleep(0.1)
    for p in alive:
        if p.poll() is None:  # two SIGINTs within a second make srun kill the step outright
            p.send_signal(signal.SIGINT)
            time.sleep(0.1)
            p.send_signal(signal.SIGINT)
    for p in alive:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()


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
    me = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    alloc = Allocation(
        env["SLURM_JOB_ID"],
        tuple(nodes),
        _count_devices(env),
        int(env.get("SLURM_CPUS_PER_TASK") or 1),
        env.get("MASTER_ADDR") or head_address(nodes[0], nodes[1:]),
        # the same on every node without talking to each other: job and step id
        int(env.get("MASTER_PORT") or protocol.master_port(int(env["SLURM_JOB_ID"]), int(env.get("SLURM_STEP_ID", 0)))),
    )
    refuse_owned(opts)
    nproc = nproc_for(alloc, opts)
    cmd = [
        python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={len(nodes)}",
        f"--nproc_per_node={nproc}",
        f"--node_rank={nodes.index(me)}",
        f"--master_addr={alloc.master_addr}",
        f"--master_port={alloc.master_port}",
        *_strip_nproc(opts),
        *script,
    ]
    return cmd, worker_env(alloc, nproc, env)


def main(argv: Sequence[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    opts, script = split_torchrun_args(argv)
    env = dict(os.environ)
    if not env.get("SLURM_JOB_ID") or not (env.get("SLURM_JOB_NODELIST") or env.get("NODELIST")):
        nproc = _option(opts, "--nproc_per_node", "--nproc-per-node") or str(max(_count_devices(env), 1))
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            *_strip_nproc(opts),
            *script,
        ]
        log(f"no SLURM allocation: one-node torchrun with {nproc} process(es)")
        return subprocess.call(cmd, env=env)
    if env.get("SLURM_STEP_ID"):
        cmd, step_env = step_command(env, opts, script)
        log(f"inside step {env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}: {' '.join(cmd[3:8])}")
        # This process is a step task: USR2 would end it. Ignored here, inherited by torchrun's agent; the
        # workers install their own handler.
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        os.execve(cmd[0], cmd, step_env)
    alloc = read_allocation(env)
    launches = plan(alloc, opts, script)
    nproc = nproc_for(alloc, opts)
    log(
        f"job {alloc.job_id}: {len(alloc.nodes)} node(s) x {nproc} process(es), "
        f"master {alloc.master_addr}:{alloc.master_port}"
    )
    for ln in launches:
        log(f"launching on {ln.node}, node_rank={ln.rank}")
    code = run_nodes(launches, worker_env(alloc, nproc, env))
    preempt = env.get(protocol.PREEMPT_FILE_VAR)
    if code == 0 and preempt and Path(preempt).exists():
        log("training checkpointed on the pre-time-limit signal")
        return EXIT_PREEMPTED
    return code
