"""What a sandbox cluster looks like, and the config files that describe it to SLURM."""

from __future__ import annotations

import json
import os
import socket
import zlib
from dataclasses import asdict, dataclass, fields
from importlib import resources
from pathlib import Path
from string import Template

from snakemake_executor_multinode.contract.releases import DEFAULT as DEFAULT_RELEASE

from .errors import ClusterError
from .releases import release

DEFAULT_DIR = Path(os.environ.get("MULTINODE_CLUSTER_DIR", "/var/tmp/multinode-cluster"))
SLOTS = (20, 220)  # subnets 172.31.20.0/24 .. 172.31.219.0/24
PORT_BASE = 17000  # daemon ports PORT_BASE + 10 * slot + 6..9
PREEMPTING = "urgent"  # the partition whose jobs preempt the default one's (`up --preemption`); others check this name
PREEMPT_MODES = ("requeue", "cancel")  # slurm.conf's PreemptMode values the sandbox offers, in lower case


def slot_for(directory: Path) -> int:
    """A stable number for a cluster folder; two folders that share one are told apart by `up` (see cluster.py)."""
    return SLOTS[0] + zlib.crc32(str(directory).encode()) % (SLOTS[1] - SLOTS[0])


@dataclass(frozen=True)
class ClusterSpec:
    dir: Path = DEFAULT_DIR
    nodes: int = 3
    cpus: int = 4
    gpus: int = 8
    mem_mb: int = 64000
    accounting: bool = True
    partition: str = "gpu"
    cluster_name: str = "multinode"
    cred_expire: int = 10
    sched_interval: int = 2
    kill_wait: int = 30
    min_job_age: int = 300
    # How slurmd tracks a job's processes: "cgroup" (a job's end kills all of them; the fallback where the host has
    # no cgroup v1 freezer is linuxproc, see cgroups.py) or "linuxproc" (the process tree only, as before).
    # Beware: under proctrack/cgroup, SLURM's non-KILL signals (scancel --signal, --signal=USR2@T) reach only each
    # step's task processes, not their children; under linuxproc they reach every process of the tree.
    proctrack: str = "cgroup"
    # The cluster's network identity: subnet, bridge, namespace and link names and daemon ports. Derived from the
    # folder (see `slot_for`), so that clusters in different folders (a user's sandbox and the test suite's) run
    # side by side and `down` of one never touches the other's network. Saved in cluster.json with the rest.
    slot: int = -1
    # Which SLURM runs it, daemons and clients: a release of contract/releases.py (how each runs: releases.py).
    slurm: str = DEFAULT_RELEASE
    # Preemption as on a shared cluster (`up --preemption`): a partition PREEMPTING over the same nodes, of a higher
    # PriorityTier, whose jobs preempt the default partition's (PreemptType=preempt/partition_prio) after
    # `grace_time` seconds of SIGTERM (GraceTime), requeued or cancelled (`preempt_mode`, the cluster's PreemptMode).
    preemption: bool = False
    grace_time: int = 60
    preempt_mode: str = "requeue"

    def __post_init__(self) -> None:
        for name, low, high in (("nodes", 1, 64), ("cpus", 1, 1024), ("gpus", 0, 64), ("mem_mb", 100, 10**8)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ClusterError(f"--{name.replace('_', '-')} must be an integer in {low}..{high}, got {value!r}")
        if self.proctrack not in ("cgroup", "linuxproc"):
            raise ClusterError(f"proctrack must be 'cgroup' or 'linuxproc', got {self.proctrack!r}")
        release(self.slurm)  # a ClusterError naming the releases there are
        if not isinstance(self.grace_time, int) or isinstance(self.grace_time, bool) or self.grace_time < 0:
            raise ClusterError(f"--grace-time must be a whole number of seconds, 0 or more, got {self.grace_time!r}")
        if self.preempt_mode not in PREEMPT_MODES:
            raise ClusterError(f"--preempt-mode must be {' or '.join(PREEMPT_MODES)}, got {self.preempt_mode!r}")
        if self.slot == -1:
            object.__setattr__(self, "slot", slot_for(self.dir))
        if not isinstance(self.slot, int) or not SLOTS[0] <= self.slot < SLOTS[1]:
            raise ClusterError(f"slot must be an integer in {SLOTS[0]}..{SLOTS[1] - 1}, got {self.slot!r}")

    # --- network identity (all from the slot) ----------------------------------------------------
    @property
    def subnet(self) -> str:
        """A /24 that exists only on this cluster's bridge and in its namespaces."""
        return f"172.31.{self.slot}"

    @property
    def bridge(self) -> str:
        return f"mnbr{self.slot}"

    def host_link(self, i: int) -> str:
        """The host end of node i's veth pair (interface names have at most 15 characters)."""
        return f"mn{self.slot}v{i}"

    @property
    def ctld_port(self) -> int:
        return PORT_BASE + 10 * self.slot + 7

    @property
    def slurmd_port(self) -> int:
        return PORT_BASE + 10 * self.slot + 8

    @property
    def dbd_port(self) -> int:
        return PORT_BASE + 10 * self.slot + 9

    @property
    def db_port(self) -> int:
        return PORT_BASE + 10 * self.slot + 6

    # --- derived names ---------------------------------------------------------------------------
    @property
    def ctl_ip(self) -> str:
        return f"{self.subnet}.1"

    def node_name(self, i: int) -> str:
        return f"node{i}"

    def node_ip(self, i: int) -> str:
        return f"{self.subnet}.{10 + i}"

    def netns(self, i: int) -> str:
        # Prefixed with the slot so that `down` never touches another cluster's (or anyone's) node1.
        return f"mn{self.slot}-node{i}"

    @property
    def node_indices(self) -> range:
        return range(1, self.nodes + 1)

    @property
    def node_range(self) -> str:
        return "node1" if self.nodes == 1 else f"node[1-{self.nodes}]"

    @property
    def slurm_conf(self) -> Path:
        return self.dir / "etc" / "slurm.conf"

    @property
    def spec_file(self) -> Path:
        return self.dir / "cluster.json"

    # --- persistence -----------------------------------------------------------------------------
    def save(self) -> None:
        data = asdict(self)
        data["dir"] = str(self.dir)
        self.spec_file.write_text(json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path) -> ClusterSpec | None:
        path = directory / "cluster.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        data["dir"] = Path(data.get("dir", directory))
        return cls(**data)

    def same_shape(self, other: ClusterSpec) -> bool:
        return asdict(self) == asdict(other)


def preemption_text(spec: ClusterSpec) -> str:
    if not spec.preemption:
        return "no preemption"
    mode = spec.preempt_mode.upper()
    return f"preemption by partition {PREEMPTING}, GraceTime {spec.grace_time} s, PreemptMode {mode}"


def partition_lines(spec: ClusterSpec) -> list[str]:
    """slurm.conf's partitions, with preemption's settings where the cluster preempts."""
    default = f"PartitionName={spec.partition} Nodes={spec.node_range} Default=YES MaxTime=INFINITE State=UP"
    if not spec.preemption:
        return [default]
    return [
        "# Preemption (`up --preemption`): a job of the higher PriorityTier takes the default partition's nodes; the",
        "# preempted job gets SIGTERM, GraceTime seconds to end, then is requeued (REQUEUE) or cancelled (CANCEL).",
        "PreemptType=preempt/partition_prio",
        f"PreemptMode={spec.preempt_mode.upper()}",
        f"{default} PriorityTier=1 GraceTime={spec.grace_time}",
        f"PartitionName={PREEMPTING} Nodes={spec.node_range} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF",
    ]


def _template(name: str) -> Template:
    return Template(resources.files(__package__).joinpath("templates", name).read_text())


def render_configs(
    spec: ClusterSpec, first_job_id: int, ctl_host: str | None = None, cgroups: bool = True
) -> dict[str, str]:
    """Config file name (relative to <dir>/etc) -> content. cgroups: track processes with proctrack/cgroup (else
    proctrack/linuxproc: asked for by spec.proctrack, or a host without a cgroup v1 freezer; see cgroups.py)."""
    ctl_host = ctl_host or socket.gethostname().split(".")[0]  # slurmctld refuses any other name
    values = {f.name: getattr(spec, f.name) for f in fields(spec)}
    values.update(
        dir=str(spec.dir),
        ctl_host=ctl_host,
        ctl_ip=spec.ctl_ip,
        ctld_port=spec.ctld_port,
        slurmd_port=spec.slurmd_port,
        dbd_port=spec.dbd_port,
        db_port=spec.db_port,
        node_range=spec.node_range,
        first_job_id=first_job_id,
        last_gpu=max(spec.gpus - 1, 0),
        proctrack_type="proctrack/cgroup" if cgroups else "proctrack/linuxproc",
        task_plugin="task/cgroup" if cgroups else "task/none",
    )
    values["accounting_block"] = _template(
        "accounting-on.conf" if spec.accounting else "accounting-off.conf"
    ).substitute(values)
    gres = f" Gres=gpu:{spec.gpus}" if spec.gpus else ""
    values["node_lines"] = "\n".join(
        f"NodeName={spec.node_name(i)} NodeAddr={spec.node_ip(i)} CPUs={spec.cpus} Boards=1 SocketsPerBoard=1 "
        f"CoresPerSocket={spec.cpus} ThreadsPerCore=1 RealMemory={spec.mem_mb}{gres} State=UNKNOWN"
        for i in spec.node_indices
    )
    hosts = ["127.0.0.1 localhost", f"{spec.ctl_ip} {ctl_host} slurmctl"]
    hosts += [f"{spec.node_ip(i)} {spec.node_name(i)}" for i in spec.node_indices]
    # c10d's TCPStore accepts on a dual-stack socket and names each client by a reverse lookup of its IPv4-mapped
    # address (::ffff:a.b.c.d); without an entry glibc falls back to DNS, which is unreachable here, and every
    # rank logs "The hostname of the client socket cannot be retrieved". A separate name keeps `nodeN` IPv4-only.
    hosts += [f"::ffff:{spec.node_ip(i)} {spec.node_name(i)}-v4mapped" for i in spec.node_indices]
    values["partition_lines"] = "\n".join(partition_lines(spec))
    configs = {
        "slurm.conf": _template("slurm.conf").substitute(values),
        "gres.conf": _template("gres.conf").substitute(values) if spec.gpus else "",
        "hosts": "\n".join(hosts) + "\n",
    }
    if cgroups:
        configs["cgroup.conf"] = _template("cgroup.conf").substitute(values)
    if spec.accounting:
        configs["slurmdbd.conf"] = _template("slurmdbd.conf").substitute(values)
    return configs
