"""What a sandbox cluster looks like, and the config files that describe it to SLURM."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, fields
from importlib import resources
from pathlib import Path
from string import Template

DEFAULT_DIR = Path(os.environ.get("MULTINODE_CLUSTER_DIR", "/var/tmp/multinode-cluster"))


class ClusterError(RuntimeError):
    """A cluster step failed; the message names the step and the log to read."""


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
    # A /24 that exists only on the bridge and in the namespaces that `up` creates.
    subnet: str = "172.31.250"
    bridge: str = "mnbr0"
    cred_expire: int = 10
    sched_interval: int = 2
    kill_wait: int = 30
    min_job_age: int = 300
    ctld_port: int = 6817
    slurmd_port: int = 6818
    dbd_port: int = 6819
    db_port: int = 33061

    def __post_init__(self) -> None:
        for name, low, high in (("nodes", 1, 64), ("cpus", 1, 1024), ("gpus", 0, 64), ("mem_mb", 100, 10**8)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ClusterError(f"--{name.replace('_', '-')} must be an integer in {low}..{high}, got {value!r}")
        parts = self.subnet.split(".")
        if len(parts) != 3 or not all(p.isdigit() and 0 <= int(p) <= 255 for p in parts):
            raise ClusterError(f"subnet must look like 172.31.250 (a /24 prefix), got {self.subnet!r}")

    # --- derived names ---------------------------------------------------------------------------
    @property
    def ctl_ip(self) -> str:
        return f"{self.subnet}.1"

    def node_name(self, i: int) -> str:
        return f"node{i}"

    def node_ip(self, i: int) -> str:
        return f"{self.subnet}.{10 + i}"

    def netns(self, i: int) -> str:
        # Prefixed so that `down` never touches a namespace someone else named node1.
        return f"mn-node{i}"

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


def _template(name: str) -> Template:
    return Template(resources.files(__package__).joinpath("templates", name).read_text())


def render_configs(spec: ClusterSpec, first_job_id: int, ctl_host: str | None = None) -> dict[str, str]:
    """Config file name (relative to <dir>/etc) -> content."""
    ctl_host = ctl_host or socket.gethostname().split(".")[0]  # slurmctld refuses any other name
    values = {f.name: getattr(spec, f.name) for f in fields(spec)}
    values.update(
        dir=str(spec.dir),
        ctl_host=ctl_host,
        ctl_ip=spec.ctl_ip,
        node_range=spec.node_range,
        first_job_id=first_job_id,
        last_gpu=max(spec.gpus - 1, 0),
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
    configs = {
        "slurm.conf": _template("slurm.conf").substitute(values),
        "gres.conf": _template("gres.conf").substitute(values) if spec.gpus else "",
        "hosts": "\n".join(hosts) + "\n",
    }
    if spec.accounting:
        configs["slurmdbd.conf"] = _template("slurmdbd.conf").substitute(values)
    return configs
