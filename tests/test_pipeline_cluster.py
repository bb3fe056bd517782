"""workflows/: preprocess -> train (ColossalAI, one torchrun per node) -> evaluate on the local SLURM cluster."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def pipeline_copy(tmp_path: Path, **train) -> Path:
    """The example workflow in a fresh folder, with train values overridden."""
    wd = tmp_path / "pipeline"
    shutil.copytree(REPO / "workflows", wd / "workflows", ignore=shutil.ignore_patterns("results", ".snakemake"))
    cfg_path = wd / "workflows" / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["train"].update(train)
    cfg_path.write_text(yaml.safe_dump(cfg))
    return wd


def snakemake(wd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        "workflows/Snakefile",
        "--workflow-profile",
        "workflows/profiles/local",
        *args,
    ]
    return subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=timeout)


def test_example_pipeline_trains_on_two_nodes_and_evaluates(slurm_cluster, tmp_path):
    wd = pipeline_copy(tmp_path)
    proc = snakemake(wd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    results = wd / "results"
    metrics = [json.loads(line) for line in (results / "model" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 40 and metrics[-1]["loss"] < metrics[0]["loss"]
    evaluation = json.loads((results / "eval" / "metrics.json").read_text())
    assert evaluation["val_loss"] > 0 and evaluation["val_ppl"] > 1 and evaluation["model_step"] == 40
    assert (results / "eval" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    train_log = next((wd / ".snakemake/multinode/logs/rule_train").rglob("*.log")).read_text()
    assert "launching on node1, node_rank=0" in train_log and "launching on node2, node_rank=1" in train_log

    # run again: nothing to do
    again = snakemake(wd)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    # change a training value: train and evaluate rerun, preprocessing does not
    cfg_path = wd / "workflows" / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["train"]["lr"] = 0.002
    cfg_path.write_text(yaml.safe_dump(cfg))
    dry = snakemake(wd, "-n")
    planned = dry.stdout + dry.stderr
    assert "rule train:" in planned and "rule evaluate:" in planned
    assert "rule preprocess:" not in planned and "rule merge:" not in planned


def test_time_limit_signal_checkpoints_requeues_and_the_rerun_resumes(slurm_cluster, tmp_path):
    # A 2-minute limit with USR2 60 s before it: slurmctld checks every 30 s and signals once the remaining time
    # falls within the warning plus one check, so the signal lands 30-60 s into each run (~15 s of it start-up).
    # 1400 steps (~35 ms each with 2 ranks on 2 cores) outlast one run: it checkpoints, is requeued, resumes.
    wd = pipeline_copy(
        tmp_path, steps=1400, ckpt_every=0, log_every=100, n_layer=2, d_model=64, seq_len=64, micro_batch=8
    )
    cfg_path = wd / "workflows" / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["train_resources"].update(nodes=2, gpus=1, cpus_per_task=1, runtime=2)
    cfg_path.write_text(yaml.safe_dump(cfg))
    proc = snakemake(wd, "--multinode-signal", "USR2@60", "--retries", "2", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    logs = sorted((wd / ".snakemake/multinode/logs/rule_train").rglob("*.log"))
    names = [p.name for p in logs]
    assert any(".restart1." in n or ".attempt2." in n for n in names), names  # one log per run
    text = "\n".join(p.read_text() for p in logs)
    assert "checkpointed after SIGUSR2" in text
    assert "resum" in text.lower()
    metrics = [json.loads(line) for line in (wd / "results/model/metrics.jsonl").read_text().splitlines()]
    steps = [m["step"] for m in metrics]
    assert steps == sorted(set(steps)) and steps[-1] == 1400  # no step lost or repeated across runs
