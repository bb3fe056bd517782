"""One experiment across requeues (issue 39): the run id every run of a job shares, what the job script exports for
the trackers, the helper a training logs through (training/tracking.py), where `multinode status` says the curves
are.

Here the tests that start processes (the process tier); the others: tests/unit/training/test_tracking.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import tensorboard_dir
from snakemake_executor_multinode.planning.plan import Planner, RuleJob, plan_job
from snakemake_executor_multinode.session import Settings
from snakemake_executor_multinode.training import tracking

OUTPUTS = ("results/model.pt",)


def planned(run: str, attempt: int = 1, outputs: tuple[str, ...] = OUTPUTS, workdir: str = "/w"):
    job = RuleJob(
        "train", {"nodes": 2}, "true", attempt=attempt, key=f"3.{attempt}", outputs=outputs,
        shellcmd="multinode torchrun train.py",
    )  # fmt: skip
    return plan_job(job, Planner(Settings(), Path(workdir), run))


def test_every_attempt_of_the_same_outputs_in_one_run_shares_the_run_id_and_a_new_run_gets_a_new_one():
    first, retry = planned("run1"), planned("run1", attempt=2)
    assert first.tracking_id == retry.tracking_id and len(first.tracking_id) == 16
    assert first.job_name != retry.job_name  # two SLURM jobs, one experiment
    assert planned("run2").tracking_id != first.tracking_id  # `snakemake -F`: a new run of the workflow
    assert planned("run1", outputs=("results/other.pt",)).tracking_id != first.tracking_id
    assert planned("run1", workdir="/elsewhere").tracking_id != first.tracking_id
    # a later run may still reattach to the job: the id, like the job name, is no part of what makes it the same job
    assert planned("run2").fingerprint == first.fingerprint
    assert f"export MULTINODE_RUN_ID={first.tracking_id} " in first.script


def exported(script: str, env: dict[str, str]) -> list[str]:
    """What the job script's tracker section leaves set: run in bash with `env` as the job's environment."""
    start = script.index("export MULTINODE_RUN_ID=")
    section = script[start : script.index("# ==== 3.", start)]
    show = 'printf \'%s|\' "${WANDB_RUN_ID-<unset>}" "${WANDB_RESUME-<unset>}" "$MULTINODE_TENSORBOARD_DIR"'
    proc = subprocess.run(["bash", "-c", section + show], env=env, capture_output=True, text=True, check=True)
    return proc.stdout.split("|")[:3]


def test_the_job_sets_the_wandb_run_and_resume_only_where_the_user_has_not_set_a_run_id():
    plan = planned("run1")
    folder = str(tensorboard_dir(plan.workdir / plan.log_dir, plan.tracking_id))
    assert exported(plan.script, {}) == [plan.tracking_id, "allow", folder]
    assert exported(plan.script, {"WANDB_RESUME": "must"}) == [plan.tracking_id, "must", folder]
    # a user's own id is passed through untouched, even a malformed or an empty one, and no resume mode is forced
    assert exported(plan.script, {"WANDB_RUN_ID": "my run; $(x)"}) == ["my run; $(x)", "<unset>", folder]
    assert exported(plan.script, {"WANDB_RUN_ID": ""}) == ["", "<unset>", folder]


def test_mlflow_finds_the_experiments_run_by_its_tag_and_creates_it_once(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")  # scripts/bootstrap.sh installs it (the trackers extra)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri(f"file://{tmp_path}/mlruns")
    ids = []
    for run_id in ("aaaa", "aaaa", "bbbb"):
        run = tracking.mlflow_run(mlflow, {"MULTINODE_RUN_ID": run_id})
        ids.append(run.info.run_id)
        mlflow.end_run()
    assert ids[0] == ids[1] != ids[2]
