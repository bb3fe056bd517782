"""Per-node cgroup trees: every sandbox slurmd tracks its jobs with proctrack/cgroup without meeting the others.

SLURM puts a job's processes in /sys/fs/cgroup/freezer/slurm_<node>/uid_U/job_J/step_S (Debian builds SLURM for
several slurmd per host, hence the node name) and, when the step ends, kills every pid in it, also those that left
the process tree (setsid, double fork, nohup). Two sandbox clusters both have a node1, and would share slurm_node1.
So each node's slurmd starts in a cgroup of its own (freezer:/mn<slot>-node<i>, made here) and unshares a cgroup
namespace there; in its private mount namespace it mounts the freezer hierarchy afresh, and such a mount's root is
the namespace's root. SLURM's usual paths then land under the node's cgroup, and the paths in /proc/<pid>/cgroup
(which SLURM also reads) agree with the mount. Nothing else changes on the host: the other hierarchies and their
mounts are left alone.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

from . import processes as ps
from .spec import ClusterSpec

CGROUP_FS = Path("/sys/fs/cgroup")
# What proctrack/cgroup uses. task/cgroup's constraints stay off (see templates/cgroup.conf), so it needs no more;
# ConstrainCores works with "cpuset" added here (and cpuset.cpus/mems copied into the node's cgroup), but every
# node maps its CPU 0 to the same real core: 1-CPU tasks of three nodes all ran on core 0.
CONTROLLERS = ("freezer",)


def unavailable_reason(mounts: str | None = None) -> str | None:
    """Why per-node cgroup tracking cannot work on this host, or None when it can."""
    if not Path("/proc/self/ns/cgroup").exists():
        return "the kernel has no cgroup namespaces (/proc/self/ns/cgroup is missing)"
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError as err:
            return f"cannot read /proc/self/mounts: {err}"
    for controller in CONTROLLERS:
        where = str(CGROUP_FS / controller)
        if not any(
            f[1] == where and f[2] == "cgroup" and controller in f[3].split(",")
            for f in (line.split() for line in mounts.splitlines())
            if len(f) >= 4
        ):
            kinds = {f[2] for f in (line.split() for line in mounts.splitlines()) if len(f) >= 3}
            found = ", ".join(sorted(kinds & {"cgroup", "cgroup2"})) or "no cgroup file systems"
            # cgroup v2 (SLURM's cgroup/v2) wants a tree delegated by systemd per slurmd: not done here.
            return f"no cgroup v1 {controller} hierarchy is mounted at {where} (this host has {found})"
    return None


def node_dir(spec: ClusterSpec, i: int, controller: str) -> Path:
    """Node i's cgroup, named like its network namespace (slot-prefixed: another cluster's node1 is not ours)."""
    return CGROUP_FS / controller / spec.netns(i)


def create(spec: ClusterSpec, i: int) -> None:
    for controller in CONTROLLERS:
        node_dir(spec, i, controller).mkdir(exist_ok=True)


def join_and_exec(spec: ClusterSpec, i: int) -> list[str]:
    """A command prefix: move the shell into node i's cgroups, then exec the rest (which unshares the namespace)."""
    joins = " && ".join(f"echo $$ > {shlex.quote(str(node_dir(spec, i, c) / 'cgroup.procs'))}" for c in CONTROLLERS)
    return ["sh", "-c", f'{joins} && exec "$@"', "sh"]


def remount_inside() -> str:
    """Shell run inside the node's mount + cgroup namespaces: the controllers, rooted at the node's cgroup."""
    # The host's mount of the same hierarchy sits on the same mount point (mounting over it is EBUSY): replace it.
    return " && ".join(
        f"umount {shlex.quote(str(CGROUP_FS / c))} && mount -t cgroup -o {c} cgroup {shlex.quote(str(CGROUP_FS / c))}"
        for c in CONTROLLERS
    )


def _tree(root: Path) -> list[Path]:
    """root and every cgroup below it, deepest first (the order rmdir needs)."""
    if not root.is_dir():
        return []
    below = [p for p in root.rglob("*") if p.is_dir()]
    return sorted(below, key=lambda p: len(p.parts), reverse=True) + [root]


def remove(spec: ClusterSpec, log: Callable[[str], None]) -> None:
    """Kill whatever still runs in the nodes' cgroups (by pid, ours by construction), then remove the cgroups."""
    for i in spec.node_indices:
        for controller in CONTROLLERS:
            tree = _tree(node_dir(spec, i, controller))
            if not tree:
                continue
            if controller == "freezer":  # a SIGKILL to a frozen task waits for the thaw
                for cg in tree:
                    _write(cg / "freezer.state", "THAWED")
            pids = [int(p) for cg in tree for p in _read(cg / "cgroup.procs").split()]
            if pids:
                log(f"killing {len(pids)} processes left in cgroup {tree[-1]}")
                ps.stop(pids, grace=2)
            for cg in tree:
                try:
                    cg.rmdir()
                except OSError:
                    pass  # reported by leftovers()


def leftovers(spec: ClusterSpec) -> list[str]:
    return [
        f"cgroup {node_dir(spec, i, c)}"
        for i in spec.node_indices
        for c in CONTROLLERS
        if node_dir(spec, i, c).exists()
    ]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError:
        pass
