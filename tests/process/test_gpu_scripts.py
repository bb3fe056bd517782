"""The first job on the lent GPU (benchmarks/gpu/slurm_on_device.sh, run there; its result:
benchmarks/gpu/results-first-job-h100.json): what of it runs without a GPU. The carry script gathers the checkout and
the plugin's wheel; the device script writes a one-node cluster's configuration with the machine's GPUs as gres; the
checks pass on a run that did everything and name the part that is missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

GPU = REPO / "benchmarks" / "gpu"


@pytest.mark.parametrize("script", ["slurm_on_device.sh", "carry_first_job.sh"])
def test_the_scripts_parse(script):
    subprocess.run(["bash", "-n", str(GPU / script)], check=True)


@pytest.mark.skipif(shutil.which("slurmd") is None, reason="needs slurmd (slurmd -C describes this machine)")
def test_the_device_script_writes_a_one_node_cluster_with_the_gpus_as_gres(tmp_path):
    env = {**os.environ, "CONF_ONLY": "1", "DIR": str(tmp_path), "GPUS": "2"}
    subprocess.run(["bash", str(GPU / "slurm_on_device.sh"), str(tmp_path)], env=env, check=True)
    conf = (tmp_path / "slurm.conf").read_text()
    node = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    host = node.split()[0].removeprefix("NodeName=")
    assert f"{node} Gres=gpu:2 State=UNKNOWN" in conf and f"PartitionName=gpu Nodes={host} " in conf
    assert "GresTypes=gpu" in conf and "AccountingStorageType=accounting_storage/none" in conf
    assert (tmp_path / "gres.conf").read_text().splitlines() == [
        f"NodeName={host} Name=gpu File=/dev/nvidia0",
        f"NodeName={host} Name=gpu File=/dev/nvidia1",
    ]
    assert "IgnoreSystemd=yes" in (tmp_path / "cgroup.conf").read_text()


def test_the_carried_checkout_holds_the_scripts_and_the_plugin_s_wheel(tmp_path):
    env = {**os.environ, "PART": "repo"}
    subprocess.run(["bash", str(GPU / "carry_first_job.sh"), str(tmp_path)], env=env, check=True, capture_output=True)
    for path in ("benchmarks/gpu/slurm_on_device.sh", "workflows/examples/minimal_train.py", "pyproject.toml"):
        assert (tmp_path / "repo" / path).read_bytes() == (REPO / path).read_bytes()
    assert [p.name.split("-")[0] for p in (tmp_path / "whl").glob("*.whl")] == ["snakemake_executor_plugin_multinode"]


def metrics(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def step_lines(first: int, last: int, every: int = 50) -> list[dict]:
    return [{"step": s, "tokens_per_s": 500000.0, "mfu": 0.6, "loss": 0.1} for s in range(first, last + 1, every)]


def a_whole_run(work: Path) -> str:
    """The files and log of a run in which every part did what it should (the shapes slurm_on_device.sh leaves)."""
    ends = [{"event": "checkpoint_end", "step": s} for s in (200, 400, 600)]
    metrics(work / "plain/metrics.jsonl", step_lines(50, 600) + ends)
    local = work / "local/.snakemake/multinode/torchrun"
    metrics(local / "local-1.metrics.jsonl", step_lines(50, 400) + [{"event": "checkpoint_end", "step": 424}])
    metrics(local / "local-2.metrics.jsonl", [{"event": "resume", "step": 424}, *step_lines(450, 1000)])
    logs = work / "wf/.snakemake/multinode/logs/rule_train/_"
    metrics(
        logs / "4.attempt1.metrics.jsonl",
        [*step_lines(50, 400), {"event": "resume", "step": 401}, *step_lines(450, 1500)],
    )
    (logs / "4.attempt1.log").write_text(
        "job step: CUDA_VISIBLE_DEVICES=0 SLURM_GPUS_ON_NODE=1\n"
        "[multinode node-check] vm ok (0.0 s, 1 GPU(s) visible)\n"
        "[multinode torchrun] job 4: 1 node(s) x 1 process(es), master 192.0.2.2:20016; one srun step\n"
        "[vm rank0] NCCL INFO ncclCommInitRankConfig comm 0x1 rank 0 nranks 1 cudaDev 0 busId 60 - Init START\n"
        "[multinode] checkpointed after SIGUSR2 (401)\n[multinode] requeued; the next run resumes from the checkpoint\n"
    )
    (logs / "4.attempt1.vm.gpu.csv").write_text(
        "2026/12/06 06:09:20.403, 0, 0, 0, 81559\n2026/12/06 06:09:50.403, 0, 98, 6635, 81559\n"
    )
    (work / "snakemake.log").write_text("train (SLURM job 4): step 1500/1500 loss 0.000349 499k tok/s mfu 61.0%\n")
    metrics(work / "dl/metrics-block.jsonl", [{"event": "signalled", "alive": {"spawn": [True], "forkserver": [True]}}])
    signal_time = subprocess.run(
        ["date", "-d", "2026-12-06 06:09:30", "+%s"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return (
        "NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04\npython 3.12.3 /x torch 2.11.0+cu130 cuda 13.0\n"
        "plain torchrun exit 0\n"
        "[multinode torchrun] profile ethernet: NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=^lo,docker\n"
        "[multinode torchrun] the training checkpointed on the signal (step 424, x): a job would requeue\n"
        "local run 1 exit 85\nlocal run 2 exit 0\nsrun --gres=gpu:1: CUDA_VISIBLE_DEVICES=0\n"
        "multinode check exit 0\nmultinode preview exit 0 (232 lines)\n"
        f"scancel --signal=USR2 4 at {signal_time}.5\nsnakemake exit 0\n"
        "dataloader plain: scancel --signal=USR2 5 at 1.0\n"
        "[vm rank0] RuntimeError: DataLoader worker (pid 77) is killed by signal: User defined signal 2. \n"
        "dataloader plain exit 1\ndataloader ignore: scancel --signal=USR2 6 at 2.0\ndataloader ignore exit 1\n"
        "dataloader block: scancel --signal=USR2 7 at 3.0\ndataloader block exit 0\n"
    )


def checks(work: Path, log: str) -> dict:
    (work / "first-job.log").write_text(log)
    out = subprocess.run(
        [sys.executable, str(GPU / "first_job_checks.py"), "--work", str(work), "--log", str(work / "first-job.log")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def test_the_checks_pass_on_a_run_that_did_everything(tmp_path):
    result = checks(tmp_path, a_whole_run(tmp_path))
    assert result["ok"], {k: v for k, v in result["checks"].items() if not v}
    assert result["slurm_snakemake"]["gpu_samples"]["lines_after_signal"] == 1
    assert result["slurm_snakemake"]["progress_mfu_pct_max"] == 61.0 and result["plain_torchrun"]["mfu_median"] == 0.6
    assert result["linuxproc_dataloader"]["plain"]["worker_killed"].startswith("DataLoader worker (pid 77) is killed")


@pytest.mark.parametrize(
    ("spoil", "failed"),
    [
        (lambda w, log: (w / "wf/.snakemake/multinode/logs/rule_train/_/4.attempt1.vm.gpu.csv").unlink() or log,
         "slurm: GPU samples, busy, and on after the signal"),
        (lambda w, log: log.replace("local run 1 exit 85", "local run 1 exit 1"),
         "local: the profile's NCCL block, exit 85 on the signal, the rerun resumes and finishes"),
        (lambda w, log: log.replace("CUDA_VISIBLE_DEVICES=0\n", "CUDA_VISIBLE_DEVICES=\n"),
         "slurm: CUDA_VISIBLE_DEVICES from the gres"),
        (lambda w, log: log.replace("dataloader block exit 0", "dataloader block exit 1"),
         "linuxproc: with USR2 blocked in the rank, its DataLoader workers survive SLURM's own signal"),
    ],
)  # fmt: skip
def test_a_missing_part_fails_its_check_alone(tmp_path, spoil, failed):
    result = checks(tmp_path, spoil(tmp_path, a_whole_run(tmp_path)))
    assert [k for k, v in result["checks"].items() if not v] == [failed] and not result["ok"]
