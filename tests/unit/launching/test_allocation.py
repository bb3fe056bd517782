"""The allocation a launch runs in, read from the job script's or an srun step's environment (one builder)."""

from __future__ import annotations

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.launching.allocation import allocation, count_devices, read_allocation

ENV = {"SLURM_JOB_ID": "41", "NODELIST": "node1 node2", "MASTER_ADDR": "10.0.0.1", "SLURM_CPUS_PER_TASK": "4"}


def test_the_job_scripts_allocation():
    alloc = read_allocation({**ENV, "MULTINODE_GPUS_PER_NODE": "2", "MASTER_PORT": "20164"})
    assert alloc.nodes == ("node1", "node2") and alloc.gpus_per_node == 2 and alloc.cpus_per_task == 4
    assert (alloc.master_addr, alloc.master_port) == ("10.0.0.1", 20164)


def test_every_node_derives_the_same_port_from_the_job_and_step_id():
    env = {k: v for k, v in ENV.items() if k != "NODELIST"}
    first, second = (allocation(env, ["node1", "node2"], 4, step_id=s) for s in (0, 1))
    assert first.master_port == protocol.master_port(41, 0) != second.master_port == protocol.master_port(41, 1)


def test_devices_per_node_from_the_first_variable_that_says():
    assert count_devices({"SLURM_GPUS_ON_NODE": "8"}) == 8
    assert count_devices({"SLURM_GPUS_PER_NODE": "a100:4"}) == 4
    assert count_devices({"CUDA_VISIBLE_DEVICES": "0,1,2"}) == 3
    assert count_devices({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}) == 0
