"""One experiment across requeues, with the real trackers, offline (issue 39 parts 1-2).

A tiny 2-node training (gloo, one rank per node) logs, on rank 0, to Weights & Biases (offline mode), MLflow (a
file store) and TensorBoard through training/tracking.py, and resumes from a step file of its run id. An admin
requeues it twice (`scontrol requeue`, the test, each time once the run has logged its steps and closed its
trackers: nothing depends on how fast anything is); its third run finishes. Then the same workflow with `-F`.

Read back from the trackers' own files: the three runs of the job landed in ONE W&B run (three offline folders of
one run id), ONE MLflow run and one TensorBoard folder, their steps 0..8 once each and never going back; the `-F`
run is a new run in each. `multinode status` names the run id and the TensorBoard folder.
"""

from __future__ import annotations

import glob
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import StateFolders, tensorboard_dir
from snakemake_executor_multinode.contract.protocol import MLFLOW_RUN_TAG
from tests.helpers import Snakemake, figures, multinode, records, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.one_release]

STEPS_PER_RUN = 3
HELD_RUNS = 2  # the first two runs wait to be requeued; the third finishes

TRACKED = f"""
import os, sys, time
from pathlib import Path

import torch
import torch.distributed as dist

from snakemake_executor_multinode.training.tracking import Trackers

hold = int(sys.argv[1])  # runs (SLURM restarts) that wait, after their steps, for the test's requeue
dist.init_process_group("gloo")
rank = dist.get_rank()
restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
run_id = os.environ["MULTINODE_RUN_ID"]
steps = Path(f"steps-{{run_id}}.txt")  # the checkpoint: the next step
start = int(steps.read_text()) if steps.exists() else 0
trackers = Trackers.open(first_step=start, config={{"hold": hold}}) if rank == 0 else None
for step in range(start, start + {STEPS_PER_RUN}):
    world = torch.ones(1)
    dist.all_reduce(world)
    if rank == 0:
        trackers.log({{"loss": 1.0 / (step + 1), "world": world.item()}}, step)
        Path("steps.tmp").write_text(str(step + 1))
        os.replace("steps.tmp", steps)
if rank == 0:
    names = ",".join(trackers.names)
    trackers.close()  # everything written before the test requeues this run
    Path(f"logged-{{run_id}}-{{restart}}").write_text(names)
dist.barrier()
while restart < hold:
    time.sleep(0.2)
dist.destroy_process_group()
"""

SNAKEFILE = """
rule train:
    output: "done.txt"
    resources: nodes=2, gpus=1, cpus_per_task=1, mem_mb=2000
    shell:
        "WANDB_MODE=offline WANDB_DIR={wd} WANDB_SILENT=true MLFLOW_TRACKING_URI=file://{wd}/mlruns "
        "MLFLOW_ALLOW_FILE_STORE=true multinode torchrun tracked.py {{config[hold]}} && touch {{output}}"
"""


def wandb_records(path: Path) -> Iterator[object]:
    """The records of an offline run's .wandb file: W&B's header, then LevelDB's log format (32 KiB blocks of
    chunks: crc32, length, type) around protobuf `Record`s. `wandb sync` needs a server; this reads it offline."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_runs(wd: Path, run_id: str) -> list[tuple[str, list[int]]]:
    """Each offline folder of the run id, oldest first: the run id its records name, the steps it logged."""
    found = []
    for folder in sorted(glob.glob(str(wd / "wandb" / f"offline-run-*-{run_id}"))):
        ids, steps = set(), []
        for record in wandb_records(next(Path(folder).glob("*.wandb"))):
            kind = record.WhichOneof("record_type")  # type: ignore[attr-defined]
            if kind == "run":
                ids.add(record.run.run_id)  # type: ignore[attr-defined]
            elif kind == "history":
                items = {i.key or ".".join(i.nested_key): i.value_json for i in record.history.item}  # type: ignore[attr-defined]
                steps.append(int(items["_step"]))
        assert len(ids) == 1, f"{folder}: run ids {ids}"
        found.append((ids.pop(), steps))
    return found


def mlflow_runs(wd: Path) -> dict[str, tuple[dict[str, str], list[int]]]:
    """Every MLflow run of the file store, by its multinode.run_id tag: its tags and its loss steps, in order."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file://{wd}/mlruns")
    runs = client.search_runs(experiment_ids=[e.experiment_id for e in client.search_experiments()])
    found: dict[str, tuple[dict[str, str], list[int]]] = {}
    for run in runs:
        tag = run.data.tags[MLFLOW_RUN_TAG]
        assert tag not in found, f"two MLflow runs tagged {tag}"
        history = sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: (m.timestamp, m.step))
        found[tag] = (dict(run.data.tags), [m.step for m in history])
    return found


def tensorboard_steps(folder: Path) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return [event.step for event in acc.Scalars("loss")]


def test_a_twice_requeued_two_node_training_is_one_run_in_every_tracker_and_a_forced_rerun_a_new_one(
    slurm_cluster, tmp_path, monkeypatch
):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # this process reads the file store too
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    wd = tmp_path / "tracked"
    wd.mkdir()
    (wd / "tracked.py").write_text(TRACKED)
    (wd / "Snakefile").write_text(SNAKEFILE.format(wd=wd))
    sm = Snakemake(wd, "--config", f"hold={HELD_RUNS}")
    try:
        job, _ = sm.submitted("train", timeout=180)
        first = records(wd)[0]["tracking_id"]
        for restart in range(HELD_RUNS):
            logged = wd / f"logged-{first}-{restart}"
            wait_for(logged.exists, f"run {restart} of job {job} logging its steps", 600, proc=sm.proc)
            assert logged.read_text() == "TensorBoard,W&B,MLflow"
            slurm_cluster.run("scontrol", "requeue", job)  # the fault: an admin's requeue
        assert sm.wait(timeout=600) == 0, sm.text
    finally:
        sm.stop()
    forced = Snakemake(wd, "-F", "--config", "hold=0")
    try:
        assert forced.wait(timeout=600) == 0, forced.text
    finally:
        forced.stop()
    subs = records(wd)
    assert [s["jobid"] for s in subs if s["tracking_id"] == first] == [job]  # one job, three runs
    second = next(s["tracking_id"] for s in subs if s["tracking_id"] != first)
    assert len(first) == len(second) == 16

    all_steps = list(range(STEPS_PER_RUN * (HELD_RUNS + 1)))
    # W&B: a folder per run of the job, all of one run id, the steps going on where the last run stopped
    requeued = wandb_runs(wd, first)
    assert [run_id for run_id, _ in requeued] == [first] * (HELD_RUNS + 1)
    assert [step for _, steps in requeued for step in steps] == all_steps
    assert wandb_runs(wd, second) == [(second, list(range(STEPS_PER_RUN)))]
    # MLflow: one run per experiment, found again by its tag; the last run's tags
    ml = mlflow_runs(wd)
    assert set(ml) == {first, second}
    tags, steps = ml[first]
    assert steps == all_steps
    assert tags["slurm.job_id"] == job and tags["slurm.restart_count"] == str(HELD_RUNS)
    assert ml[second][1] == list(range(STEPS_PER_RUN))
    # TensorBoard: one folder per experiment, the same for every run of the job
    logs = StateFolders(wd).logs / "rule_train" / "_"
    assert sorted(p.name for p in (logs / "tensorboard").iterdir()) == sorted([first, second])
    assert tensorboard_steps(Path(tensorboard_dir(logs, first))) == all_steps
    assert tensorboard_steps(Path(tensorboard_dir(logs, second))) == list(range(STEPS_PER_RUN))
    # `multinode status` says where the curves of the latest run are
    shown = multinode(wd, "status").stdout
    assert f"run {second}, TensorBoard {Path(tensorboard_dir(logs, second)).relative_to(wd)}" in shown, shown
    figures("trackers", requeues=HELD_RUNS, wandb_folders=len(requeued), mlflow_runs=len(ml))
