"""Killed mid-save, on the real local SLURM cluster (issue 38, part 2; issue 48, part 3): a rank SIGKILLed, or its
whole node killed, while a checkpoint is being written in the background (ckpt_async, the default: the training goes
on while the save's second half writes, fsyncs and publishes it). The retry resumes from the last complete
checkpoint, the temp folder of the unfinished save is removed (named in the log), the steps lost are the steps since
that checkpoint, and the goodput ledger counts exactly their time as lost; the final model equals a run without the
fault, on as many ranks.

A 2-node `--executor multinode` rule (`--retries 1`) trains workflows/scripts/train.py (torch_ddp, CPU + gloo, a tiny
model, 2 ranks per node: 4 in all, as an inexact resume cannot show on 2, docs/reproducibility.md) with a checkpoint
every EVERY steps. "While a checkpoint is being written" is an event, not a time: the test's wrapper of
train.py (its own file, the training unchanged) holds the last rank's (on the second node, so the node killed is not
the one running the job script) background writer of step KILL_AT before its first file
(background_save.Capture.write): the save's stall has ended (checkpoint_end), rank 0's files are in the temp folder,
trainer.json is not, and the other ranks' writers wait at the save's agreement before the rename. The training goes
on to the next save (the last, STEPS), which waits for KILL_AT's write. The wrapper writes that rank's host and pid to
a file; the test sees it, with the `checkpoint_begin` event of STEPS and the temp folder, and kills by pid: the worker
(a process of that node's network namespace), or the node (its slurmd and every process of its namespace,
tests/helpers.py's kill_node). Steps are paced (STEP_S) so that the lost time is measured in the report's tenths of
node-seconds whatever the machine's speed.
"""

from __future__ import annotations

import csv
import io
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from snakemake_executor_multinode.contract.jobfiles import StateFolders
from tests.helpers import (
    Snakemake,
    complete_lines,
    figures,
    kill_node,
    multinode,
    rank_pids,
    records,
    sacct_jobs,
    train_rule,
    training_folder,
    wait_for,
)
from tests.training.helpers import TINY, assert_same_final_model, train

# The save, its cleanup, the resume and the ledger are the training's and the plugin's, the same on every SLURM release;
# the failure and the retry's --exclude that they pass through are tested on each (test_retry_cluster.py,
# test_node_death_cluster.py).
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.one_release]

NODES, RANKS_PER_NODE = 2, 2
WORLD = NODES * RANKS_PER_NODE
STOPPED = WORLD - 1  # the rank stopped inside the save: the second node's last
# The retry resumes from KILL_AT - EVERY: its first step is the one a resume once summed in another order (the model
# would then differ from the fault-free run's), and the steps after it carry that into the final model.
STEPS, EVERY, KILL_AT = 6, 2, 4  # KILL_AT + EVERY == STEPS: the next save, the last, waits for KILL_AT's write
CONFIG = {**TINY, "plugin": "torch_ddp", "steps": STEPS, "ckpt_every": EVERY, "keep_ckpts": 3}
STEP_S = 0.25
TMP = f".tmp_step_{KILL_AT:08d}"

WRAPPER = """
import os, socket, sys, time
sys.path.insert(0, {scripts!r})
import background_save
import train

_step, _write = train.train_step, background_save.Capture.write


def step(run, at, *rest):
    time.sleep({step_s})
    return _step(run, at, *rest)


def write(self, writing):
    if self.folder.name == {tmp!r} and os.environ["RANK"] == "{stopped}" and not os.path.exists({paused!r}):
        with open({paused!r} + ".tmp", "w") as fh:
            fh.write(f"{{socket.gethostname()}} {{os.getpid()}}\\n")
        os.replace({paused!r} + ".tmp", {paused!r})
        while True:  # until the test's SIGKILL
            time.sleep(1)
    return _write(self, writing)


train.train_step, background_save.Capture.write = step, write
sys.exit(train.main())
"""


def workflow(tmp_path: Path) -> Path:
    wd = tmp_path / "killed-save"
    scripts = training_folder(wd)
    wrapper = WRAPPER.format(scripts=str(scripts), step_s=STEP_S, tmp=TMP, stopped=STOPPED, paused=str(wd / "paused"))
    (wd / "paused_train.py").write_text(wrapper)
    # max_restarts 0: the retry's path (a new job without the node); by default the rank is restarted in the job
    (wd / "Snakefile").write_text(
        train_rule(
            CONFIG, script="paused_train.py", nodes=NODES, gpus=RANKS_PER_NODE, resources="runtime=30, max_restarts=0"
        )
    )
    return wd


metrics = complete_lines  # the metrics file, as far as the training has written it


def event(recs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [r for r in recs if r.get("event") == name]


# "node" (the whole node killed mid-save) takes the same path through the retry as "rank" and costs minutes of CI:
# it runs with MULTINODE_TEST_ALL=1 (it passed on 22.05 and 24.11 when it was written)
@pytest.mark.parametrize(
    "fault",
    [
        "rank",
        pytest.param(
            "node",
            marks=pytest.mark.skipif(
                "MULTINODE_TEST_ALL" not in os.environ,
                reason="the same path as the rank case: MULTINODE_TEST_ALL=1 runs it",
            ),
        ),
    ],
)
def test_a_save_killed_midway_resumes_from_the_last_complete_checkpoint_and_loses_only_the_steps_since(
    fault, slurm_cluster, tmp_path, restore_nodes
):
    wd = workflow(tmp_path)
    ckpt, metrics_file, paused = wd / "ckpt", wd / "ckpt" / "metrics.jsonl", wd / "paused"
    sm = Snakemake(wd, "--retries", "1")
    try:
        first, _ = sm.submitted("train", timeout=180)

        def writing() -> bool:  # the event: rank STOPPED's writer of KILL_AT held, the next save waiting for it
            return paused.exists() and any(r["step"] == STEPS for r in event(metrics(metrics_file), "checkpoint_begin"))

        wait_for(writing, f"the save of step {STEPS} waiting for step {KILL_AT}'s background write", 600, sm.proc)
        host, pid = paused.read_text().split()
        assert (ckpt / TMP / "model").is_dir() and not (ckpt / TMP / "trainer.json").exists(), sorted(ckpt.iterdir())
        assert not (ckpt / f"step_{KILL_AT:08d}").exists()
        ran_on = [r["step"] for r in metrics(metrics_file) if "event" not in r]
        assert ran_on == list(range(1, STEPS + 1))  # the training went on while step KILL_AT was written
        # that node's workers, the stopped rank's the one named, as its node's processes tell
        workers = rank_pids(slurm_cluster, host)
        assert sorted(workers) == list(range(WORLD - RANKS_PER_NODE, WORLD)) and workers[STOPPED] == int(pid), workers
        if fault == "rank":
            os.kill(int(pid), signal.SIGKILL)  # the fault
            killed = time.monotonic()
        else:
            restore_nodes.append(host)
            killed = kill_node(slurm_cluster, host)  # the fault
        noticed, error = sm.wait_line(f"SLURM job {first} failed", timeout=300)
        rc = sm.wait(900)
    finally:
        sm.stop()
    assert rc == 0, sm.text
    assert f"failing node {host}" in error, error

    # --- the retry: a second job without that node, from the last complete checkpoint, the temp folder removed ------
    recs = sorted(records(wd), key=lambda r: r["attempt"])
    assert [r["attempt"] for r in recs] == [1, 2] and recs[0]["jobid"] == first, recs
    second = recs[1]["jobid"]
    states = sacct_jobs(slurm_cluster, {r["job_name"] for r in recs}, {first, second})
    assert states[first][-1] != "COMPLETED" and states[second] == ["COMPLETED"], states
    assert f"#SBATCH --exclude={host}" in Path(recs[1]["script"]).read_text().splitlines()
    log = Path(recs[1]["log"]).read_text()
    removed = [x for x in log.splitlines() if "checkpoint: removing" in x]
    assert len(removed) == 1 and removed[0].endswith(
        f"checkpoint: removing ckpt/{TMP}, the temp folder of a save that did not finish"
    ), log[-4000:]
    assert f"resumed from ckpt/step_{KILL_AT - EVERY:08d} at step {KILL_AT - EVERY}" in log, log[-4000:]
    assert f"plugin torch_ddp world {WORLD} dp {WORLD}" in log, log[-4000:]  # the world that wrote the checkpoint
    assert f"done: step {STEPS}" in log
    assert not [p.name for p in ckpt.iterdir() if p.name.startswith(".tmp")], sorted(ckpt.iterdir())
    assert [p.name for p in sorted(ckpt.glob("step_*"))] == [f"step_{s:08d}" for s in range(EVERY, STEPS + 1, EVERY)]

    # --- the steps lost: those since the last complete checkpoint, as the metrics file records them ------------------
    recs_m = metrics(metrics_file)
    lost_steps = [r["step"] for r in event(recs_m, "superseded")]
    assert lost_steps == list(range(KILL_AT - EVERY + 1, STEPS + 1)), lost_steps  # all since the complete one
    assert [r["step"] for r in event(recs_m, "resume")] == [KILL_AT - EVERY]
    assert [r["step"] for r in recs_m if "event" not in r] == list(range(1, STEPS + 1))
    # the first job: its saves up to KILL_AT (whose stall ended: the write went on beside the training) and STEPS
    # (waiting for KILL_AT's write); the retry: KILL_AT and STEPS again
    first_job = list(range(EVERY, STEPS + 1, EVERY))
    assert [r["step"] for r in event(recs_m, "checkpoint_begin")] == [*first_job, KILL_AT, STEPS]
    assert [r["step"] for r in event(recs_m, "checkpoint_end")] == [*first_job[:-1], KILL_AT, STEPS]
    # each said written inside the next save's stall (the last inside its own); KILL_AT's: the retry's
    assert [r["step"] for r in event(recs_m, "checkpoint_written")] == list(range(EVERY, STEPS + 1, EVERY))
    resumed_end = next(r for r in event(recs_m, "checkpoint_end") if r["step"] == KILL_AT - EVERY)
    killed_begin, waiting_begin = (
        next(r for r in event(recs_m, "checkpoint_begin") if r["step"] == s) for s in (KILL_AT, STEPS)
    )
    killed_end = next(r for r in event(recs_m, "checkpoint_end") if r["step"] == KILL_AT)  # the first job's
    # the steps after the complete checkpoint, node-seconds: before the save of KILL_AT and after its stall
    lost = ((killed_begin["wall"] - resumed_end["wall"]) + (waiting_begin["wall"] - killed_end["wall"])) * NODES
    assert lost >= (STEPS - KILL_AT + EVERY) * STEP_S * NODES

    # --- the goodput ledger (`multinode report`'s CSV) counts exactly that time as lost -------------------------------
    (run_id,) = {r["run_id"] for r in recs}
    multinode(wd, "report", "--run", run_id)
    rows = list(csv.DictReader(io.StringIO((StateFolders(wd).reports / f"{run_id}.csv").read_text())))
    by_job = {r["jobid"]: r for r in rows if r["scope"] == "job"}
    assert float(by_job[first]["lost_node_s"]) == pytest.approx(lost, abs=0.2), (by_job[first], lost)
    assert float(by_job[second]["lost_node_s"]) == 0, by_job[second]

    # --- the final model equals a run without the fault on as many ranks (torchrun on this machine: deterministic on
    # CPU; gloo sums a gradient in an order set by the rank, not the host) ---------------------------------------------
    if fault == "rank":  # the same resume after either fault: compared once
        straight = tmp_path / "straight"
        train(straight, wd / "data", CONFIG, nproc=WORLD)
        assert_same_final_model(straight, wd)
    figures(
        f"save killed midway ({fault})",
        ranks=f"{NODES}x{RANKS_PER_NODE}",
        node=host,
        kill_to_error_s=round(noticed - killed, 1),
        lost_steps=len(lost_steps),
        lost_node_s=f"{by_job[first]['lost_node_s']}/{lost:.2f}",
        resumed_from=KILL_AT - EVERY,
    )
