"""`multinode cluster up|down|status|env`: a real SLURM cluster of namespaced nodes on one machine.

munged, slurmctld (and MariaDB + slurmdbd for sacct) run in the root namespaces on a private bridge; each slurmd
runs in its own network, UTS and mount namespace, so every node has its own hostname and address. The nodes have
no default route and nothing forwards: no packet leaves the machine.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from . import cgroups, releases
from . import processes as ps
from .spec import DEFAULT_DIR, ClusterError, ClusterSpec, preemption_text, render_configs

__all__ = ["DEFAULT_DIR", "ClusterError", "ClusterSpec", "up", "down", "status", "env_lines", "is_up"]

SLURM_PACKAGES = {"slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client", "slurmdbd": "slurmdbd"}
ACCOUNTING_PACKAGES = {"mariadbd": "mariadb-server"}
# munged and MariaDB are this machine's whichever SLURM runs (releases.py says why)
TOOL_PACKAGES = {"ip": "iproute2", "nsenter": "util-linux", "munged": "munge"}


def say(msg: str) -> None:
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


# --- preconditions -------------------------------------------------------------------------------
def require_root(action: str) -> None:
    if os.geteuid() != 0:
        raise ClusterError(
            f"`multinode cluster {action}` needs root: it creates network namespaces, a bridge and fake GPU "
            "devices. Run it with sudo, or point SLURM_CONF at a real cluster instead."
        )


def ensure_packages(spec: ClusterSpec) -> None:
    wanted = dict(TOOL_PACKAGES) | (ACCOUNTING_PACKAGES if spec.accounting else {})
    if releases.release(spec.slurm).rootfs is None:
        wanted |= {cmd: pkg for cmd, pkg in SLURM_PACKAGES.items() if spec.accounting or cmd != "slurmdbd"}
    missing = sorted({pkg for cmd, pkg in wanted.items() if shutil.which(cmd) is None})
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise ClusterError(
            f"missing commands from packages {', '.join(missing)} and apt-get is not available: "
            "install Debian's slurm-wlm 22.05 packages (or your distribution's) by hand"
        )
    say(f"installing {' '.join(missing)} (apt-get)")
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        ps.run(["apt-get", "update", "-q"], "apt-get update", timeout=300, env=env)
        ps.run(install, f"apt-get install {' '.join(missing)}", timeout=600, env=env)


@contextmanager
def locked(spec: ClusterSpec, wait: float = 300) -> Iterator[None]:
    """One up/down at a time per cluster folder: a second command waits for the first (then finds its result)."""
    spec.dir.mkdir(parents=True, exist_ok=True)
    with open(spec.dir / ".lock", "w") as fh:
        if not ps.wait_for(lambda: _try_lock(fh), wait, 0.2):
            raise ClusterError(f"another `multinode cluster` command has been working on {spec.dir} for {wait:.0f} s")
        yield


def _try_lock(fh: IO[str]) -> bool:
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def slurm_env(spec: ClusterSpec) -> dict[str, str]:
    return os.environ | {"SLURM_CONF": str(spec.slurm_conf), "PATH": releases.path_env(spec.dir, spec.slurm)}


# --- status --------------------------------------------------------------------------------------
@dataclass
class Daemon:
    name: str
    pidfile: Path
    comms: tuple[str, ...]

    def pid(self) -> int | None:
        return ps.pid_from(self.pidfile, self.comms)


def daemons(spec: ClusterSpec) -> list[Daemon]:
    run = spec.dir / "run"
    found = [Daemon("munged", spec.dir / "munge" / "munged.pid", ("munged",))]
    if spec.accounting:
        found.append(Daemon("mariadbd", spec.dir / "mysql" / "mysqld.pid", ("mariadbd", "mysqld")))
        found.append(Daemon("slurmdbd", run / "slurmdbd.pid", ("slurmdbd",)))
    found.append(Daemon("slurmctld", run / "slurmctld.pid", ("slurmctld",)))
    found += [
        Daemon(f"slurmd {spec.node_name(i)}", run / f"slurmd-{spec.node_name(i)}.pid", ("slurmd",))
        for i in spec.node_indices
    ]
    return found


def nodes_in(spec: ClusterSpec, states: str = "idle") -> set[str]:
    """Names of the nodes sinfo reports in these states (comma-separated, sinfo -t)."""
    sinfo = ["sinfo", "-h", "-N", "-p", spec.partition, "-t", states, "-o", "%N"]
    proc = subprocess.run(sinfo, capture_output=True, text=True, env=slurm_env(spec), timeout=10)
    return set(proc.stdout.split()) if proc.returncode == 0 else set()


def is_up(spec: ClusterSpec) -> bool:
    return all(d.pid() for d in daemons(spec))


def status(spec: ClusterSpec) -> str:
    lines = [f"cluster folder: {spec.dir}  (SLURM_CONF={spec.slurm_conf})"]
    for d in daemons(spec):
        pid = d.pid()
        lines.append(f"  {d.name:<14} {'running, pid ' + str(pid) if pid else 'stopped'}")
    if any(d.name == "slurmctld" and d.pid() for d in daemons(spec)):
        sinfo = ["sinfo", "-N", "-o", "%N %P %T %c %m %G %E"]  # a node in two partitions (--preemption): two lines
        proc = subprocess.run(sinfo, capture_output=True, text=True, env=slurm_env(spec), timeout=10)
        lines += ["", proc.stdout.rstrip() or proc.stderr.rstrip()]
    return "\n".join(lines)


def env_lines(spec: ClusterSpec) -> str:
    lines = f"export SLURM_CONF={spec.slurm_conf}\nexport MULTINODE_CLUSTER_DIR={spec.dir}\n"
    where = releases.bin_dir(spec.dir, spec.slurm)
    if where is not None:  # SLURM's commands from the release's root file system, before this machine's own
        lines += f'export PATH="{where}:$PATH"\n'
    return lines


# --- up ------------------------------------------------------------------------------------------
def up(spec: ClusterSpec) -> None:
    require_root("up")
    with locked(spec):
        previous = ClusterSpec.load(spec.dir)
        if previous is not None and is_up(previous):
            if not previous.same_shape(spec):
                raise ClusterError(
                    f"a cluster with other settings is running from {spec.dir} "
                    f"(SLURM {previous.slurm}, {previous.nodes} nodes x {previous.gpus} GPUs, accounting "
                    f"{'on' if previous.accounting else 'off'}, {preemption_text(previous)}): run `multinode cluster "
                    "down` first"
                )
            if len(nodes_in(spec, "idle,alloc,mix,comp")) >= spec.nodes:  # busy nodes are up too
                say(f"already up: {spec.nodes} nodes ({spec.dir}); nothing to do")
                return
        ensure_packages(spec)
        root = releases.ensure_rootfs(releases.release(spec.slurm))
        owner = network_owner(spec)
        if owner not in (None, str(spec.dir)):
            raise ClusterError(
                f"network slot {spec.slot} (bridge {spec.bridge}, subnet {spec.subnet}.0/24) belongs to the sandbox "
                f"cluster in {owner}; choose another --dir, or `multinode cluster down --dir {owner}` first"
            )
        _down(previous or spec, quiet=True)
        _prepare_dirs(spec, previous)
        if root is not None:
            releases.install_wrappers(spec.dir, spec.slurm, root)
        else:
            releases.remove_wrappers(spec.dir)
        _network_up(spec)
        first_job_id = _next_job_id(spec)
        no_cgroups = cgroups.unavailable_reason() if spec.proctrack == "cgroup" else None
        if no_cgroups:
            say(
                f"process tracking falls back to proctrack/linuxproc: {no_cgroups}; processes that leave a job's "
                "process tree (setsid, double fork) outlive the job"
            )
        with_cgroups = spec.proctrack == "cgroup" and no_cgroups is None
        _write_configs(spec, first_job_id, with_cgroups)
        spec.save()
        _munge_up(spec)
        if spec.accounting:
            _mariadb_up(spec)
            _slurmdbd_up(spec)
            recorded = _max_recorded_job_id(spec)
            if recorded >= first_job_id:
                _write_configs(spec, recorded + 1, with_cgroups)
        _slurmctld_up(spec)
        _slurmd_up(spec)
        extra = f"; {preemption_text(spec)}" if spec.preemption else ""
        say(f"ready: {spec.nodes} idle nodes with gpu:{spec.gpus}{extra}; use it with: {use_command(spec)}")


def use_command(spec: ClusterSpec) -> str:
    """What the user runs to point SLURM's commands at this cluster: a cluster outside the default folder is named,
    or the command would silently point at the default one (another sandbox, maybe running)."""
    where = "" if spec.dir.resolve() == DEFAULT_DIR.resolve() else f" --dir {shlex.quote(str(spec.dir))}"
    return f'eval "$(multinode cluster env{where})"'


def _prepare_dirs(spec: ClusterSpec, previous: ClusterSpec | None) -> None:
    d = spec.dir
    if previous is not None and previous.slurm != spec.slurm and (d / "mysql").exists():
        # slurmdbd converts the accounting database to its own release's schema, and an older one cannot read it
        say(f"SLURM {previous.slurm} -> {spec.slurm}: starting with an empty accounting database")
        shutil.rmtree(d / "mysql")
    for sub in ("etc", "munge", "state", "run", "logs", "spool", "fakedev"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    # A fresh controller state each time; job ids still count on (FirstJobId).
    for sub in ("state", "spool"):
        shutil.rmtree(d / sub)
        (d / sub).mkdir()
    for i in spec.node_indices:
        (d / "spool" / spec.node_name(i)).mkdir()
    (d / "munge").chmod(0o755)  # munged: the socket folder must be world-executable
    for g in range(spec.gpus):
        dev = d / "fakedev" / f"nvidia{g}"
        if not dev.is_char_device():
            dev.unlink(missing_ok=True)
            os.mknod(dev, 0o666 | 0o020000, os.makedev(195, g))  # like /dev/nvidiaN; opening it fails


def _network_up(spec: ClusterSpec) -> None:
    ip = ["ip"]
    # Our own leftovers are gone (_down ran first): whatever still holds these names or this subnet belongs to
    # another cluster folder that derived the same slot, or to someone else. Never take it over.
    taken = [f"link {name}" for name in (spec.bridge, *map(spec.host_link, spec.node_indices)) if _link_exists(name)]
    addrs = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    taken += [f"subnet {spec.subnet}.0/24" for line in addrs.splitlines() if f" {spec.subnet}." in line][:1]
    if taken:
        raise ClusterError(
            f"{', '.join(taken)} already exist on this machine but belong to no cluster in {spec.dir}: another "
            "sandbox cluster folder derived the same network slot, or something else uses it. Run "
            "`multinode cluster down --dir <that folder>`, or choose another --dir."
        )
    ps.run([*ip, "link", "add", spec.bridge, "type", "bridge"], f"creating bridge {spec.bridge}")
    # The bridge names its cluster folder: `up` and `down` of another folder with the same slot leave it alone.
    ps.run([*ip, "link", "set", "dev", spec.bridge, "alias", str(spec.dir)], f"labelling bridge {spec.bridge}")
    ps.run([*ip, "addr", "add", f"{spec.ctl_ip}/24", "dev", spec.bridge], f"addressing bridge {spec.bridge}")
    ps.run([*ip, "link", "set", spec.bridge, "up"], f"bringing up bridge {spec.bridge}")
    for i in spec.node_indices:
        ns, host_end = spec.netns(i), spec.host_link(i)
        ps.run([*ip, "netns", "add", ns], f"creating network namespace {ns}")
        ps.run(
            [*ip, "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns],
            f"creating veth pair for {ns}",
        )
        ps.run([*ip, "link", "set", host_end, "master", spec.bridge, "up"], f"attaching {host_end}")
        ps.run([*ip, "-n", ns, "addr", "add", f"{spec.node_ip(i)}/24", "dev", "eth0"], f"addressing {ns}")
        ps.run([*ip, "-n", ns, "link", "set", "eth0", "up"], f"bringing up eth0 in {ns}")
        ps.run([*ip, "-n", ns, "link", "set", "lo", "up"], f"bringing up lo in {ns}")


def _next_job_id(spec: ClusterSpec) -> int:
    try:
        return max(1, int((spec.dir / "next_job_id").read_text().strip()))
    except (OSError, ValueError):
        return 1


def _write_configs(spec: ClusterSpec, first_job_id: int, with_cgroups: bool) -> None:
    (spec.dir / "etc" / "cgroup.conf").unlink(missing_ok=True)  # a fallback leaves no stale one behind
    for name, text in render_configs(spec, first_job_id, cgroups=with_cgroups).items():
        path = spec.dir / "etc" / name
        path.write_text(text)
    if spec.accounting:
        (spec.dir / "etc" / "slurmdbd.conf").chmod(0o600)  # slurmdbd refuses a readable config


def _munge_up(spec: ClusterSpec) -> None:
    m = spec.dir / "munge"
    key = m / "munge.key"
    if not key.exists() or key.stat().st_size == 0:
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
    log = m / "munged.log"
    ps.run(
        [
            "munged",
            f"--key-file={key}",
            f"--socket={m / 'munge.socket'}",
            f"--pid-file={m / 'munged.pid'}",
            f"--log-file={log}",
            f"--seed-file={m / 'munged.seed'}",
        ],
        "starting munged",
        log=log,
    )
    cred = ps.run(["munge", "-S", str(m / "munge.socket"), "-n"], "munge self-test", log=log)
    ps.run(["unmunge", "-S", str(m / "munge.socket")], "munge self-test", log=log, input=cred)
    say("munged up")


def _mariadb_up(spec: ClusterSpec) -> None:
    db = spec.dir / "mysql"
    log = spec.dir / "logs" / "mariadb.log"
    db.mkdir(exist_ok=True)
    if not (db / "data" / "mysql").is_dir():
        shutil.rmtree(db / "data", ignore_errors=True)
        ps.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                "--user=root",
                f"--datadir={db / 'data'}",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ],
            "initialising the MariaDB data folder",
            log=spec.dir / "logs" / "mariadb-install.log",
            timeout=180,
        )
    log.unlink(missing_ok=True)
    server = shutil.which("mariadbd") or "mysqld"
    ps.start_detached(
        [
            server,
            "--no-defaults",
            "--user=root",
            f"--datadir={db / 'data'}",
            f"--socket={db / 'mysqld.sock'}",
            f"--pid-file={db / 'mysqld.pid'}",
            "--bind-address=127.0.0.1",
            f"--port={spec.db_port}",
            "--skip-name-resolve",
            "--innodb-buffer-pool-size=64M",
            f"--log-error={log}",
        ],
        "starting MariaDB",
    )
    client = ["mariadb", "--no-defaults", "-S", str(db / "mysqld.sock"), "-uroot"]
    ok = ps.wait_for(lambda: subprocess.run([*client, "-e", "select 1"], capture_output=True).returncode == 0, 30)
    if not ok:
        raise ClusterError(f"MariaDB did not accept connections within 30 s; see {log}")
    ps.run(
        [
            *client,
            "-e",
            "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'multinode'; "
            "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;",
        ],
        "creating the slurm database user",
        log=log,
    )
    say("MariaDB up")


def _slurmdbd_up(spec: ClusterSpec) -> None:
    log = spec.dir / "logs" / "slurmdbd.log"
    log.unlink(missing_ok=True)
    env = slurm_env(spec)
    # slurmdbd reads slurmdbd.conf from the folder of SLURM_CONF.
    ps.start_detached(["slurmdbd"], "starting slurmdbd", env=env)

    def answers() -> bool:
        probe = subprocess.run(
            ["timeout", "5", "sacctmgr", "-n", "-P", "show", "cluster"], capture_output=True, env=env
        )
        return probe.returncode == 0

    if not ps.wait_for(answers, 30, 0.2):
        raise ClusterError(f"slurmdbd did not answer within 30 s; see {log}")
    subprocess.run(
        ["timeout", "10", "sacctmgr", "-i", "-Q", "add", "cluster", spec.cluster_name], capture_output=True, env=env
    )
    say("slurmdbd up")


def _max_recorded_job_id(spec: ClusterSpec) -> int:
    proc = subprocess.run(
        ["timeout", "10", "sacct", "-X", "-n", "-P", "-a", "-o", "JobIDRaw", "-S", "2000-01-01", "-E", "now"],
        capture_output=True,
        text=True,
        env=slurm_env(spec),
    )
    ids = [int(x) for x in proc.stdout.split() if x.isdigit()]
    return max(ids, default=0)


def _slurmctld_up(spec: ClusterSpec) -> None:
    log = spec.dir / "logs" / "slurmctld.log"
    ps.run(["slurmctld", "-f", str(spec.slurm_conf)], "starting slurmctld", log=log, env=slurm_env(spec))

    def pings() -> bool:
        p = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, env=slurm_env(spec))
        return "is UP" in p.stdout

    if not ps.wait_for(pings, 20):
        raise ClusterError(f"slurmctld did not answer `scontrol ping` within 20 s; see {log}")
    say("slurmctld up")


def uses_cgroups(spec: ClusterSpec) -> bool:
    """Whether the written slurm.conf tracks processes with cgroups (then each slurmd needs its own tree)."""
    try:
        return "ProctrackType=proctrack/cgroup" in spec.slurm_conf.read_text()
    except OSError:
        return False


def _start_slurmd(spec: ClusterSpec, i: int) -> None:
    """Node i's slurmd in its own network, UTS and mount namespace (and cgroup namespace, see cgroups.py)."""
    etc, node = spec.dir / "etc", spec.node_name(i)
    with_cgroups = uses_cgroups(spec)
    # nsenter, not `ip netns exec`: that remounts /sys and hides the cgroup tree slurmd needs.
    inner = (
        f"mount --bind {etc / 'hosts'} /etc/hosts && "
        f"{{ [ ! -d /etc/slurm ] || mount --bind {etc} /etc/slurm; }} && "
        f"hostname {node} && exec slurmd -N {node} -f {spec.slurm_conf}"
    )
    prefix: list[str] = []
    if with_cgroups:  # slurmd starts in the node's own cgroup and namespace, and mounts the tree rooted there
        cgroups.create(spec, i)
        prefix = cgroups.join_and_exec(spec, i)
        inner = f"{cgroups.remount_inside()} && {inner}"
    ps.run(
        [
            *prefix,
            "nsenter",
            f"--net=/run/netns/{spec.netns(i)}",
            "unshare",
            "--uts",
            "--mount",
            *(["--cgroup"] if with_cgroups else []),
            "--propagation",
            "private",
            "sh",
            "-c",
            inner,
        ],
        f"starting slurmd on {node}",
        log=spec.dir / "logs" / f"slurmd-{node}.log",
        env=slurm_env(spec),
    )


def _slurmd_up(spec: ClusterSpec) -> None:
    for i in spec.node_indices:
        _start_slurmd(spec, i)
    want = {spec.node_name(i) for i in spec.node_indices}
    if not ps.wait_for(lambda: want <= nodes_in(spec), 60, 0.2):
        proc = subprocess.run(["sinfo", "-N", "-o", "%N %T %E"], capture_output=True, text=True, env=slurm_env(spec))
        raise ClusterError(
            f"only {sorted(nodes_in(spec))} of {sorted(want)} became idle within 60 s:\n{proc.stdout}"
            f"see {spec.dir / 'logs'}/slurmctld.log and slurmd-<node>.log"
        )
    say(f"{len(want)} slurmd nodes idle")


def restart_node(spec: ClusterSpec, i: int, timeout: float = 180) -> None:
    """Bring one node back after a fault test killed it (its slurmd and every process in its namespace): start its
    slurmd as `up` does, resume it in slurmctld, and wait until it takes jobs again."""
    node = spec.node_name(i)
    pid = Daemon(node, spec.dir / "run" / f"slurmd-{node}.pid", ("slurmd",)).pid()
    if pid is None:  # the same start as `up`: its namespaces, its /etc/hosts, its cgroup tree
        _start_slurmd(spec, i)
    # A node slurmctld marked DOWN (not responding) stays down until resumed; an idle one refuses the resume.
    update = ["scontrol", "update", f"nodename={node}", "state=resume"]
    subprocess.run(update, capture_output=True, env=slurm_env(spec), timeout=30)

    def takes_jobs() -> bool:  # exactly these states: `sinfo -t idle` also lists a node still completing a job
        sinfo = ["sinfo", "-h", "-n", node, "-p", spec.partition, "-o", "%T"]  # one line: each partition has one
        out = subprocess.run(sinfo, capture_output=True, text=True, env=slurm_env(spec), timeout=10).stdout
        return out.strip() in ("idle", "mixed", "allocated")

    if not ps.wait_for(takes_jobs, timeout, 0.5):
        raise ClusterError(f"{node} did not take jobs again within {timeout:.0f} s; see {spec.dir / 'logs'}")
    say(f"{node} back")


# --- down ----------------------------------------------------------------------------------------
def down(spec: ClusterSpec) -> list[str]:
    """Stop what `up` started; return what is still left (empty when clean)."""
    require_root("down")
    with locked(spec):
        actual = ClusterSpec.load(spec.dir) or spec
        _down(actual, quiet=False)
        return leftovers(actual)


def _down(spec: ClusterSpec, quiet: bool) -> None:
    log = (lambda m: None) if quiet else say
    ctld = Daemon("slurmctld", spec.dir / "run" / "slurmctld.pid", ("slurmctld",))
    if ctld.pid():
        env = slurm_env(spec)
        conf = subprocess.run(["timeout", "5", "scontrol", "show", "config"], capture_output=True, text=True, env=env)
        for line in conf.stdout.splitlines():
            if line.startswith("NEXT_JOB_ID"):
                (spec.dir / "next_job_id").write_text(line.split("=")[1].strip() + "\n")
        jobs = subprocess.run(
            ["timeout", "5", "squeue", "-h", "-o", "%i"], capture_output=True, text=True, env=env
        ).stdout.split()
        if jobs:
            log(f"cancelling jobs {' '.join(jobs)}")
            subprocess.run(["timeout", "5", "scancel", *jobs], capture_output=True, env=env)
    slurm = [d for d in daemons(spec) if d.name.startswith("slurm")]
    pids = [p for d in slurm if (p := d.pid())]
    if pids:
        log(f"stopping slurm daemons {pids}")
        ps.stop(pids)
    ours = network_owner(spec) in (None, str(spec.dir))
    if not ours:
        log(f"network slot {spec.slot} belongs to the cluster in {network_owner(spec)}: its network is left alone")
    # Whatever is left inside our namespaces (slurmstepd, job processes) was started by our slurmd.
    for i in spec.node_indices if ours else ():
        ns = spec.netns(i)
        if not Path(f"/run/netns/{ns}").exists():
            continue
        left = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        if left:
            log(f"killing {len(left)} processes left in {ns}")
            ps.stop([int(p) for p in left], grace=2)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    if ours:  # what is left in the nodes' cgroups (a job's escapee that also left the namespace), then the cgroups
        cgroups.remove(spec, log)
    others = [p for d in daemons(spec) if not d.name.startswith("slurm") and (p := d.pid())]
    if others:
        log(f"stopping munged/MariaDB {others}")
        ps.stop(others)
    for f in ("munge.socket", "munge.socket.lock"):
        (spec.dir / "munge" / f).unlink(missing_ok=True)
    # A veth's host end can outlive its namespace for a while (open connections keep the namespace alive):
    # delete it by name, or the next `up` finds it taken.
    for name in (*map(spec.host_link, spec.node_indices), spec.bridge) if ours else ():
        if _link_exists(name):
            subprocess.run(["ip", "link", "del", name], capture_output=True)
    log("down")


def network_owner(spec: ClusterSpec) -> str | None:
    """The cluster folder written on the slot's bridge, or None when there is no bridge."""
    try:
        return Path(f"/sys/class/net/{spec.bridge}/ifalias").read_text().strip()
    except OSError:
        return None


def _link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def leftovers(spec: ClusterSpec) -> list[str]:
    left = [f"{d.name} (pid {p})" for d in daemons(spec) if (p := d.pid())]
    if network_owner(spec) not in (None, str(spec.dir)):
        return left  # the slot's network is another cluster's
    left += [
        f"network namespace {spec.netns(i)}" for i in spec.node_indices if Path(f"/run/netns/{spec.netns(i)}").exists()
    ]
    left += [f"link {name}" for name in (*map(spec.host_link, spec.node_indices), spec.bridge) if _link_exists(name)]
    return left + cgroups.leftovers(spec)
