"""How the sandbox runs each SLURM release (contract/releases.py names them): 22.05 from this machine's Debian 12
packages, 24.11 from a Debian 13 root file system, built once from Debian's archive with mmdebstrap and cached.

With 24.11, every SLURM command, daemon or client, runs from the root file system. The cluster folder's bin/ holds
one link per command to one wrapper (`multinode cluster env` puts bin/ first on PATH). The wrapper enters a private
mount namespace in which the root file system sees this machine's data folders (/root, /home, /tmp, /var/tmp,
/work, ...; every top-level folder but the system's own), /proc, /sys, /dev, the caller's /etc/hosts (a node's
own, inside a node) and the cluster's configuration as /etc/slurm, and runs the command there, in the caller's
working directory. Jobs run inside it (their slurmd does), where the wrapper runs the command directly. munged and
MariaDB stay this machine's: munge's socket protocol and MariaDB's wire protocol are the same for both releases.
The plugin never knows which SLURM it talks to, except through SLURM's own answers.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

from snakemake_executor_multinode.contract import releases as registry

from .errors import ClusterError

CACHE = Path(os.environ.get("MULTINODE_ROOTFS_CACHE", "/var/cache/multinode"))
STAMP = "etc/multinode-rootfs"  # inside the root file system: what was built, and how the wrapper knows it is inside


@dataclass(frozen=True)
class Release:
    name: str
    suite: str | None  # the Debian suite of a root file system of its own; None: this machine's packages
    packages: tuple[str, ...] = ()

    @property
    def rootfs(self) -> Path | None:
        """Named by what it holds: a new package list builds beside the old one, never under a running cluster."""
        if not self.suite:
            return None
        digest = hashlib.sha256(" ".join([self.suite, *self.packages]).encode()).hexdigest()[:8]
        return CACHE / f"slurm-{self.name}-{digest}"


# What a job inside the root file system needs besides SLURM: the shell tools the job script calls, and the shared
# libraries of this machine's Python (pyenv's or a venv's, bind-mounted from the host) and of torch's CPU wheel.
JOB_TOOLS = ("bash", "coreutils", "procps", "iproute2", "util-linux", "hostname", "gawk", "findutils", "libc-bin")
CONTAINER_TOOLS = ("podman", "runc", "conmon")  # a profile's `container:` runs each node's torchrun in podman
PYTHON_LIBS = (
    "libssl3t64", "libffi8", "libsqlite3-0", "libgdbm6t64", "libreadline8t64", "libncursesw6", "libbz2-1.0",
    "liblzma5", "zlib1g", "libexpat1", "libtirpc3t64", "libuuid1", "libgomp1", "libstdc++6",
)  # fmt: skip
# Each release's Debian suite and packages (None: this machine's own); a release of the registry without an entry
# fails here, at import.
SOURCES: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "22.05": (None, ()),
    "24.11": (
        "trixie",
        ("slurmctld", "slurmd", "slurmdbd", "slurm-client", "munge", *JOB_TOOLS, *CONTAINER_TOOLS, *PYTHON_LIBS),
    ),
}
RELEASES = {name: Release(name, *SOURCES[name]) for name in registry.NAMES}
# The commands the wrapper serves (each a link in <cluster>/bin): every client the plugin, the tests and a user
# call, and the daemons the sandbox starts.
CLIENTS = (
    "sbatch", "srun", "salloc", "sattach", "scancel", "scontrol", "squeue", "sacct", "sacctmgr", "sinfo", "sdiag",
    "sprio", "sshare", "sstat", "sreport", "strigger",
)  # fmt: skip
DAEMONS = ("slurmctld", "slurmd", "slurmdbd")
# Served too: the container runtime jobs of this cluster run (a user builds images for them with the same podman;
# podman 4 and 5 must not share a storage: 5 rewrites its database).
TOOLS = ("podman",)
WRAPPER = ".slurm-rootfs"


def release(name: str) -> Release:
    try:
        return RELEASES[name]
    except KeyError:
        raise ClusterError(f"--slurm must be one of {', '.join(RELEASES)}, got {name!r}") from None


def describe(name: str) -> str:
    """One release for `--slurm`'s help: the registry's description, and how this sandbox keeps it."""
    notes = [registry.RELEASES[name].description]
    if name == registry.DEFAULT:
        notes.append("the default")
    if release(name).rootfs:
        notes.append(f"built once and cached under {CACHE}")
    return f"{name} ({', '.join(notes)})"


def say(msg: str) -> None:
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


def bin_dir(cluster_dir: Path, slurm: str) -> Path | None:
    """The folder to put first on PATH for this cluster's SLURM, or None for this machine's own."""
    return cluster_dir / "bin" if release(slurm).rootfs else None


def path_env(cluster_dir: Path, slurm: str, path: str | None = None) -> str:
    """PATH for commands that talk to this cluster."""
    path = os.environ.get("PATH", "") if path is None else path
    where = bin_dir(cluster_dir, slurm)
    if where is None:
        return path
    return ":".join([str(where), *(p for p in path.split(":") if p and p != str(where))])


# --- the root file system --------------------------------------------------------------------------------------
def ensure_rootfs(rel: Release) -> Path | None:
    """The release's root file system, built now if it is not cached (or was built with other packages)."""
    root = rel.rootfs
    if root is None:
        return None
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".slurm-{rel.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two `up`s at once: the second waits, then finds it built
        if _built(rel):
            return root
        _build(rel, root)
    return root


def _built(rel: Release) -> bool:
    assert rel.rootfs is not None
    return (rel.rootfs / STAMP).is_file()  # written last: a build cut short leaves none


def _build(rel: Release, root: Path) -> None:
    if shutil.which("mmdebstrap") is None:
        _apt_install("mmdebstrap")
    tmp = root.with_name(root.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    say(f"building a Debian {rel.suite} root file system with SLURM {rel.name} in {root} (once)")
    started = time.monotonic()
    cmd = [
        "mmdebstrap", "--variant=apt", "--mode=root", "--quiet", f"--include={','.join(rel.packages)}",
        str(rel.suite), str(tmp), "http://deb.debian.org/debian",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ClusterError(f"building the SLURM {rel.name} root file system failed: {proc.stderr.strip()[-2000:]}")
    version = subprocess.run(
        ["chroot", str(tmp), "dpkg-query", "-W", "-f", "${Version}", "slurm-client"], capture_output=True, text=True
    ).stdout.strip()
    # what the wrapper mounts over: this machine's (or a node's) /etc/hosts, the cluster's configuration
    (tmp / "etc" / "hosts").touch()
    (tmp / "etc" / "slurm").mkdir(exist_ok=True)
    stamp = {"release": rel.name, "suite": rel.suite, "slurm": version, "packages": list(rel.packages)}
    (tmp / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
    tmp.rename(root)
    size = subprocess.run(["du", "-sm", str(root)], capture_output=True, text=True).stdout.split()[:1]
    say(f"built in {time.monotonic() - started:.0f} s: SLURM {version}, {''.join(size) or '?'} MB")


def _apt_install(package: str) -> None:
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", package]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=300)
        if subprocess.run(install, env=env, capture_output=True, timeout=600).returncode != 0:
            raise ClusterError(f"apt-get install {package} failed: the sandbox builds root file systems with it")


# --- the wrapper -----------------------------------------------------------------------------------------------
def install_wrappers(cluster_dir: Path, slurm: str, root: Path) -> None:
    """<cluster>/bin: the wrapper and one link per SLURM command to it (rewritten at every `up`)."""
    where = cluster_dir / "bin"
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    text = Template(resources.files(__package__).joinpath("templates", "slurm-rootfs.sh").read_text())
    wrapper = where / WRAPPER
    wrapper.write_text(text.substitute(rootfs=str(root), release=slurm, stamp=STAMP))
    wrapper.chmod(0o755)
    for name in (*CLIENTS, *DAEMONS, *TOOLS):
        (where / name).symlink_to(WRAPPER)


def remove_wrappers(cluster_dir: Path) -> None:
    shutil.rmtree(cluster_dir / "bin", ignore_errors=True)
