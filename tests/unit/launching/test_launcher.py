"""`multinode torchrun`: what it starts on each node (the real multi-node runs are in test_executor_cluster).
The tests that start processes: tests/process/launching/test_launcher.py."""

from __future__ import annotations

import os
import sys

import pytest

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.launching import launcher
from snakemake_executor_multinode.launching.launcher import (
    Allocation,
    StepWatch,
    main,
    nproc_for,
    read_allocation,
    split_torchrun_args,
    srun_command,
    step_command,
    torchrun_command,
    worker_env,
)
from snakemake_executor_multinode.launching.torchrun_flags import TAKES_VALUE
from tests.helpers import ALLOC, SRUN_FAILURE


def test_one_torchrun_builder_for_every_mode():
    assert torchrun_command(["--max-restarts=1"], ["t.py"], nproc="gpu", python="py") == [
        "py",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=gpu",
        "--max-restarts=1",
        "t.py",
    ]
    assert torchrun_command([], ["t.py"], nproc=8, alloc=ALLOC, node_rank=1, python="py")[3:6] == [
        "--nnodes=2",
        "--nproc_per_node=8",
        "--node_rank=1",
    ]


@pytest.mark.parametrize(
    ("opts", "says"),
    [
        (["--node_rank=1"], "--node_rank: the launcher gives each node its rank"),
        (["--node-rank", "0"], "--node_rank: the launcher gives each node its rank"),
        (["--standalone"], "--standalone: this allocation has 2 node"),
        (["--nnodes=3"], "--nnodes: '3', but the allocation has 2 node\\(s\\) \\(node110,node111\\)"),
        (["--nnodes=1:2"], "--nnodes: '1:2', but the allocation has 2"),
        (["--master_addr=10.9.9.9"], "--master_addr: '10.9.9.9', but the launcher's rendezvous is 10.0.0.110:24242"),
        (["--master-port", "1234"], "--master_port: '1234'"),
        (["--rdzv_backend=etcd"], "--rdzv_backend: 'etcd' is not available here; allowed: static, c10d"),
        (["--rdzv_endpoint=10.0.0.110:24242"], "--rdzv_endpoint: .* with --rdzv_backend=c10d"),
        (["--rdzv_backend=c10d", "--rdzv_endpoint=h:1"], "--rdzv_endpoint: 'h:1'; the launcher puts the endpoint"),
        (["--tee=3"], "--tee: the launcher keeps every rank's output"),
        (["-r", "3"], None),  # -r is --redirects' short form: see below
        (["--nproc_per_node=many"], "--nproc_per_node: 'many'; allowed: a positive integer, gpu, cpu or auto"),
        (["--max-restarts=2"], "--max_restarts: needs --rdzv_backend=c10d"),
    ],
)
def test_a_flag_that_would_desynchronise_the_nodes_is_refused_saying_why(opts, says):
    if says is None:
        opts, says = ["--redirects", "3"], "--redirects: the launcher keeps every rank's output"
    with pytest.raises(SystemExit, match=says):
        srun_command(ALLOC, opts, ["train.py"])


@pytest.mark.parametrize(
    "opts",
    [
        ["--nnodes=2"],
        ["--nnodes", "2:2"],
        ["--master_addr=10.0.0.110", "--master_port=24242"],
        ["--master-addr", "10.0.0.110"],
        ["--rdzv_backend=static"],
    ],
)
def test_values_the_launcher_would_write_anyway_are_accepted_once(opts):
    argv = srun_command(ALLOC, opts, ["train.py"], python="py")
    line = argv[-2]
    assert line.count("--nnodes=2") == 1 and line.count("--master_addr=10.0.0.110") == 1
    assert line.count("--master_port=24242") == 1 and "--rdzv_backend=static" not in line


def test_nproc_per_node_gpu_cpu_and_auto_count_the_allocation():
    assert nproc_for(ALLOC, ["--nproc_per_node=gpu"]) == 8
    assert nproc_for(ALLOC, ["--nproc-per-node", "cpu"]) == 64
    assert nproc_for(ALLOC, ["--nproc_per_node=auto"]) == 8
    cpu_only = Allocation("1", ("a", "b"), gpus_per_node=0, cpus_per_task=4, master_addr="h", master_port=1)
    assert nproc_for(cpu_only, ["--nproc_per_node=auto"]) == 4
    with pytest.raises(SystemExit, match="--nproc_per_node=gpu: this allocation has no GPUs"):
        nproc_for(cpu_only, ["--nproc_per_node=gpu"])
    assert "--nproc_per_node=8" in srun_command(ALLOC, ["--nproc_per_node=gpu"], ["t.py"])[-2]


def test_c10d_puts_the_endpoint_on_the_head_node_and_lets_torchrun_restart_workers():
    cmd = torchrun_command(["--rdzv_backend=c10d", "--max-restarts=2"], ["t.py"], nproc=2, alloc=ALLOC, python="py")
    assert cmd == [
        "py",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc_per_node=2",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=10.0.0.110:24242",
        "--rdzv_id=4242",
        "--max-restarts=2",
        "t.py",
    ]
    assert "--dynamic" in srun_command(ALLOC, ["--rdzv_backend=c10d"], ["t.py"])[-2]  # the rendezvous numbers the ranks
    mine = torchrun_command(["--rdzv_backend", "c10d", "--rdzv_id", "x"], ["t.py"], nproc=2, alloc=ALLOC)
    assert "--rdzv_id=4242" not in mine and mine.count("--rdzv_backend=c10d") == 1 and ["--rdzv_id", "x"] == mine[-3:-1]


def test_unknown_option_and_missing_script_are_clear():
    with pytest.raises(SystemExit, match="unknown torchrun option '--bogus'"):
        split_torchrun_args(["--bogus", "train.py"])
    with pytest.raises(SystemExit, match="no training script"):
        split_torchrun_args(["--nproc_per_node=2"])


def test_values_short_options_and_flags_are_told_apart():
    assert split_torchrun_args(["-t", "3", "-r3", "--no-python", "-m", "pkg.train", "x"]) == (
        ["-t", "3", "-r3", "--no-python", "-m"],
        ["pkg.train", "x"],
    )
    assert split_torchrun_args(["--role", "w", "--", "-script-like", "a"]) == (["--role", "w"], ["-script-like", "a"])


def test_the_flag_table_is_torchruns_own_parser():
    run = pytest.importorskip("torch.distributed.run")
    parser = run.get_args_parser()
    theirs = {opt: action.nargs != 0 for action in parser._actions for opt in action.option_strings}
    assert TAKES_VALUE == theirs


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


def test_a_users_own_srun_step_runs_this_nodes_torchrun(monkeypatch):
    monkeypatch.setattr(launcher, "hostnames", lambda nodelist: ["a", "b"])
    env = {
        "SLURM_JOB_ID": "40001",
        "SLURM_STEP_ID": "2",
        "SLURM_STEP_NODELIST": "a,b",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_NODEID": "1",
        "SLURM_GPUS_ON_NODE": "2",
        "SLURM_CPUS_PER_TASK": "4",
        "MASTER_ADDR": "10.1.1.1",
    }
    cmd, env_out = step_command(env, [], ["train.py"], python="py")
    assert cmd == [
        "py",
        "-m",
        "snakemake_executor_multinode.launching.nodelog",
        "--nproc=2",
        "--echo",  # a user's own step: srun forwards the node's lines
        "--",
        "py",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc_per_node=2",
        "--node_rank=1",  # SLURM_NODEID, as in the launcher's own step
        "--master_addr=10.1.1.1",
        f"--master_port={protocol.master_port(40001, 2)}",  # job and step: a second step gets another port
        "train.py",
    ]
    assert env_out["OMP_NUM_THREADS"] == "2"
    with pytest.raises(SystemExit, match="one task per node"):
        step_command(env | {"SLURM_STEP_NUM_TASKS": "4"}, [], ["train.py"])


def test_srun_names_the_first_failing_node_and_what_follows_does_not_count():
    watch = StepWatch(["node1", "node2"])
    data = SRUN_FAILURE.encode()
    found = [watch.feed(data[i : i + 7]) for i in range(0, len(data), 7)]  # lines split across reads
    failures = [f for f in found if f]
    assert len(failures) == 1 and (failures[0].node, failures[0].rank, failures[0].code) == ("node2", 1, 3)


def test_a_node_killed_by_a_signal_is_named_with_the_shells_code():
    watch = StepWatch(["node1", "node2", "node3"])
    failed = watch.feed(b"srun: error: node3: task 2: Killed\n")
    assert failed and (failed.node, failed.rank, failed.code) == ("node3", 2, 137)


def test_a_step_cancelled_from_outside_names_no_node():
    watch = StepWatch(["node1", "node2"])
    text = b"slurmstepd-node1: error: *** STEP 5.0 ON node1 CANCELLED AT 2026-12-03 DUE TO TIME LIMIT ***\n"
    assert watch.feed(text + b"srun: error: node1: task 0: Terminated\n") is None and watch.failure is None


@pytest.mark.parametrize("step", [False, True], ids=["outside-slurm", "own-srun-step"])
def test_a_container_the_launcher_cannot_apply_is_an_error_not_ignored(monkeypatch, step):
    for key in [k for k in os.environ if k.startswith(("SLURM_", "MULTINODE_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv(protocol.CONTAINER_RUNTIME_VAR, "podman")
    monkeypatch.setenv(protocol.CONTAINER_IMAGE_VAR, "localhost/train:1")
    if step:
        monkeypatch.setenv("SLURM_JOB_ID", "7")
        monkeypatch.setenv("SLURM_JOB_NODELIST", "a")
        monkeypatch.setenv("SLURM_STEP_ID", "0")
    where = "inside your own srun step" if step else "outside SLURM"
    with pytest.raises(SystemExit, match=f"{where} the profile's container .* cannot be applied"):
        main(["train.py"])


def test_when_every_node_answers_srun_s_failing_node_is_blamed(monkeypatch):
    failed = launcher.Failure("node2", 1, 3, "Exited with exit code 3")
    monkeypatch.setattr(launcher.liveness, "slurmd_port", lambda env: 6818)
    assert launcher.blame(failed, ("node1", "node2"), {}, find_dead=lambda nodes, port: []) == failed
    assert launcher.blame(failed, ("node1", "node2"), {}, find_dead=lambda nodes, port: ["node2"]) == failed


def test_the_python_that_holds_multinode_runs_torchrun_and_another_activated_environment_is_said(capfd):
    launcher.check_python({"VIRTUAL_ENV": "/envs/other"}, prefix="/envs/mine", torch_found=True)
    err = capfd.readouterr().err
    assert (
        f"WARNING: VIRTUAL_ENV=/envs/other is activated, but torchrun and the training run with {sys.executable}" in err
    )
    launcher.check_python({"CONDA_PREFIX": "/envs/mine/"}, prefix="/envs/mine", torch_found=True)  # the same one
    assert capfd.readouterr().err == ""


def test_a_python_without_torch_is_an_error_before_anything_starts():
    with pytest.raises(SystemExit, match="has no torch: install the plugin into the environment that has your torch"):
        launcher.check_python({}, torch_found=False)
