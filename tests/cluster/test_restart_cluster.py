"""A hung or crashed rank is restarted in the same SLURM job, with the defaults (issue 48, parts 1 and 2).

A 2-node gloo training (tests/helpers.ckpt_loop) writes a metrics step line every ~0.1 s, so the adaptive stall
timeout is its floor (30 s). The fault is injected by pid (tests/helpers.rank_pids): rank 1's worker on the second
node is stopped (SIGSTOP: a hang) or killed (SIGKILL: a crash). Nothing is set but `--retries 0`: the launcher notices
the hang by the training's pace, or srun reports the crash, and starts a new step on the same nodes, which resumes
from the step saved before the fault. The verdicts are events (one SLURM job, one run, relaunch 1 on the same hosts,
the resumed step); the times are figures, printed (the targets, 90 s and 45 s, are issue 48's).

A training that crashes at the same step on every launch is stopped by the crash-loop rule after three launches.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import JobFiles
from tests.helpers import (
    Snakemake,
    ckpt_loop,
    figures,
    rank_pids,
    records,
    sacct_jobs,
    saved_step,
    torchrun_workflow,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

RESOURCES = "nodes=2, gpus=1"


def ready(wd: Path, job: str, relaunch: int) -> list[Path] | None:
    """Both ranks' ready files of a launch, rank order (ready-<job>-<relaunch>-<rank>-<host>); None until both."""
    found = sorted(wd.glob(f"ready-{job}-{relaunch}-*"))
    return found if len(found) == 2 else None


def host_of(path: Path) -> str:
    return path.name.split("-", 4)[4]


def starts(wd: Path) -> list[tuple[str, int, str]]:
    """Every rank's start: (relaunch, resumed step, host), rank 0's then rank 1's."""
    out = []
    for rank in (0, 1):
        for line in (wd / f"launch-{rank}.txt").read_text().splitlines():
            relaunch, step, host = line.split()
            out.append((relaunch, int(step), host))
    return out


def run_with_fault(slurm_cluster, tmp_path: Path, sig: signal.Signals, noticed: str) -> dict:
    """Runs the training, sends `sig` to rank 1's worker (on the second node) after five saved steps, lets the
    relaunched training finish; what the test checks, and when (from the fault) the job log first said `noticed`, the
    restart, the new step's start (the launcher's second "one srun step" line: the step before it gone), and both
    relaunched ranks were ready."""
    wd = torchrun_workflow(tmp_path, "ckpt.py", ckpt_loop(metrics=True), RESOURCES)
    sm = Snakemake(wd, "--retries", "0")
    hit: list[int] = []
    try:
        job, joblog = sm.submitted("train")
        wait_for(lambda: joblog.exists() and "one srun step" in joblog.read_text(), "the first step's start", 300,
                 interval=0.05)  # fmt: skip
        launched = time.monotonic()
        first = wait_for(lambda: ready(wd, job, 0), "both ranks ready", 300, interval=0.05)
        started = time.monotonic()
        head, other = host_of(first[0]), host_of(first[1])
        wait_for(lambda: saved_step(wd) >= 5, "five steps saved", 120)
        workers = rank_pids(slurm_cluster, other)
        assert list(workers) == [1], workers
        before = saved_step(wd)  # saved before the fault: the relaunch resumes from it or later
        os.kill(workers[1], sig)  # the fault
        hit.append(workers[1])
        faulted = time.monotonic()
        wait_for(lambda: noticed in joblog.read_text(), f"the log's {noticed!r}", 300, interval=0.05)
        seen = time.monotonic()
        wait_for(lambda: "restarting the training" in joblog.read_text(), "the launcher's restart line", 300,
                 interval=0.05)  # fmt: skip
        restarted = time.monotonic()
        wait_for(lambda: joblog.read_text().count("one srun step") == 2, "the new step's start", 300, interval=0.05)
        stepped = time.monotonic()
        second = wait_for(lambda: ready(wd, job, 1), "relaunched ranks", 300, interval=0.05)
        relaunched = time.monotonic()
        (wd / "release-1").touch()
        rc = sm.wait(600)
    finally:
        for k in (0, 1):
            (wd / f"release-{k}").touch()
        for pid in hit:  # a stopped worker left behind would hold its node
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        sm.stop()
    assert rc == 0, sm.text
    return {
        "wd": wd, "sm": sm, "job": job, "log": joblog.read_text(), "files": JobFiles.from_log(joblog),
        "head": head, "other": other, "second": [host_of(p) for p in second], "before": before,
        "figures": {
            "fault_to_noticed_s": round(seen - faulted, 1), "fault_to_restart_s": round(restarted - faulted, 1),
            "fault_to_new_step_s": round(stepped - faulted, 1),
            "fault_to_relaunched_ranks_s": round(relaunched - faulted, 1),
            # the same start-up side by side: the first step's start to its ranks ready, and the new step's
            "first_step_to_ranks_s": round(started - launched, 1),
            "new_step_to_ranks_s": round(relaunched - stepped, 1),
            "load_average_1m": round(os.getloadavg()[0], 1),
        },
    }  # fmt: skip


def assert_restarted_in_the_same_job(slurm_cluster, got: dict) -> None:
    wd, job, log = got["wd"], got["job"], got["log"]
    # the same nodes, in the same order; MULTINODE_RELAUNCH 1; resumed from the step saved before the fault
    assert got["second"] == [got["head"], got["other"]], got
    launched = starts(wd)
    assert sorted((r, h) for r, _, h in launched) == sorted(
        [("0", got["head"]), ("0", got["other"]), ("1", got["head"]), ("1", got["other"])]
    ), launched
    resumed = {step for r, step, _ in launched if r == "1"}
    assert len(resumed) == 1 and min(resumed) >= got["before"] >= 5, (launched, got["before"])
    assert "relaunch 1, restart 1 of max_restarts 3" in log, log
    # one SLURM job, one run of it: no requeue, no retry, no new job
    recs = records(wd)
    assert [r["jobid"] for r in recs] == [job], recs
    assert (wd / "out.txt").read_text().split() == [job]
    assert sacct_jobs(slurm_cluster, {r["job_name"] for r in recs}, {job}) == {job: ["COMPLETED"]}
    runs = [json.loads(x) for x in got["files"].runs.read_text().splitlines()]
    assert [(x["event"], x["restart"]) for x in runs] == [("start", 0), ("end", 0)] and runs[1]["exit"] == 0, runs
    assert got["files"].restart_logs() == []


def test_a_hung_rank_is_noticed_by_the_trainings_pace_and_restarted_in_the_same_job(slurm_cluster, tmp_path):
    got = run_with_fault(slurm_cluster, tmp_path, signal.SIGSTOP, "stall noticed at")
    assert_restarted_in_the_same_job(slurm_cluster, got)
    log = got["log"]
    # noticed by the adaptive timeout at its floor (steps ~0.1 s apart), not the 30 min of before
    noticed = re.search(r"stall noticed at \S+: no progress for (\d+) s on any rank: taking every rank's stack "
                        r"\(the adaptive timeout: 10x the longest of the last \d+ intervals", log)  # fmt: skip
    assert noticed and noticed[1] == "30", log
    assert re.search(r"restarting the training on the same nodes \(stalled: no progress for 30s on any rank", log), log
    assert "stalled: no progress" not in got["sm"].text  # no verdict reached Snakemake: nothing was recorded
    figures("hung rank restarted", **got["figures"], target_s=90)


def test_a_crashed_rank_is_restarted_in_the_same_job(slurm_cluster, tmp_path):
    got = run_with_fault(slurm_cluster, tmp_path, signal.SIGKILL, "[multinode torchrun] FAILED: node")
    assert_restarted_in_the_same_job(slurm_cluster, got)
    # srun names the first node whose torchrun failed: the killed rank's, or its peer's that lost it
    said = re.search(r"restarting the training on the same nodes \(node (\S+) exited with 1\)", got["log"])
    assert said and said[1] in (got["head"], got["other"]), got["log"]
    figures("crashed rank restarted", **got["figures"], target_s=45)


def test_a_training_that_crashes_at_the_same_step_on_every_launch_is_stopped_by_the_crash_loop_rule(
    slurm_cluster, tmp_path
):
    """Rank 1 exits 3 before step 8 on every launch; the step is saved every 5, so each launch resumes from 5 and
    fails after step 7 again: three launches in a row without progress end the job (not the fourth the budget would
    allow)."""
    wd = torchrun_workflow(tmp_path, "ckpt.py", ckpt_loop(metrics=True, crash_at=8, save_every=5), RESOURCES)
    sm = Snakemake(wd, "--retries", "0")
    try:
        job, joblog = sm.submitted("train")
        rc = sm.wait(600)
    finally:
        for k in range(4):
            (wd / f"release-{k}").touch()
        sm.stop()
    assert rc != 0, sm.text
    log = joblog.read_text()
    launched = starts(wd)
    assert sorted({(r, step) for r, step, _ in launched}) == [("0", 0), ("1", 5), ("2", 5)], launched
    assert "relaunch 2, restart 2 of max_restarts 3" in log and "restart 3 of" not in log, log
    said = "not restarted in the job: a crash loop: 3 launches in a row failed without progress (none beyond step 7)"
    assert said in log, log
    recs = records(wd)
    assert [r["jobid"] for r in recs] == [job], recs  # one SLURM job, no retry
    assert not (wd / "out.txt").exists()
    assert f"SLURM job {job}" in sm.text and "Error in rule train" in sm.text, sm.text
