"""`multinode torchrun`: what it starts on each node (the real multi-node runs are in test_executor_cluster)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from snakemake_executor_multinode import protocol
from snakemake_executor_multinode.launch import (
    Allocation,
    nproc_for,
    plan,
    read_allocation,
    split_torchrun_args,
    worker_env,
)

ALLOC = Allocation(
    "4242", ("node110", "node111"), gpus_per_node=8, cpus_per_task=64, master_addr="10.0.0.110", master_port=24242
)


def test_one_srun_per_node_with_explicit_node_rank():
    launches = plan(ALLOC, [], ["train.py", "--lr", "3e-4"], python="python")
    assert [(ln.node, ln.rank) for ln in launches] == [("node110", 0), ("node111", 1)]
    argv = launches[1].argv
    assert argv[:9] == (
        "srun",
        "--nodes=1",
        "--ntasks=1",
        "--nodelist=node111",
        "--cpus-per-task=64",
        "--mem=0",
        "--kill-on-bad-exit=1",
        "--export=ALL",
        "--job-name=torchrun-node1",
    )
    tail = argv[argv.index("multinode-agent") + 1 :]
    assert tail == (
        "python",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc_per_node=8",
        "--node_rank=1",
        "--master_addr=10.0.0.110",
        "--master_port=24242",
        "train.py",
        "--lr",
        "3e-4",
    )


def test_torchrun_agent_ignores_usr2_so_the_signal_reaches_only_the_workers():
    argv = plan(ALLOC, [], ["train.py"])[0].argv
    assert argv[9:12] == ("bash", "-c", 'trap "" USR2; exec "$@"')


def test_user_torchrun_options_pass_through_and_nproc_can_be_overridden():
    opts, script = split_torchrun_args(["--nproc_per_node", "2", "--max-restarts=1", "train.py", "--nnodes", "x"])
    assert opts == ["--nproc_per_node", "2", "--max-restarts=1"] and script == ["train.py", "--nnodes", "x"]
    argv = plan(ALLOC, opts, script)[0].argv
    assert "--nproc_per_node=2" in argv and "--max-restarts=1" in argv and argv.count("--nproc_per_node") == 0
    assert nproc_for(ALLOC, opts) == 2


@pytest.mark.parametrize("opt", ["--node_rank=1", "--nnodes=3", "--standalone"])
def test_options_the_launcher_owns_are_refused(opt):
    with pytest.raises(SystemExit, match="set by the launcher"):
        plan(ALLOC, [opt], ["train.py"])


def test_unknown_option_and_missing_script_are_clear():
    with pytest.raises(SystemExit, match="unknown torchrun option '--bogus'"):
        split_torchrun_args(["--bogus", "train.py"])
    with pytest.raises(SystemExit, match="no training script"):
        split_torchrun_args(["--nproc_per_node=2"])


def test_workers_get_cpus_per_gpu_as_omp_threads():
    env = worker_env(ALLOC, 8, {"OMP_NUM_THREADS": "1"})
    assert env["OMP_NUM_THREADS"] == "8" and env["MASTER_PORT"] == "24242"
    assert worker_env(ALLOC, 4, {})["OMP_NUM_THREADS"] == "16"  # a --nproc_per_node override shares the CPUs too


def test_allocation_from_the_job_script_environment():
    env = {
        "SLURM_JOB_ID": "77",
        "NODELIST": "node1\nnode2",
        "MULTINODE_GPUS_PER_NODE": "2",
        "MULTINODE_CPUS_PER_TASK": "4",
        "MASTER_ADDR": "172.31.250.11",
        "MASTER_PORT": "20077",
    }
    alloc = read_allocation(env)
    assert alloc.nodes == ("node1", "node2") and alloc.gpus_per_node == 2 and alloc.master_port == 20077


def test_hand_written_allocation_counts_gpus_from_slurm():
    env = {
        "SLURM_JOB_ID": "40001",
        "NODELIST": "a b",
        "SLURM_GPUS_ON_NODE": "4",
        "SLURM_CPUS_PER_TASK": "16",
        "MASTER_ADDR": "10.1.1.1",
    }
    alloc = read_allocation(env)
    assert (alloc.gpus_per_node, alloc.cpus_per_task, alloc.master_port) == (4, 16, protocol.master_port(1))


def test_outside_slurm_it_is_a_one_node_torchrun(tmp_path):
    script = tmp_path / "w.py"
    script.write_text("import os; print('WORLD', os.environ['WORLD_SIZE'], os.environ['GROUP_RANK'])\n")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake_executor_multinode.cli", "torchrun", "--nproc_per_node=2", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("WORLD 2 0") == 2
    assert "no SLURM allocation" in proc.stderr
