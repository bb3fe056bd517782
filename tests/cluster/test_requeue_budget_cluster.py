"""Requeue budgets that cannot starve, on the real local SLURM cluster.

- The job's own requeues after a pre-time-limit checkpoint (--multinode-max-requeues) are counted apart from SLURM's
  restart count: preemptions and admin requeues do not use them up.
- A crash loop is bounded: where SLURM runs a failed job again (here a site's RequeueExit), the job script ends the
  job after --multinode-crash-loop-runs quick failures in a row, with an exit code of its own and the last error.

Faults come by job id (scontrol requeue, scancel --signal) or from the job's own code; the tests wait for events
(files the workers write, Snakemake's lines); timeouts only stop hangs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.helpers import (
    Cluster,
    Snakemake,
    copied_workflow,
    figures,
    job_logs,
    jobs_from,
    lines,
    records,
    restart_slurmctld,
    run_log_names,
    sacct_jobs,
    timelimit_ranks_waiting,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # each restart waits SLURM's requeue delay (cred_expire)


def test_a_job_requeued_by_an_admin_three_times_still_requeues_itself_after_its_checkpoint(slurm_cluster, tmp_path):
    """max-requeues 1 and three admin requeues (SLURM's restart count 3): the pre-time-limit signal still makes the
    job checkpoint and requeue itself; the fifth run resumes and completes. (Before the budget was the job's own,
    restart 3 >= 1 ended the job with "not requeued".) The signal comes as SLURM's --signal sends it, by scancel."""
    wd = copied_workflow("timelimit", tmp_path)
    sm = Snakemake(wd, "--multinode-max-requeues", "1")
    try:
        job, _ = sm.submitted("train")
        for restart in range(1, 4):
            wait_for(
                lambda: timelimit_ranks_waiting(wd), f"both workers waiting for the signal (restart {restart - 1})", 300
            )
            for rank in (0, 1):
                (wd / "results" / "ckpt" / f"ready{rank}").unlink()
            slurm_cluster.run("scontrol", "requeue", job)  # an admin (or a preemption with PreemptMode=REQUEUE)
            sm.wait_line(f"SLURM job {job}", f"restart {restart}", timeout=120)
        wait_for(lambda: timelimit_ranks_waiting(wd), "both workers waiting for the signal (restart 3)", 300)
        slurm_cluster.run("scancel", "--signal=USR2", job)  # the pre-time-limit signal
        rc = sm.wait(timeout=600)
    finally:
        sm.stop()
    assert rc == 0, sm.text
    logs = {p.name: p.read_text() for p in job_logs(wd, "train")}
    names = run_log_names(job, 4)
    assert sorted(logs) == sorted(names), sorted(logs)
    third = logs[names[3]]
    assert "[multinode] checkpointed after SIGUSR2" in third
    assert "[multinode] requeued; the next run resumes from the checkpoint" in third
    last = logs[names[4]]
    assert "restart 4," in last and "[multinode] exit 0," in last
    for rank in (0, 1):
        resumed = f"worker rank {rank}: resumed from checkpoint results/ckpt/rank{rank}.json (SIGUSR2 at restart 3)"
        assert resumed in last
    assert json.loads((wd / "results" / "done.json").read_text())["restart"] == 4
    assert [r["jobid"] for r in records(wd)] == [job]  # one submission: nothing was resubmitted
    runs = sacct_jobs(slurm_cluster, {records(wd)[0]["job_name"]}, {job})
    assert list(runs) == [job] and runs[job][-1] == "COMPLETED"
    figures("admin requeues x3, then the job's own requeue", runs=len(logs), submissions=len(records(wd)))


@contextmanager
def requeue_exit(cl: Cluster, codes: str) -> Iterator[None]:
    """The cluster as a site that requeues jobs ending with these exit codes (slurm.conf RequeueExit), for the
    block; the config is restored afterwards."""
    conf = cl.spec.slurm_conf
    original = conf.read_text()
    conf.write_text(original + f"RequeueExit={codes}\n")
    try:
        restart_slurmctld(cl)
        wait_for(
            lambda: f"RequeueExit             = {codes}" in cl.run("scontrol", "show", "config").stdout,
            "slurmctld to take RequeueExit",
            60,
        )
        yield
    finally:
        conf.write_text(original)
        restart_slurmctld(cl)


CRASHING = """
rule work:
    output: "out.txt"
    shell: "echo run-${{SLURM_RESTART_COUNT:-0}} >> runs.txt; echo 'loading the checkpoint failed' >&2; exit 3"
"""


def test_a_job_that_crashes_after_every_start_stops_after_three_runs_with_its_last_error(slurm_cluster, tmp_path):
    """A site requeues every job that exits 3; the job exits 3 right after it starts. Without a bound SLURM would run
    it forever; with the default (3 failures within 300 s of their start) the third run ends it with exit 88,
    which no RequeueExit names, and Snakemake reports the crash loop with the last exit code."""
    wd = tmp_path / "wf"
    wd.mkdir()
    (wd / "Snakefile").write_text(CRASHING)
    with requeue_exit(slurm_cluster, "3"):
        sm = Snakemake(wd)
        try:
            rc = sm.wait(timeout=600)
        finally:
            sm.stop()
    assert rc != 0, sm.text
    assert lines(wd / "runs.txt") == ["run-0", "run-1", "run-2"]  # three runs: SLURM requeued the first two
    (failure,) = [line for _, line in sm.matching("SLURM job", "failed")]
    assert "a crash loop: 3 runs in a row failed soon after their start, the last with exit 3" in failure
    assert "job script exit 88" in failure
    (job,) = [r["jobid"] for r in records(wd)]
    assert jobs_from(slurm_cluster, wd) == {job}
    last = next(p for p in job_logs(wd, "work") if p.name == run_log_names(job, 2)[2]).read_text()
    assert "loading the checkpoint failed" in last and "[multinode] crash loop: 3 runs in a row" in last
    runs = sacct_jobs(slurm_cluster, {records(wd)[0]["job_name"]}, {job})
    assert runs[job][-1] == "FAILED"
    assert not (wd / "out.txt").exists()
    figures("crash loop", runs=len(lines(wd / "runs.txt")), exit=88)
