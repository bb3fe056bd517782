"""The SLURM allocation a launch runs in: nodes, devices per node, CPUs per task and the rendezvous address.

Read from the environment of the job script (the launcher) or of an srun step (a user's own step); used by the
launcher, the network check and the preview.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from snakemake_executor_multinode.contract import protocol


@dataclass(frozen=True)
class Allocation:
    job_id: str
    nodes: tuple[str, ...]
    gpus_per_node: int
    cpus_per_task: int
    master_addr: str
    master_port: int


def count_devices(env: Mapping[str, str]) -> int:
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
        addr = str(socket.getaddrinfo(head, None, socket.AF_INET)[0][4][0])
        if not addr.startswith("127."):
            return addr
    except OSError:
        pass
    for peer in peers:
        try:
            peer_addr = socket.getaddrinfo(peer, None, socket.AF_INET)[0][4][0]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((peer_addr, 9))  # UDP connect picks the route; nothing is sent
                return str(s.getsockname()[0])
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
    """The launcher's allocation, in the job script's environment (NODELIST and MASTER_* from the job script)."""
    nodes = tuple(env["NODELIST"].split()) if env.get("NODELIST") else tuple(hostnames(env["SLURM_JOB_NODELIST"]))
    cpus = int(env.get(protocol.CPUS_PER_TASK_VAR) or env.get("SLURM_CPUS_PER_TASK") or 1)
    return allocation(env, nodes, cpus, bind_on_head=True)


def allocation(
    env: Mapping[str, str], nodes: Sequence[str], cpus: int, step_id: int = 0, bind_on_head: bool = False
) -> Allocation:
    """The one builder: the rendezvous address and port from the job script's MASTER_* where set, else derived from
    the job (and step) id so that every node derives the same; on the head node a busy port moves on."""
    job_id = env["SLURM_JOB_ID"]
    addr = env.get("MASTER_ADDR") or head_address(nodes[0], nodes[1:])
    port = int(env.get("MASTER_PORT") or protocol.master_port(int(job_id), step_id))
    if bind_on_head and socket.gethostname().split(".")[0] == nodes[0]:
        port = free_port(port)
    return Allocation(job_id, tuple(nodes), count_devices(env), cpus, addr, port)
