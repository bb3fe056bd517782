"""The network preflight: one tiny all-reduce over every rank of the job before the training starts.

Run by the launcher's step on every node, before torchrun (`network_check` profile key, $MULTINODE_NETWORK_CHECK):
    python -m snakemake_executor_multinode.launching.network_check --master-addr A --port P --nnodes N --nproc K
        --timeout S [--nodes n1,n2,...]          (the node rank is $SLURM_NODEID)

One process per node imports torch once and forks its K workers (no torchrun, no second torch import per rank);
worker r of node n is rank n*K + r of N*K. NCCL where the node has CUDA devices, gloo otherwise, through the same
MASTER_ADDR and the same *_SOCKET_IFNAME variables as the training, on a port of its own (protocol.network_check_port).
The head node's process also serves a small TCPStore on that port: the nodes say hello there, report a failure
there (so the others stop at once) and pass a last barrier there, so torchrun starts only once every node passed.

A failure ends the node's task within the limit (60 s by default), with one line naming the node, the interface
and the backend's own error (NCCL_DEBUG lines for NCCL), so srun's --kill-on-bad-exit ends the step: not a hang
until the training's collective timeout. Faults the backend would only retry on until its timeout (no route to
MASTER_ADDR, a named interface that is down) are found first, locally, in well under a second.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import socket
import struct
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.launching.allocation import Allocation, free_port

PREFIX = "[multinode preflight]"
MODULE = "snakemake_executor_multinode.launching.network_check"
EXIT_FAILED = protocol.EXIT_PREFLIGHT  # not the training's failure: no in-job restart follows
QUOTED_LINES = 12  # backend lines (NCCL_DEBUG, c10d) quoted in a failure, the last ones
LINE_LIMIT = 900  # srun splits longer lines (about 1 KiB) and interleaves the pieces with other nodes' lines
STORE_TRY_S = 2.0  # each store operation after the connection
PEER_NOTICE_S = 3.0  # a failing node waits this long at most for the store, so the others stop at once
FINAL_WAIT_S = 10.0  # the head waits this long at most for every node to see the final barrier pass

# Linux ioctls for an interface's flags and IPv4 address (per network namespace, unlike /sys/class/net, whose view
# is the namespace that mounted sysfs).
_SIOCGIFFLAGS = 0x8913
_SIOCGIFADDR = 0x8915
_IFF_UP = 0x1


def log(text: str) -> None:
    """One write per line, each line short enough that srun never splits it."""
    out = "".join(f"{line[:LINE_LIMIT]}\n" for line in text.splitlines())
    os.write(2, out.encode(errors="replace"))


# --- the launcher's side: is it on, and the command every node runs ---------------------------------------------------
def limit_from_env(env: Mapping[str, str]) -> int:
    """The check's limit in seconds from $MULTINODE_NETWORK_CHECK; 0 (or unset, empty, false) means off."""
    raw = env.get(protocol.NETWORK_CHECK_VAR, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return 0
    if raw in ("true", "yes", "on"):
        return protocol.NETWORK_CHECK_DEFAULT_S
    if not raw.isdigit():
        raise SystemExit(
            f"multinode torchrun: {protocol.NETWORK_CHECK_VAR}={raw!r}: must be the network check's limit in "
            "seconds (a positive integer), or 0 / false for no check"
        )
    return int(raw)


def command(
    alloc: Allocation,
    nproc: int,
    python: str = sys.executable,
    *,
    contained: bool = False,
    env: Mapping[str, str] = os.environ,
) -> list[str]:
    """The preflight every node of the launcher's step runs before torchrun; [] when the check is off. Runs on the
    head node (the launcher's), so the port it picks is one the head can bind."""
    limit = limit_from_env(env)
    if not limit:
        return []
    if contained:  # the check would run with the node's python, outside the image: not yet
        log(f"{PREFIX} skipped: the training runs in a container, and the check does not run in one yet")
        return []
    port = free_port(protocol.network_check_port(alloc.master_port))
    if port == alloc.master_port:  # only a user's own port >= the preflight range can meet it
        port = free_port(port + 1)
    return [
        python,
        "-m",
        MODULE,
        f"--master-addr={alloc.master_addr}",
        f"--port={port}",
        f"--nnodes={len(alloc.nodes)}",
        f"--nproc={nproc}",
        f"--timeout={limit}",
        f"--nodes={','.join(alloc.nodes)}",
    ]


# --- interfaces: what the backend will use, said in a line ------------------------------------------------------------
@dataclass(frozen=True)
class Route:
    """How this node reaches MASTER_ADDR: the interface and source address the kernel picks, or the error."""

    addr: str
    iface: str = ""
    src: str = ""
    error: str = ""

    def text(self) -> str:
        if self.error:
            return f"no route to MASTER_ADDR {self.addr} ({self.error})"
        return f"iface {self.iface or '?'} {self.src} -> MASTER_ADDR {self.addr}"


def _ifreq(name: str) -> bytes:
    return struct.pack("256s", name.encode()[:15])


def iface_state(name: str) -> str:
    """The interface's state in this network namespace: up, down or missing."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            flags = struct.unpack("H", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, _ifreq(name))[16:18])[0]
        except OSError:
            return "missing"
    return "up" if flags & _IFF_UP else "down"


def iface_addr(name: str) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            return socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, _ifreq(name))[20:24])
        except OSError:
            return ""


def route_to(addr: str, port: int) -> Route:
    """The kernel's route to MASTER_ADDR (a UDP connect picks it and sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addr, port))
            src = str(s.getsockname()[0])
    except OSError as err:
        return Route(addr, error=f"[Errno {err.errno}] {err.strerror}" if err.errno else str(err))
    names = [name for _, name in socket.if_nameindex()]
    iface = next((n for n in names if iface_addr(n) == src), "")
    return Route(addr, iface, src)


def named_ifaces(backend: str, env: Mapping[str, str]) -> tuple[str, str]:
    """The variable that picks the backend's interface, and its value ("" when unset)."""
    var = "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"
    return var, env.get(var, "")


def down_ifaces(backend: str, env: Mapping[str, str]) -> list[str]:
    """Interfaces gloo is told to use that exist but are down: gloo would bind them and retry its peers until the
    timeout. (A missing one, gloo reports at once in its own words; NCCL's names are prefixes, NCCL decides.)"""
    var, value = named_ifaces(backend, env)
    if backend != "gloo" or not value:
        return []
    return [name for name in value.split(",") if name and iface_state(name) == "down"]


def interface_text(backend: str, env: Mapping[str, str], route: Route) -> str:
    """The interface(s) the backend uses, as the failure and the ok lines name them."""
    var, value = named_ifaces(backend, env)
    parts = []
    if value:
        states = [f"{n} {iface_state(n)}" for n in value.split(",") if n and backend == "gloo"]
        parts.append(f"{var}={value}" + (f" ({', '.join(states)})" if states else ""))
    if backend == "nccl" and env.get("NCCL_IB_HCA"):
        parts.append(f"NCCL_IB_HCA={env['NCCL_IB_HCA']}")
    parts.append(route.text())
    return ", ".join(parts)


# --- the lines it prints ----------------------------------------------------------------------------------------------
def ok_line(node: str, world: int, seconds: float, total: float, backend: str, iface: str) -> str:
    return (
        f"{PREFIX} {node}: all-reduce over {world} ranks ok in {seconds:.1f} s "
        f"({backend}, {iface}; {total:.1f} s with start-up)"
    )


def failure_message(
    node: str, node_rank: int, backend: str, iface: str, error: str, backend_lines: Sequence[str] = ()
) -> str:
    """The failure, as the job log and the launcher show it: the first line names the node, the backend, the
    interface and the error's first line; then the error's other lines and the backend's own log lines."""
    first, *rest = [line.rstrip() for line in error.strip().splitlines() if line.strip()] or ["(no message)"]
    lines = [f"{PREFIX} FAILED on {node} (node_rank {node_rank}): {backend}, {iface}: {first}"]
    lines += [f"{PREFIX}   {line}" for line in rest[:QUOTED_LINES]]
    if backend_lines:
        lines.append(f"{PREFIX}   {backend}'s own lines:")
        lines += [f"{PREFIX}   {line.rstrip()}" for line in backend_lines[-QUOTED_LINES:]]
    lines.append(f"{PREFIX} the training was not started on {node} (network_check: false turns the check off)")
    return "\n".join(lines)


def nccl_lines(paths: Sequence[Path]) -> list[str]:
    """The NCCL_DEBUG lines (WARN, or INFO where the profile asked for them) the workers wrote to their files."""
    out: list[str] = []
    for path in paths:
        try:
            out += [line for line in path.read_text(errors="replace").splitlines() if "NCCL" in line]
        except OSError:
            continue
    return out


# --- one node's check -------------------------------------------------------------------------------------------------
@dataclass
class Check:
    master_addr: str
    port: int
    nnodes: int
    nproc: int
    node_rank: int
    node: str
    timeout: float
    nodes: tuple[str, ...] = ()
    failed_node_file: str = ""
    started: float = field(default_factory=time.monotonic)

    @property
    def world(self) -> int:
        return self.nnodes * self.nproc

    @property
    def deadline(self) -> float:
        return self.started + self.timeout

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def name_of(self, node_rank: int) -> str:
        return self.nodes[node_rank] if node_rank < len(self.nodes) else f"node_rank {node_rank}"

    def blame(self, node: str) -> None:
        """The node to blame, in $MULTINODE_FAILED_NODE_FILE (the first writer in the job wins, as in launcher.py)."""
        if (error := protocol.record_failed_node(self.failed_node_file, node)) is not None:
            log(f"ERROR: {error}")


def _worker(check: Check, backend: str, local_rank: int, conn: Any, nccl_log: str) -> None:
    """One rank: join the group through the head's store, all-reduce a 1, compare with the world size."""
    import torch
    import torch.distributed as dist

    rank = check.node_rank * check.nproc + local_rank
    try:
        if backend == "nccl":
            os.environ.setdefault("NCCL_DEBUG", "WARN")
            os.environ["NCCL_DEBUG_FILE"] = nccl_log  # quoted on failure; the training's own setting is untouched
            torch.cuda.set_device(local_rank % torch.cuda.device_count())
        t0 = time.monotonic()
        limit = timedelta(seconds=max(1.0, check.left()))
        store = dist.TCPStore(check.master_addr, check.port, is_master=False, timeout=limit)
        dist.init_process_group(
            backend, store=dist.PrefixStore("pg", store), rank=rank, world_size=check.world, timeout=limit
        )
        one = torch.ones(1, device="cuda" if backend == "nccl" else "cpu")
        dist.all_reduce(one)
        total = float(one.item())  # waits for the collective (NCCL runs it on a stream)
        if total != check.world:
            raise RuntimeError(f"all-reduce of 1 over {check.world} ranks gave {total:g}")
        conn.send(("ok", time.monotonic() - t0))
        dist.destroy_process_group()
    except BaseException as err:  # noqa: BLE001 - every failure is reported to the node's process, then exits
        conn.send(("failed", "".join(traceback.format_exception_only(type(err), err))))
    finally:
        conn.close()


class Node:
    """This node's part: the local checks, the workers, the store (served on the head), the verdict."""

    def __init__(self, check: Check, env: Mapping[str, str]) -> None:
        self.check, self.env = check, env
        self.route = route_to(check.master_addr, check.port)
        self.backend = "gloo"
        self.store: Any = None
        self.store_error = ""
        self.connecting: Any = None  # the thread reaching the head's store (not the head)
        self.workers: list[tuple[Any, Any]] = []
        self.nccl_logs: list[Path] = []
        self.tmp = tempfile.mkdtemp(prefix="multinode-netcheck-")

    # verdicts
    def fail(self, error: str, lines: Sequence[str] = ()) -> int:
        c = self.check
        message = failure_message(c.node, c.node_rank, self.backend, self.iface(), error, lines)
        log(message)
        c.blame(c.node)
        if self.store is None and self.connecting is not None:  # tell the peers if the store is moments away
            self.connecting.join(timeout=min(PEER_NOTICE_S, c.left()))
        if self.store is not None:
            try:
                self.store.set(f"fail/{c.node_rank}", message.splitlines()[0])
                self.store.add("failed", 1)
            except Exception:  # noqa: BLE001 - the peers stop on their own limit then
                pass
        self.stop_workers()
        return EXIT_FAILED

    def iface(self) -> str:
        return interface_text(self.backend, self.env, self.route)

    def stop_workers(self) -> None:
        for proc, _ in self.workers:
            if proc.is_alive():
                proc.kill()
        for proc, _ in self.workers:
            proc.join(timeout=5)

    # steps
    def run(self) -> int:
        c = self.check
        if self.route.error:  # the store's client would retry this until the limit: say it now (the route is in the
            os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # interface part; c10d's error is quoted once)
            return self.fail(f"c10d: {self.c10d_error()}")
        # c10d logs every failed connection attempt with a C++ stack; its errors (and the exception we quote) stay
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        import torch  # once per node: the workers are forked from here

        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # asks NVML: the forked workers may use CUDA
        self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        if down := down_ifaces(self.backend, self.env):
            return self.fail(f"interface {', '.join(down)} is down (ip link: no UP flag) on {c.node}")
        self.start_workers()
        if c.node_rank == 0:
            error = self.serve()
            if error:
                return self.fail(f"cannot serve the preflight rendezvous on port {c.port}: {error}")
        return self.watch()

    def c10d_error(self) -> str:
        """c10d's own words for the unreachable rendezvous (a short try: the route is already known missing)."""
        try:
            import torch.distributed as dist

            dist.TCPStore(self.check.master_addr, self.check.port, is_master=False, timeout=timedelta(seconds=2))
        except Exception as err:  # noqa: BLE001 - its message is what we want
            return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return "connected (the route came back)"

    def start_workers(self) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("fork")  # torch is imported: forking is the cheap start
        for local in range(self.check.nproc):
            nccl_log = os.path.join(self.tmp, f"nccl.{local}.txt")  # .log, .sh, .first: job files' suffixes
            self.nccl_logs.append(Path(nccl_log))
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_worker, args=(self.check, self.backend, local, child, nccl_log), daemon=True)
            proc.start()
            child.close()
            self.workers.append((proc, parent))

    def serve(self) -> str:
        import torch.distributed as dist

        try:
            self.store = dist.TCPStore(
                "0.0.0.0",
                self.check.port,
                is_master=True,
                wait_for_workers=False,
                timeout=timedelta(seconds=STORE_TRY_S),
            )
        except Exception as err:  # noqa: BLE001
            return str(err).strip().splitlines()[0]
        self.store.set(f"hello/{self.check.node_rank}", self.check.node)
        return ""

    def connect(self) -> None:
        """Reaches the head's store in a thread (one attempt over the whole limit: c10d logs each failed attempt),
        so that the workers are watched meanwhile."""
        import threading

        import torch.distributed as dist

        c = self.check

        def attempt() -> None:
            try:
                store = dist.TCPStore(c.master_addr, c.port, is_master=False, timeout=timedelta(seconds=c.left()))
                store.set_timeout(timedelta(seconds=STORE_TRY_S))
                store.set(f"hello/{c.node_rank}", c.node)
                self.store = store
            except Exception as err:  # noqa: BLE001 - quoted if the limit passes
                self.store_error = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__

        self.connecting = threading.Thread(target=attempt, daemon=True)
        self.connecting.start()

    def watch(self) -> int:
        c = self.check
        results: dict[int, tuple[str, Any]] = {}
        passed = False
        if self.store is None:
            self.connect()
        while True:
            if time.monotonic() >= c.deadline:
                return self.timed_out(results)
            for local, (proc, conn) in enumerate(self.workers):
                if local in results:
                    continue
                if conn.poll(0):
                    try:
                        results[local] = conn.recv()
                    except EOFError:
                        results[local] = ("failed", f"worker {local} died (exit code {proc.exitcode})")
                elif not proc.is_alive() and not conn.poll():
                    results[local] = ("failed", f"worker {local} died (exit code {proc.exitcode})")
                if results.get(local, ("",))[0] == "failed":
                    if self.peer_reported():  # its failure made ours: the blame is the peer's
                        return self.peer_failed()
                    return self.fail(results[local][1], nccl_lines(self.nccl_logs))
            if self.store is None:
                time.sleep(0.05)
                continue
            try:
                if self.store.add("failed", 0) > 0:
                    return self.peer_failed()
                if len(results) == c.nproc and not passed:
                    passed = True
                    self.store.add("ok", 1)
                if passed and self.store.add("ok", 0) >= c.nnodes:
                    return self.succeed(results)
            except Exception as err:  # noqa: BLE001 - the head's store is gone: it failed, or ended
                return self.fail(f"lost the preflight rendezvous at {c.master_addr}:{c.port}: {err}")
            time.sleep(0.05)

    def peer_reported(self) -> bool:
        try:
            return self.store is not None and self.store.add("failed", 0) > 0
        except Exception:  # noqa: BLE001
            return False

    def succeed(self, results: Mapping[int, tuple[str, Any]]) -> int:
        c = self.check
        seconds = max(float(r[1]) for r in results.values())
        log(ok_line(c.node, c.world, seconds, time.monotonic() - c.started, self.backend, self.iface()))
        self.store.add("done", 1)
        if c.node_rank == 0:  # the store lives here: stay until every node has seen the barrier pass
            end = time.monotonic() + FINAL_WAIT_S
            while self.store.add("done", 0) < c.nnodes and time.monotonic() < end:
                time.sleep(0.05)
        self.stop_workers()
        return 0

    def peer_failed(self) -> int:
        """Another node failed and said so: stop, and leave the blame to it (its exit reaches srun first)."""
        c = self.check
        failed = [r for r in range(c.nnodes) if self.store.check([f"fail/{r}"])]
        who = ", ".join(c.name_of(r) for r in failed) or "another node"
        log(f"{PREFIX} {c.node}: stopping: {who} failed the preflight; the training was not started")
        self.stop_workers()
        # srun's --kill-on-bad-exit ends this task once the failing node's exit reaches it; should that never come,
        # end at the limit.
        time.sleep(c.left() + 2)
        return EXIT_FAILED

    def timed_out(self, results: Mapping[int, tuple[str, Any]]) -> int:
        c = self.check
        if self.store is None:
            return self.fail(
                f"no answer from the preflight rendezvous at {c.master_addr}:{c.port} within {c.timeout:g} s; "
                f"c10d: {self.store_error or 'still trying to connect'}"
            )
        try:
            missing = [r for r in range(c.nnodes) if not self.store.check([f"hello/{r}"])]
        except Exception:  # noqa: BLE001
            missing = []
        if missing:
            names = ", ".join(f"{c.name_of(r)} (node_rank {r})" for r in missing)
            log(
                f"{PREFIX} {c.node}: {names} never reached the preflight rendezvous at {c.master_addr}:{c.port} "
                f"within {c.timeout:g} s: look at that node's network"
            )
            c.blame(c.name_of(missing[0]))
        waiting = c.nproc - len(results)
        return self.fail(
            f"the all-reduce over {c.world} ranks did not complete within {c.timeout:g} s "
            f"({waiting} of this node's {c.nproc} ranks still waiting)",
            nccl_lines(self.nccl_logs),
        )


def parse(argv: Sequence[str], env: Mapping[str, str]) -> Check:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    parser.add_argument("--master-addr", default=env.get("MASTER_ADDR", ""))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--nnodes", type=int, required=True)
    parser.add_argument("--nproc", type=int, required=True)
    parser.add_argument("--node-rank", type=int, default=int(env.get("SLURM_NODEID", "0")))
    parser.add_argument("--timeout", type=float, default=float(protocol.NETWORK_CHECK_DEFAULT_S))
    parser.add_argument("--nodes", default="", help="the job's nodes in node-rank order, for the messages")
    args = parser.parse_args(list(argv))
    if not args.master_addr:
        parser.error("--master-addr (or $MASTER_ADDR) is required")
    node = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    return Check(
        master_addr=args.master_addr,
        port=args.port,
        nnodes=args.nnodes,
        nproc=args.nproc,
        node_rank=args.node_rank,
        node=node,
        timeout=args.timeout,
        nodes=tuple(n for n in args.nodes.split(",") if n),
        failed_node_file=env.get(protocol.FAILED_NODE_FILE_VAR, ""),
    )


def main(argv: Sequence[str] | None = None) -> int:
    check = parse(sys.argv[1:] if argv is None else argv, os.environ)
    return Node(check, os.environ).run()


if __name__ == "__main__":
    sys.exit(main())
