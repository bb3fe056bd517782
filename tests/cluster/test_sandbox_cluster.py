"""`multinode cluster`: a real SLURM cluster of namespaced nodes with fake GPUs on one machine."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from snakemake_executor_multinode.sandbox import cgroups, cluster
from snakemake_executor_multinode.sandbox.spec import ClusterSpec
from tests.helpers import TEST_SLURM, wait_for

pytestmark = pytest.mark.cluster


def test_every_node_is_up_each_with_eight_gpus(slurm_cluster):
    # the default partition's nodes (the suite's cluster preempts: `urgent` lists the same nodes once more)
    partition = slurm_cluster.spec.partition
    up = {"idle", "mixed", "allocated", "completing"}

    def nodes() -> list[list[str]]:
        out = slurm_cluster.run("sinfo", "-h", "-N", "-p", partition, "-o", "%N %T %G").stdout.split("\n")
        return sorted(line.split() for line in out if line.strip())

    rows = nodes()
    assert [(name, gres) for name, _, gres in rows] == [(f"node{i}", "gpu:8") for i in slurm_cluster.spec.node_indices]
    # up and schedulable: idle, or running (or ending) someone's job (the suite's cluster may be shared by parallel
    # sessions). A node an earlier test's slurmctld restart left unanswered for a moment ("completing*") answers
    # again at its next ping: waited for, never assumed.
    wait_for(lambda: {state for _, state, _ in nodes()} <= up, "every node up and answering", 300)


def test_srun_across_three_nodes_sees_three_hostnames_and_addresses(slurm_cluster):
    out = slurm_cluster.run("srun", "-N3", "bash", "-c", "echo $(hostname) $(hostname -I)", timeout=600).stdout
    pairs = sorted(tuple(line.split()) for line in out.splitlines())
    names = {slurm_cluster.spec.node_name(i) for i in slurm_cluster.spec.node_indices}
    assert len({p[0] for p in pairs}) == 3 and {p[0] for p in pairs} <= names, pairs  # three of the suite's nodes
    assert len({p[1] for p in pairs}) == 3


def test_gres_request_sets_cuda_visible_devices(slurm_cluster):
    out = slurm_cluster.run(
        "srun", "-N2", "--gres=gpu:2", "bash", "-c", "echo $(hostname) $CUDA_VISIBLE_DEVICES"
    ).stdout
    rows = sorted(line.split() for line in out.splitlines())
    assert len({name for name, _ in rows}) == 2  # two nodes, one line each
    for _, devices in rows:  # two distinct fake GPUs of the node's eight (which ones depends on what else runs)
        indices = devices.split(",")
        assert len(set(indices)) == 2 and all(0 <= int(i) < 8 for i in indices)


def test_two_node_batch_job_runs_one_step_per_node(slurm_cluster, tmp_path):
    script = tmp_path / "two.sbatch"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --gres=gpu:8\n"
        'for n in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do\n'
        "  srun --nodes=1 --ntasks=1 -w \"$n\" bash -c 'echo step $(hostname) $SLURM_NODEID' &\n"
        "done\nwait\n"
    )
    out = tmp_path / "out.log"
    job = slurm_cluster.run("sbatch", "--parsable", "-o", str(out), str(script)).stdout.strip()
    _wait_state(slurm_cluster, job, {"COMPLETED"})
    steps = sorted(line for line in out.read_text().splitlines() if line.startswith("step"))
    hosts = [s.split()[1] for s in steps]  # one step on each of the job's two nodes (whichever were free)
    assert len(set(hosts)) == 2, steps


def test_requeue_of_running_job_reruns_it_with_restart_count(slurm_cluster, tmp_path):
    out = tmp_path / "requeue.log"
    script = tmp_path / "rq.sbatch"
    script.write_text(
        "#!/bin/bash\n#SBATCH --open-mode=append\n"
        "echo run restart=${SLURM_RESTART_COUNT:-0}\n"
        '[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] && exit 0\nsleep 120\n'
    )
    job = slurm_cluster.run("sbatch", "--parsable", "--requeue", "-o", str(out), str(script)).stdout.strip()
    _wait_state(slurm_cluster, job, {"RUNNING"})
    wait_for(lambda: "restart=0" in _read(out), "the job's first run", 20)
    slurm_cluster.run("scontrol", "requeue", job)
    _wait_state(slurm_cluster, job, {"COMPLETED"}, timeout=90)
    assert re.findall(r"restart=\d", out.read_text()) == ["restart=0", "restart=1"]


def test_sacct_knows_finished_jobs(slurm_cluster):
    job = slurm_cluster.run("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true").stdout.strip()
    _wait_state(slurm_cluster, job, {"COMPLETED"})

    def recorded() -> bool:
        out = slurm_cluster.run("sacct", "-X", "-n", "-P", "-j", job, "-o", "State", check=False).stdout
        return out.strip() == "COMPLETED"

    wait_for(recorded, "the record", 30)


def test_second_up_with_other_settings_says_so_and_keeps_the_cluster(slurm_cluster):
    other = type(slurm_cluster.spec)(dir=slurm_cluster.spec.dir, nodes=2)
    with pytest.raises(cluster.ClusterError, match="other settings is running"):
        cluster.up(other)
    # the suite's cluster preempts (`up --preemption`): one without is another shape, and the message says how it runs
    plain = dataclasses.replace(slurm_cluster.spec, preemption=False)
    with pytest.raises(
        cluster.ClusterError, match="preemption by partition urgent, GraceTime 60 s, PreemptMode REQUEUE"
    ):
        cluster.up(plain)
    cluster.up(slurm_cluster.spec)  # same settings: a no-op
    assert cluster.is_up(slurm_cluster.spec)


def test_env_points_slurm_commands_at_the_cluster(slurm_cluster):
    out = subprocess.run(
        ["multinode", "cluster", "env", "--dir", str(slurm_cluster.spec.dir)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"export SLURM_CONF={slurm_cluster.spec.slurm_conf}" in out
    # a shell that evals it talks to this cluster with its release's commands, daemons and jobs alike
    probe = 'eval "$(multinode cluster env --dir "$1")"; sbatch --version; srun -N2 bash -c "sbatch --version"'
    bin_dir = str(slurm_cluster.spec.dir / "bin")  # on this process's PATH for 24.11: the eval must put it there
    env = os.environ | {"PATH": ":".join(p for p in os.environ["PATH"].split(":") if p != bin_dir)}
    said = subprocess.run(
        ["bash", "-c", probe, "probe", str(slurm_cluster.spec.dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert said.returncode == 0, said.stderr
    versions = said.stdout.split("\n")
    assert len([v for v in versions if v]) == 3 and all(v.split()[-1].startswith(TEST_SLURM) for v in versions if v)


@pytest.fixture
def spare_dirs() -> Iterator[Callable[[], Path]]:
    """Cluster folders outside pytest's private tmp (munged wants every folder above its socket world-executable)."""
    made: list[Path] = []

    def make() -> Path:
        made.append(Path(tempfile.mkdtemp(prefix="mn-spare-", dir="/var/tmp")))
        made[-1].chmod(0o755)
        return made[-1]

    yield make
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


def test_a_second_cluster_runs_beside_this_one_and_its_down_leaves_this_one_alone(slurm_cluster, spare_dirs):
    """A user's sandbox and the suite's cluster coexist: each folder has its own bridge, subnet, namespaces and
    ports; `down` of one stops exactly its own daemons and links, and `up` right after works again."""
    first = slurm_cluster.spec
    # a slot no running cluster holds (another release's test tier may be up beside this one)
    folder = next(d for _ in range(50) if cluster.network_owner(ClusterSpec(dir=(d := spare_dirs()))) is None)
    second = ClusterSpec(dir=folder, nodes=1, cpus=1, gpus=0, accounting=False)
    assert {second.bridge, second.subnet, second.ctld_port} & {first.bridge, first.subnet, first.ctld_port} == set()
    first_pids = {d.name: d.pid() for d in cluster.daemons(first)}
    for _ in range(2):  # up, use, down, and once more: down leaves nothing that blocks the next up
        cluster.up(second)
        env2 = os.environ | {"SLURM_CONF": str(second.slurm_conf)}
        ids = {
            spec.dir: subprocess.run(
                ["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "hostname"],
                env=os.environ | {"SLURM_CONF": str(spec.slurm_conf)},
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            for spec in (first, second)
        }
        _wait_state(slurm_cluster, ids[first.dir], {"COMPLETED"})
        job2 = ids[second.dir]
        wait_for(lambda env=env2, job=job2: _squeue_state(env, job) == "COMPLETED", f"job {job2} COMPLETED", 60)
        assert _squeue_state(env2, job2) == "COMPLETED"
        second_pids = [p for d in cluster.daemons(second) if (p := d.pid())]
        assert len(second_pids) == 3  # munged, slurmctld, slurmd node1

        assert cluster.down(second) == []
        assert not [pid for pid in second_pids if _alive(pid)]
        assert not Path(f"/run/netns/{second.netns(1)}").exists()
        assert not Path(f"/sys/class/net/{second.bridge}").exists()
        assert not Path(f"/sys/class/net/{second.host_link(1)}").exists()
        assert not cgroups.node_dir(second, 1, "freezer").exists()  # its node's cgroup tree is gone too
        # the suite's cluster: same daemons, its network, its nodes idle
        assert {d.name: d.pid() for d in cluster.daemons(first)} == first_pids
        assert all(Path(f"/run/netns/{first.netns(i)}").exists() for i in first.node_indices)
        assert cluster.network_owner(first) == str(first.dir)
        all_idle(first)


def test_a_folder_whose_slot_another_cluster_holds_is_refused_without_touching_it(slurm_cluster, spare_dirs):
    first = slurm_cluster.spec
    clash = ClusterSpec(dir=spare_dirs(), nodes=1, gpus=0, accounting=False, slot=first.slot)
    with pytest.raises(cluster.ClusterError, match=f"belongs to the sandbox cluster in {first.dir}"):
        cluster.up(clash)
    assert cluster.down(clash) == []  # nothing of its own to stop, and the other's network is not its to remove
    assert cluster.is_up(first) and cluster.network_owner(first) == str(first.dir)
    all_idle(first)


def all_idle(spec: ClusterSpec) -> None:
    """Every node of the suite's cluster idle again: other tests' jobs may still be ending (COMPLETING) on some."""
    every = {spec.node_name(i) for i in spec.node_indices}
    wait_for(lambda: cluster.nodes_in(spec, "idle") == every, "every node of the suite's cluster idle", 600)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _squeue_state(env, job: str) -> str:
    cmd = ["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True).stdout.strip()


def _read(path) -> str:
    return path.read_text() if path.exists() else ""


def _wait_state(cl, job: str, states: set[str], timeout: float = 60) -> str:
    seen = ""

    def reached() -> bool:
        nonlocal seen
        seen = cl.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%T", check=False).stdout.strip()
        return seen in states

    wait_for(reached, f"job {job} in {states} (last seen {seen!r})", timeout)
    return seen


# --- process tracking: a job's end ends every process it started ---------------------------------------------------
# setsid (a new session and process group) + nohup (deaf to SIGHUP), stdio detached, its parent shell not waiting:
# the escape of a daemonizing tool. The pid file is written by the escaped process itself; its `sleep` carries a
# token so that the test (and its clean-up) never mistakes a reused pid for it.
ESCAPE_SCRIPT = """#!/bin/bash
setsid nohup bash -c 'echo $$ > {pidfile}; exec sleep {token}' >/dev/null 2>&1 </dev/null &
for _ in $(seq 300); do [ -s {pidfile} ] && break; sleep 0.1; done
{then}
"""


def _escaped_alive(pid: int, token: str) -> bool:
    try:
        return _alive(pid) and Path(f"/proc/{pid}/cmdline").read_bytes() == f"sleep\0{token}\0".encode()
    except OSError:
        return False


@pytest.mark.parametrize("how", ["job ends", "scancel", "node set DOWN"])
def test_a_process_that_escaped_the_batch_shell_ends_with_the_job(slurm_cluster, tmp_path, how):
    """With proctrack/linuxproc the escaped `sleep` (reparented to init, in its own session) runs on after the job;
    with proctrack/cgroup it stays in the job's freezer cgroup and SLURM kills it with the job."""
    token = f"{900 + time.time_ns() % 100}.{os.getpid()}{time.time_ns() % 10**6}"  # sleep's argument, unique
    pidfile = tmp_path / "escaped.pid"
    release = tmp_path / "release"
    script = tmp_path / "escape.sbatch"
    script.write_text(
        ESCAPE_SCRIPT.format(pidfile=pidfile, token=token, then=f"while [ ! -e {release} ]; do sleep 0.1; done")
    )  # the job ends (or is ended) only after the test has seen its escapee alive
    # A node going down hits only this job, which ends NODE_FAIL instead of being requeued elsewhere.
    extra = ["--exclusive", "--no-requeue"] if how == "node set DOWN" else []
    job = slurm_cluster.run("sbatch", "--parsable", *extra, "-o", str(tmp_path / "out.log"), str(script)).stdout.strip()
    pid = 0
    node = ""
    try:
        wait_for(lambda: _read(pidfile).strip().isdigit(), f"job {job} starting its escapee", 90)
        pid = int(pidfile.read_text())
        assert _escaped_alive(pid, token)
        if how == "job ends":
            release.touch()
        elif how == "scancel":
            slurm_cluster.run("scancel", job)
        elif how == "node set DOWN":
            node = slurm_cluster.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()
            slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=down", "reason=test-escaped-children")
        _wait_state(slurm_cluster, job, {"COMPLETED", "CANCELLED", "NODE_FAIL", "FAILED"}, timeout=90)
        what = (
            f"end of pid {pid} (started by job {job}, escaped with setsid+nohup) after the job ended ({how}); "
            f"the cluster tracks with {_proctrack(slurm_cluster)}"
        )
        wait_for(lambda: not _escaped_alive(pid, token), what, 60)
    finally:
        if node:
            slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        if pid and _escaped_alive(pid, token):  # only our own escapee, checked by its token
            os.kill(pid, 9)
        slurm_cluster.run("scancel", job, check=False)


def _proctrack(cl) -> str:
    conf = cl.run("scontrol", "show", "config", check=False).stdout
    return next((line.split("=", 1)[1].strip() for line in conf.splitlines() if line.startswith("ProctrackType")), "?")


def test_each_node_tracks_its_jobs_in_its_own_cgroup_tree(slurm_cluster):
    """Several slurmd on one host, and two clusters beside each other, never share a cgroup: node i's job cgroups
    lie under freezer:/mn<slot>-node<i> (its slurmd's cgroup namespace), none in the host's own tree."""
    spec = slurm_cluster.spec
    assert cluster.uses_cgroups(spec), f"{spec.dir} tracks with {_proctrack(slurm_cluster)}: restart it (down, up)"
    job = slurm_cluster.run("sbatch", "--parsable", "-N2", "-o", "/dev/null", "--wrap", "srun sleep 120").stdout.strip()
    try:
        _wait_state(slurm_cluster, job, {"RUNNING"})
        nodes = slurm_cluster.run("scontrol", "show", "hostnames", _squeue_field(slurm_cluster, job, "%N")).stdout
        for node in nodes.split():
            i = int(node.removeprefix("node"))
            # Debian builds SLURM for several slurmd per host: the tree is named slurm_<node>
            mine = cgroups.node_dir(spec, i, "freezer") / f"slurm_{node}" / f"uid_{os.getuid()}" / f"job_{job}"
            wait_for(lambda d=mine: (d / "step_0").is_dir(), f"cgroup {mine}/step_0", 30)
            assert not (cgroups.CGROUP_FS / "freezer" / f"slurm_{node}" / f"uid_{os.getuid()}" / f"job_{job}").exists()
    finally:
        slurm_cluster.run("scancel", job, check=False)


def _squeue_field(cl, job: str, field: str) -> str:
    return cl.run("squeue", "-h", "-j", job, "-o", field).stdout.strip()
