"""The example pipeline's profiles are valid as shipped (dry runs: no cluster, nothing submitted)."""

from __future__ import annotations

import subprocess

from tests.helpers import REPO, example_pipeline


def dry_run(profile: str) -> str:
    proc = subprocess.run(
        [*example_pipeline(profile), "-n", "--forceall"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def test_local_profile_plans_the_whole_pipeline():
    out = dry_run("local")
    for rule in ("preprocess", "merge", "train", "evaluate", "allocation_report"):
        assert f"rule {rule}:" in out or f"{rule} " in out


def test_gpu_cluster_profile_asks_for_two_nodes_of_eight_gpus():
    out = dry_run("gpu-cluster-example")
    assert "nodes=2" in out and "gpus=8" in out and "cpus_per_task=64" in out and "runtime=20160" in out


def test_preview_of_the_gpu_cluster_train_job_is_the_seed_recipe():
    proc = subprocess.run(
        [
            "multinode",
            "preview",
            "--rule",
            "train",
            "--profile-file",
            "workflows/profiles/gpu-cluster-example/env.yaml",
            "--partition",
            "gpu_A6000",
            "--account",
            "your_account",
            "nodes=2",
            "gpus=8",
            "cpus_per_task=64",
            "mem_mb=400000",
            "runtime=20160",
            "--",
            "multinode",
            "torchrun",
            "workflows/scripts/train.py",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    for line in (
        "#SBATCH --partition=gpu_A6000",
        "#SBATCH --gres=gpu:8",
        "#SBATCH --time=20160",
        "export NCCL_IB_HCA=mlx5_0",
        "conda activate my_env",
        "export CUDA_HOME=/path/to/cuda-11.8",
        "export MULTINODE_OMP_NUM_THREADS=8",
    ):
        assert line in script
