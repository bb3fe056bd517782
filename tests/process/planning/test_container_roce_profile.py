"""workflows/profiles/container-roce-example is valid as shipped: the planner accepts it on the example Snakefile
(`multinode preview --rule`, the executor's own planning, no cluster) and makes of it what its comments say."""

from __future__ import annotations

import subprocess

import pytest

from tests.helpers import REPO

PROFILE = "workflows/profiles/container-roce-example"


def preview(rule: str) -> subprocess.CompletedProcess:
    # --forcerun: the checkout may hold the example's results (scripts/example.sh before the suite, the README's
    # order), and a rule whose outputs are up to date has no job to preview
    argv = ["multinode", "preview", "--rule", rule, "-s", "workflows/Snakefile", "--workflow-profile", PROFILE]
    argv += ["--forcerun", rule]
    if rule == "preprocess":
        argv += ["--wildcards", "shard=0"]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_train_is_four_h100_nodes_on_four_roce_rails_in_the_pyxis_image():
    proc = preview("train")
    for line in (
        "#SBATCH --nodes=4",
        "#SBATCH --gres=gpu:8",
        "#SBATCH --cpus-per-task=96",
        "#SBATCH --partition=gpu_h100",
        "#SBATCH --account=your_account",
        "#SBATCH --signal=USR2@120",
        "export NCCL_IB_DISABLE=0",
        "export NCCL_IB_HCA==mlx5_0,mlx5_3,mlx5_4,mlx5_5",
        "export NCCL_IB_GID_INDEX=3",
        "export NCCL_IB_TC=106",
        "export NCCL_SOCKET_IFNAME==bond0",
    ):
        assert line in proc.stdout.splitlines(), line
    srun = next(line for line in proc.stderr.splitlines() if line.startswith("srun "))
    assert "--container-image=nvcr.io#nvidia/pytorch:24.05-py3" in srun
    assert "/datasets:/datasets:ro" in srun and "--container-remap-root" in srun


@pytest.mark.parametrize("rule", ["preprocess", "merge", "evaluate"])
def test_rules_without_gpus_go_to_the_cpu_partition_without_nccl_or_container(rule):
    script = preview(rule).stdout
    assert "#SBATCH --partition=cpu" in script.splitlines()
    assert "source /shared/envs/pipeline/bin/activate" in script
    assert "--gres" not in script and "NCCL_IB" not in script and "MULTINODE_CONTAINER_IMAGE" not in script
