"""The goodput ledger of a requeued and resumed 2-node training, on the real local SLURM cluster (issue 36, part 3).

workflows/scripts/train.py (ColossalAI torch_ddp, CPU + gloo, a tiny model, one rank per node) checkpoints every
CKPT_EVERY steps. A gate the test holds (a wrapper that waits for a file before the step after GATE_AT) stops the
first run right after it has logged GATE_AT steps, so the work thrown away is known whatever the machine's speed:
the steps after the last checkpoint. The wrapper also paces steps, saves and the resume's load with fixed sleeps, so
that every category lasts long enough to be told apart from the report's rounding. The fault is an admin's
`scontrol requeue`; the second run resumes from the checkpoint and finishes. Then `multinode report`'s CSV is
checked, category by category, against what the test computes itself from the metrics file (its walls and events)
and from sacct (every run's Start, End, Elapsed and nodes): never from ledger.py.
"""

from __future__ import annotations

import csv
import io
import math
import time
from pathlib import Path
from typing import Any

import pytest

from snakemake_executor_multinode.contract.jobfiles import StateFolders
from snakemake_executor_multinode.watching.ledger import CATEGORIES
from tests.helpers import (
    Snakemake,
    complete_lines,
    figures,
    multinode,
    records,
    sacct_jobs,
    sacct_runs,
    slurm,
    train_rule,
    training_folder,
    wait_for,
)
from tests.training.helpers import TINY

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NODES = 2
CKPT_EVERY = 5
GATE_AT = CKPT_EVERY + 3  # the first run stops (held by the gate) once it has logged this step
STEPS = 20
CONFIG = {**TINY, "steps": STEPS, "ckpt_every": CKPT_EVERY}

# train.py unchanged but paced (the same on every rank), so that each category lasts long enough to be measured in
# the report's tenths of node-seconds whatever the machine's speed: every step takes STEP_S more, every checkpoint
# save SAVE_S more, the resume's load LOAD_S more. Its step GATE_AT + 1 waits for the file `gate`: run 1 never passes
# it (the requeue ends it there), run 2 once the test has seen it resume.
# The run's end waits END_S after the final model: sacct's End is cut to the whole second and ledger.py clamps a
# record after End into the run, so a final checkpoint that ended in the run's last second would be cut short.
STEP_S, SAVE_S, LOAD_S, END_S = 0.25, 1.0, 1.5, 1.1
GATED = """
import os, sys, time
sys.path.insert(0, {scripts!r})
import checkpoint
import train

_step, _save, _load = train.train_step, checkpoint.Checkpointer.save, checkpoint.Checkpointer.load
_save_final = train.save_final


def step(run, at, *rest):
    if at == {gate_at}:
        while not os.path.exists({gate!r}):
            time.sleep(0.05)
    time.sleep({step_s})
    return _step(run, at, *rest)


def save(self, state):
    time.sleep({save_s})
    return _save(self, state)


def load(self, path):
    time.sleep({load_s})
    return _load(self, path)


def save_final(run, state):
    _save_final(run, state)
    time.sleep({end_s})


train.train_step, checkpoint.Checkpointer.save, checkpoint.Checkpointer.load = step, save, load
train.save_final = save_final
sys.exit(train.main())
"""


def training_workflow(tmp_path: Path) -> Path:
    wd = tmp_path / "goodput"
    scripts = training_folder(wd)
    (wd / "gated_train.py").write_text(
        GATED.format(
            scripts=str(scripts),
            gate_at=GATE_AT,
            gate=str(wd / "gate"),
            step_s=STEP_S,
            save_s=SAVE_S,
            load_s=LOAD_S,
            end_s=END_S,
        )
    )
    (wd / "Snakefile").write_text(train_rule(CONFIG, script="gated_train.py", nodes=NODES))
    return wd


metrics = complete_lines  # the metrics file, as far as the training has written it


def step_lines(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in recs if "event" not in r]


def event(recs: list[dict[str, Any]], name: str, step: int | None = None) -> list[dict[str, Any]]:
    return [r for r in recs if r.get("event") == name and (step is None or r["step"] == step)]


def within(wall: float, run: dict[str, Any], skew: float = 2.0) -> bool:
    return run["start"] - skew <= wall <= run["end"] + skew


def test_requeued_two_node_training_ledger_adds_up_to_sacct_and_to_the_events_the_test_caused(slurm_cluster, tmp_path):
    wd = training_workflow(tmp_path)
    metrics_file = wd / "ckpt" / "metrics.jsonl"
    sm = Snakemake(wd)
    try:
        job, _ = sm.submitted("train", timeout=180)

        def held_at_the_gate() -> bool:  # and the checkpoint complete: an asynchronous save is written meanwhile
            recs = metrics(metrics_file)
            return (
                bool(event(recs, "checkpoint_end", CKPT_EVERY))
                and any(r["step"] == GATE_AT for r in step_lines(recs))
                and (wd / "ckpt" / f"step_{CKPT_EVERY:08d}").is_dir()
            )

        wait_for(held_at_the_gate, f"checkpoint {CKPT_EVERY} and step line {GATE_AT} of run 1", 600, sm.proc)
        before = metrics(metrics_file)
        assert max(r["step"] for r in step_lines(before)) == GATE_AT  # held: nothing beyond the gate
        # sacct's End is the requeue's time cut to the whole second (24.11: 04:05:55 for a requeue at 04:05:55.9)
        # and ledger.py clamps a record up to SKEW_S after End into the run, which shortens the lost work by the
        # part of it in that last second. The requeue comes in the second after the last line: End is after it.
        last_line = max(r["wall"] for r in step_lines(before))
        wait_for(lambda: time.time() >= math.floor(last_line) + 1.05, "the next whole second", 10)
        requeued_at = time.time()
        slurm(slurm_cluster, "scontrol", "requeue", job)  # the fault: an admin's requeue
        wait_for(lambda: event(metrics(metrics_file), "resume"), "run 2 resuming from its checkpoint", 600, sm.proc)
        (wd / "gate").touch()  # run 2 may pass where run 1 was held
        rc = sm.wait(timeout=600)
    finally:
        (wd / "gate").touch()
        sm.stop()
    assert rc == 0, sm.text
    (rec,) = records(wd)
    assert rec["jobid"] == job  # one submission: the requeue was no failure and nothing was resubmitted
    states = sacct_jobs(slurm_cluster, {rec["job_name"]}, {job})
    assert states[job][-1] == "COMPLETED", states

    # --- what the test knows on its own: the metrics file and sacct ---------------------------------------------
    recs = metrics(metrics_file)
    runs = wait_for(lambda: r if len(r := sacct_runs(slurm_cluster, job)) == 2 else None, "sacct's 2 runs", 120)
    first, second = runs
    assert [r["state"] for r in runs] == ["REQUEUED", "COMPLETED"] and all(r["nodes"] == NODES for r in runs), runs
    assert first["end"] <= second["start"] and first["end"] >= math.floor(requeued_at), (runs, requeued_at)
    allocated = sum(r["elapsed"] * r["nodes"] for r in runs)
    # the setting the expectations below hold in: every record inside its run's accounted [Start, End]
    assert all(any(r["start"] <= x["wall"] <= r["end"] for r in runs) for x in recs), (runs, recs)

    superseded = event(recs, "superseded")
    lost_steps = [r["step"] for r in superseded]
    assert lost_steps == list(range(CKPT_EVERY + 1, GATE_AT + 1)), lost_steps  # the steps after the checkpoint
    (ckpt_end,) = [r for r in event(recs, "checkpoint_end", CKPT_EVERY) if within(r["wall"], first)]
    assert all(within(r["wall"], first) for r in superseded)
    lost = (superseded[-1]["wall"] - ckpt_end["wall"]) * NODES

    (resume,) = event(recs, "resume")
    assert resume["step"] == CKPT_EVERY and within(resume["wall"], second), (resume, runs)
    restore = resume["restore_s"] * NODES

    begins, ends = event(recs, "checkpoint_begin"), event(recs, "checkpoint_end")
    assert [b["step"] for b in begins] == [e["step"] for e in ends] == [5, 10, 15, 20], (begins, ends)
    checkpoint = sum(
        (e["wall"] - b["wall"]) * NODES
        for b, e in zip(begins, ends, strict=True)
        if any(within(b["wall"], r) and within(e["wall"], r) for r in runs)
    )
    # productive: run 1's steps up to the checkpoint (its first line by its own step_ms), run 2's from the resume
    # to its last line, less the checkpoints in between
    kept = step_lines(recs)
    assert [r["step"] for r in kept] == list(range(1, STEPS + 1))
    run1 = [r for r in kept if within(r["wall"], first)]
    run2 = [r for r in kept if within(r["wall"], second)]
    assert [r["step"] for r in run1] == list(range(1, CKPT_EVERY + 1)), run1
    assert [r["step"] for r in run2] == list(range(CKPT_EVERY + 1, STEPS + 1)), run2
    # each run's training ends where its last checkpoint begins (run 1: step CKPT_EVERY's; run 2: the final one)
    begin5, last = (next(b for b in begins if b["step"] == s) for s in (CKPT_EVERY, STEPS))
    between = [(b, e) for b, e in zip(begins, ends, strict=True) if resume["wall"] <= b["wall"] < last["wall"]]
    productive = NODES * (
        run1[0]["step_ms"] / 1000
        + (begin5["wall"] - run1[0]["wall"])
        + (last["wall"] - resume["wall"])
        - sum(e["wall"] - b["wall"] for b, e in between)
    )
    queue_wait = sum(r["start"] - r["submit"] for r in runs)
    held = (math.floor(requeued_at) - superseded[-1]["wall"]) * NODES  # run 1 idle at the gate: its tail, not lost

    # --- what the report says ----------------------------------------------------------------------------------
    run_id = rec["run_id"]
    text = multinode(wd, "report", "--run", run_id).stdout
    assert "## Where the allocation went" in text, text
    (row,) = [r for r in text.split("## Where the allocation went")[1].splitlines() if f"| {job} |" in r]
    assert "unknown" not in row, row  # the job wrote timed metrics: its productive time is known
    rows = list(csv.DictReader(io.StringIO((StateFolders(wd).reports / f"{run_id}.csv").read_text())))
    (got,) = [r for r in rows if r["scope"] == "job" and r["jobid"] == job]
    node_s = {c: float(got[f"{c}_node_s"]) for c in CATEGORIES}

    assert got["runs"] == "2" and got["nodes"] == str(NODES), got
    assert float(got["alloc_node_s"]) == pytest.approx(allocated, rel=0.02), (got, runs)
    assert sum(node_s.values()) == pytest.approx(allocated, rel=0.02), (node_s, runs)
    # the file's own figures include the pacing (else the test would compare noise with tenths of node-seconds)
    assert lost >= (GATE_AT - CKPT_EVERY) * STEP_S * NODES and restore >= LOAD_S * NODES, (lost, restore)
    assert checkpoint >= 4 * SAVE_S * NODES and productive >= STEPS * STEP_S * NODES, (checkpoint, productive)
    assert lost > 0 and node_s["lost"] == pytest.approx(lost, abs=0.2), (node_s, lost)
    assert restore > 0 and node_s["restore"] == pytest.approx(restore, abs=0.2), (node_s, restore)
    assert checkpoint > 0 and node_s["checkpoint"] == pytest.approx(checkpoint, abs=0.2), (node_s, checkpoint)
    assert productive > 0 and node_s["productive"] == pytest.approx(productive, abs=0.3), (node_s, productive)
    assert node_s["stalled"] == 0 and node_s["unknown"] == 0, node_s
    assert held > 0 and node_s["teardown"] >= held - 0.1, (node_s, held)  # End >= the requeue's whole second
    assert node_s["startup"] > 0, node_s
    assert got["queue_wait_s"] != "" and float(got["queue_wait_s"]) == pytest.approx(queue_wait, abs=1.0), got
    assert float(got["goodput"]) == pytest.approx(node_s["productive"] / sum(node_s.values()), abs=0.002), got
    figures(
        "goodput of a requeued 2-node training",
        job=job,
        runs=len(runs),
        sacct_node_s=allocated,
        ledger_node_s=round(sum(node_s.values()), 1),
        lost_steps=len(lost_steps),
        lost_node_s=f"{node_s['lost']:.2f}/{lost:.2f}",
        restore_node_s=f"{node_s['restore']:.2f}/{restore:.2f}",
        checkpoint_node_s=f"{node_s['checkpoint']:.2f}/{checkpoint:.2f}",
        productive_node_s=f"{node_s['productive']:.2f}/{productive:.2f}",
        startup_node_s=node_s["startup"],
        teardown_node_s=node_s["teardown"],
        queue_wait_s=f"{got['queue_wait_s']}/{queue_wait:.0f}",
        goodput=got["goodput"],
    )
