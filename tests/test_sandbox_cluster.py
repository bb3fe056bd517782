"""`multinode cluster`: a real SLURM cluster of namespaced nodes with fake GPUs on one machine."""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from snakemake_executor_multinode.sandbox import cluster

pytestmark = pytest.mark.cluster


def test_three_idle_nodes_each_with_eight_gpus(slurm_cluster):
    out = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %T %G").stdout.split("\n")
    rows = sorted(line.split() for line in out if line.strip())
    assert rows == [[f"node{i}", "idle", "gpu:8"] for i in (1, 2, 3)]


def test_srun_across_three_nodes_sees_three_hostnames_and_addresses(slurm_cluster):
    out = slurm_cluster.run("srun", "-N3", "bash", "-c", "echo $(hostname) $(hostname -I)").stdout
    pairs = sorted(tuple(line.split()) for line in out.splitlines())
    assert [p[0] for p in pairs] == ["node1", "node2", "node3"]
    assert len({p[1] for p in pairs}) == 3


def test_gres_request_sets_cuda_visible_devices(slurm_cluster):
    out = slurm_cluster.run(
        "srun", "-N2", "--gres=gpu:2", "bash", "-c", "echo $(hostname) $CUDA_VISIBLE_DEVICES"
    ).stdout
    assert sorted(out.split("\n")[:2]) == ["node1 0,1", "node2 0,1"]


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
    assert [s.split()[1] for s in steps] == ["node1", "node2"]


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
    _wait_for(lambda: "restart=0" in _read(out), 20)
    slurm_cluster.run("scontrol", "requeue", job)
    _wait_state(slurm_cluster, job, {"COMPLETED"}, timeout=90)
    assert re.findall(r"restart=\d", out.read_text()) == ["restart=0", "restart=1"]


def test_sacct_knows_finished_jobs(slurm_cluster):
    job = slurm_cluster.run("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true").stdout.strip()
    _wait_state(slurm_cluster, job, {"COMPLETED"})

    def recorded() -> bool:
        out = slurm_cluster.run("sacct", "-X", "-n", "-P", "-j", job, "-o", "State", check=False).stdout
        return out.strip() == "COMPLETED"

    assert _wait_for(recorded, 30)


def test_second_up_with_other_settings_says_so_and_keeps_the_cluster(slurm_cluster):
    other = type(slurm_cluster.spec)(dir=slurm_cluster.spec.dir, nodes=2)
    with pytest.raises(cluster.ClusterError, match="other settings is running"):
        cluster.up(other)
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


@pytest.mark.teardown_last
def test_down_leaves_no_process_namespace_or_bridge(slurm_cluster):
    assert cluster.down(slurm_cluster.spec) == []
    slurm_cluster.torn_down = True
    running = subprocess.run(["ps", "-eo", "stat=,comm="], capture_output=True, text=True).stdout
    live = [line.split()[1] for line in running.splitlines() if not line.strip().startswith("Z")]
    assert not [c for c in live if c in ("slurmctld", "slurmd", "slurmdbd", "slurmstepd", "munged", "mariadbd")]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "mn-node" not in netns
    assert subprocess.run(["ip", "link", "show", slurm_cluster.spec.bridge], capture_output=True).returncode != 0


def _read(path) -> str:
    return path.read_text() if path.exists() else ""


def _wait_for(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.3)
    return False


def _wait_state(cl, job: str, states: set[str], timeout: float = 60) -> str:
    seen = ""

    def reached() -> bool:
        nonlocal seen
        seen = cl.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%T", check=False).stdout.strip()
        return seen in states

    assert _wait_for(reached, timeout), f"job {job} is {seen!r}, expected {states}"
    return seen
