"""Preemption on the real local SLURM (the suite's cluster runs `multinode cluster up --preemption`: a partition
`urgent` of a higher PriorityTier whose jobs preempt the default partition's), on 22.05 and 24.11.

The training is tests/helpers.py's `checkpoint_loop`: 2 nodes, gloo, periodic saves and a save on the checkpoint
signal (SIGUSR2), each between checkpoint_begin and checkpoint_end metrics events, a resume event after loading. The
preemption is SLURM's own: a job of `urgent` that needs the training's nodes whole (helpers.preempt). Each test waits
for events (files the ranks write, log lines, SLURM's states); timeouts only stop hangs. The grace times are long
enough for the small saves on a loaded machine; slurmctld ends a preempted run up to ~30 s after its grace time
(it checks periodically), which no verdict depends on.
"""

from __future__ import annotations

import csv
import json
import signal
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import JobFiles, StateFolders
from tests.helpers import (
    TEST_SLURM,
    Cluster,
    Snakemake,
    checkpoint_loop,
    complete_lines,
    figures,
    job_logs,
    multinode,
    preempt,
    preemption,
    records,
    run_log_names,
    sacct_jobs,
    slurm,
    snakemake,
    squeue_states,
    torchrun_workflow,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # each preemption waits out its grace time and the requeue delay

GRACE_S = 30  # the save on the signal takes ~0.5 s, the ranks' exit a few: room for a loaded machine

RESOURCES = "nodes=2, gpus=1, cpus_per_task=1, mem_mb=1000, runtime=30"


def workflow(tmp_path: Path, **loop: float) -> Path:
    return torchrun_workflow(tmp_path, "train.py", checkpoint_loop(**loop), RESOURCES)  # type: ignore[arg-type]


def ready(wd: Path, job: str, restart: int) -> bool:
    """Both ranks of this run of the job have their checkpoint handler installed."""
    return all((wd / f"ready-{job}-{restart}-{rank}").exists() for rank in (0, 1))


def files(wd: Path, job: str, attempt: int = 1) -> JobFiles:
    return JobFiles.of(StateFolders(wd).logs / "rule_train" / "_", job, attempt)


def steps(metrics: list[dict]) -> list[int]:
    return [r["step"] for r in metrics if "event" not in r]


def training(sm: Snakemake, wd: Path, steps_done: int = 0) -> str:
    """The train job's SLURM id, once both ranks of its first run are ready and it has logged `steps_done` steps."""
    job, _ = sm.submitted("train")
    wait_for(lambda: ready(wd, job, 0), "both ranks of the first run ready", 300, proc=sm.proc)
    if steps_done:
        metrics = files(wd, job).metrics
        wait_for(lambda: len(steps(complete_lines(metrics))) >= steps_done, f"{steps_done} steps", 120, proc=sm.proc)
    return job


def finished(sm: Snakemake, wd: Path, timeout: float) -> None:
    """The training released (its release file): Snakemake ends well within `timeout`."""
    (wd / "release").touch()
    rc = sm.wait(timeout=timeout)
    assert rc == 0, sm.text


def runs_split(metrics: list[dict]) -> list[list[dict]]:
    """The metrics file's records run by run: each resume event begins the next run's."""
    runs: list[list[dict]] = [[]]
    for rec in metrics:
        if rec.get("event") == "resume":
            runs.append([])
        runs[-1].append(rec)
    return runs


def submitted(wd: Path) -> list[str]:
    """The job ids of every submission from the folder, in the order of submission (every run's)."""
    return [r["jobid"] for r in sorted(records(wd), key=lambda r: r["submitted_at"])]


def run_ids(wd: Path) -> set[str]:
    return {p.read_text() for p in wd.glob("ready-*")}


def notices(wd: Path, job: str, attempt: int = 1) -> list[dict]:
    return [line for line in complete_lines(files(wd, job, attempt).runs) if line.get("event") == "preempted"]


def every_run(cl: Cluster, recs: list[dict], jobs: set[str]) -> dict[str, list[str]]:
    """Accounting's state of every run of these jobs (sacct --duplicates), once it has recorded their ends."""
    sacct_jobs(cl, {r["job_name"] for r in recs}, jobs)
    out = slurm(cl, "sacct", "-D", "-X", "-n", "-P", "-j", ",".join(sorted(jobs)), "-o", "JobIDRaw,State")
    found: dict[str, list[str]] = {}
    for row in out.splitlines():
        jobid, state = row.split("|")
        found.setdefault(jobid, []).append(state.split()[0])
    return found


def epoch(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text).timestamp()


def test_a_training_preempted_during_a_periodic_save_loses_no_step_and_still_requeues_itself_at_its_time_limit(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """max-requeues 1. SLURM preempts the training while it writes a periodic checkpoint (4 s): the labellers turn
    SLURM's SIGTERM into SIGUSR2, the training finishes that save, computes one more step, saves it and exits 0; the
    job waits for SLURM, which requeues it (the same job id). The requeued run resumes at that very step. Then the
    time limit's signal (by scancel, as SLURM sends it): the job requeues itself, which its budget of one still
    allows (SLURM's restart count is 1: before the budget was the job's own, that ended it "not requeued"). Three
    runs, one job, one experiment, no step computed twice; Snakemake succeeds."""
    wd = workflow(tmp_path, every=5, save_s=0.5, periodic_save_s=4)
    with preemption(slurm_cluster, GRACE_S):
        sm = Snakemake(wd, "--multinode-max-requeues", "1")
        try:
            job = training(sm, wd)
            wait_for(lambda: (wd / "saving-5").exists(), "the periodic save of step 5 under way", 120, proc=sm.proc)
            by = preempt(slurm_cluster, job)
            wait_for(lambda: ready(wd, job, 1), "the requeued run ready", 300, proc=sm.proc)
            first_resume = wait_for(
                lambda: [r for r in complete_lines(files(wd, job).metrics) if r.get("event") == "resume"],
                "the requeued run's resume",
                60,
            )
            # the time limit's signal, as SLURM's --signal=USR2@120 sends it (to the steps)
            wait_for(lambda: max(steps(complete_lines(files(wd, job).metrics))) > first_resume[0]["step"] + 2,
                     "steps after the resume", 120, proc=sm.proc)  # fmt: skip
            slurm_cluster.run("scancel", "--signal=USR2", job)
            wait_for(lambda: ready(wd, job, 2), "the run after the job's own requeue ready", 300, proc=sm.proc)
            finished(sm, wd, timeout=300)
        finally:
            sm.stop()
    # SLURM 24.11 runs a job that a preemption requeued once more after it ended well (docs/slurm-versions.md): that
    # run does nothing but say so
    again = TEST_SLURM == "24.11"
    wait_for(lambda: squeue_states(slurm_cluster, [job]).get(job) == "COMPLETED", "the job's end in SLURM", 120)
    metrics = complete_lines(files(wd, job).metrics)
    runs = runs_split(metrics)
    assert len(runs) == 3, runs
    for before, after in zip(runs, runs[1:], strict=False):
        assert after[0]["event"] == "resume" and after[0]["step"] == steps(before)[-1], (before[-4:], after[:2])
    assert steps(metrics) == sorted(set(steps(metrics))), "a step computed twice"  # no step lost, none repeated
    # the preemption came during the periodic save of step 5: SLURM's notice between its begin and end
    (notice,) = notices(wd, job)
    begin = next(r["wall"] for r in metrics if r.get("event") == "checkpoint_begin" and r["step"] == 5)
    end = next(r["wall"] for r in metrics if r.get("event") == "checkpoint_end" and r["step"] == 5)
    assert begin - 1 <= epoch(notice["time"]) <= end, (begin, notice, end)  # PreemptTime: whole seconds
    assert notice["grace_s"] == GRACE_S and notice["restart"] == 0
    # one job, three runs (one log each), one experiment
    assert [r["jobid"] for r in records(wd)] == [job]
    logs = {p.name: p.read_text() for p in job_logs(wd, "train")}
    assert sorted(logs) == sorted(run_log_names(job, 3 if again else 2)), sorted(logs)
    assert len(run_ids(wd)) == 1 and "" not in run_ids(wd), run_ids(wd)
    first, second, third = (logs[name] for name in run_log_names(job, 2))
    assert "passed on to the ranks as SIGUSR2, the checkpoint signal" in first
    assert "[multinode] checkpointed on preemption (step 6)" in first  # the save of step 5 done, then one more step
    assert "requeued; the next run resumes" not in first  # SLURM's requeue, not the job's own
    assert f"[multinode] run 0 preempted by job {by} (" in second and "; checkpointed" in second
    assert "[multinode] checkpointed after SIGUSR2" in second
    assert "[multinode] requeued; the next run resumes from the checkpoint" in second  # the budget was untouched
    assert "restart 2," in third and "[multinode] exit 0," in third
    runs_in_sacct = every_run(slurm_cluster, records(wd), {job})[job]
    if again:
        assert runs_in_sacct == ["PREEMPTED", "REQUEUED", "PREEMPTED", "COMPLETED"], runs_in_sacct
        fourth = logs[run_log_names(job, 3)[3]]
        assert "[multinode] run 2 of this job ended with exit 0; SLURM ran the job again" in fourth, fourth
        assert "launching on" not in fourth  # nothing trained again
    else:
        assert runs_in_sacct == ["PREEMPTED", "REQUEUED", "COMPLETED"], runs_in_sacct
    status = multinode(wd, "status").stdout
    assert f"run 0 preempted by job {by} (SLURM's preemption SIGTERM at" in status, status
    report = multinode(wd, "report").stdout
    with open(next((StateFolders(wd).reports).glob("*.csv"))) as fh:
        (row,) = [r for r in csv.DictReader(fh) if r["scope"] == "job" and r["rule"] == "train"]
    # from SLURM's notice to the run's end: at least the grace time (SLURM ends the run no earlier), on 2 nodes
    assert float(row["preempted_node_s"]) >= 2 * (GRACE_S - 1), (row, report)
    figures("preempted during a periodic save", runs=3, resumed_at=runs[1][0]["step"], preemptor=by,
            preempted_node_s=row["preempted_node_s"])  # fmt: skip


def test_a_grace_time_too_short_for_the_save_resumes_from_the_last_periodic_checkpoint_and_the_log_says_why(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """Periodic saves take 1 s; the save on the signal would take 120 s, and the grace time is 3 s (SLURM ends the
    run within ~30 s after it): the save is cut short, the requeued run resumes from the last periodic checkpoint,
    and the preempted run's log says the grace time was too short, how long this job's saves took and what to ask
    for."""
    wd = workflow(tmp_path, every=3, save_s=120, periodic_save_s=1)
    with preemption(slurm_cluster, 3):
        sm = Snakemake(wd)
        try:
            job = training(sm, wd)
            wait_for(
                lambda: any(r.get("event") == "checkpoint_end" for r in complete_lines(files(wd, job).metrics)),
                "a periodic checkpoint", 120, proc=sm.proc,
            )  # fmt: skip
            preempt(slurm_cluster, job)
            wait_for(lambda: ready(wd, job, 1), "the requeued run ready", 300, proc=sm.proc)
            finished(sm, wd, timeout=600)
        finally:
            sm.stop()
    metrics = complete_lines(files(wd, job).metrics)
    first, second = runs_split(metrics)
    saved = [r["step"] for r in first if r.get("event") == "checkpoint_end"]
    assert (second[0]["event"], second[0]["step"]) == ("resume", saved[-1]), (first[-4:], second[:1])
    assert steps(first)[-1] > saved[-1]  # the steps after the last periodic save were lost, as the log says
    log = (files(wd, job).log).read_text()
    said = next(line for line in log.splitlines() if "grace time ended before the training's checkpoint" in line)
    assert ", grace time 3 s, to " in said
    assert f"this job's saves took 1.0 s on average, 1.0 s at most ({len(saved)} save" in said, said
    assert "was still running" in said and "Ask the cluster's admins for a GraceTime of at least" in said, said
    assert "[multinode] checkpointed on preemption" not in log
    figures("grace time too short", resumed_at=saved[-1], lost_steps=steps(first)[-1] - saved[-1])


def test_with_preempt_mode_cancel_the_job_ends_after_its_checkpoint_and_snakemakes_retry_resumes_from_it(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """PreemptMode=CANCEL: SLURM ends the preempted job instead of requeueing it. It checkpointed in its grace time
    and ended with exit 85; Snakemake's retry (a new job, the same experiment) resumes at that step."""
    wd = workflow(tmp_path, every=1000, save_s=0.5)
    with preemption(slurm_cluster, GRACE_S, "CANCEL"):
        sm = Snakemake(wd, "--retries", "1")
        try:
            job = training(sm, wd, steps_done=3)
            by = preempt(slurm_cluster, job)
            _, line = sm.wait_line("rule train: SLURM job", ".attempt2.log", timeout=300)
            retry = line.split("SLURM job ")[1].split()[0]
            wait_for(lambda: ready(wd, retry, 0), "the retry ready", 300, proc=sm.proc)
            finished(sm, wd, timeout=300)
        finally:
            sm.stop()
    assert retry != job and submitted(wd) == [job, retry]
    failed = next(line for _, line in sm.matching(f"SLURM job {job} failed"))
    assert "SLURM state PREEMPTED" in failed and "job script exit 85" in failed, failed
    before = complete_lines(files(wd, job).metrics)
    after = complete_lines(files(wd, retry, 2).metrics)
    assert after[0]["event"] == "resume" and after[0]["step"] == steps(before)[-1], (before[-3:], after[:2])
    assert len(run_ids(wd)) == 1, run_ids(wd)
    assert every_run(slurm_cluster, records(wd), {job, retry}) == {job: ["PREEMPTED"], retry: ["COMPLETED"]}
    assert f"run 0 preempted by job {by} (" in multinode(wd, "status", "--all").stdout
    figures("PreemptMode=CANCEL", resumed_at=after[0]["step"], jobs=2)


def test_cancel_with_checkpoint_asks_the_training_to_checkpoint_and_the_next_snakemake_resumes_from_it(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """`multinode cancel --checkpoint` while Snakemake runs: the training saves the step it is at and the job ends
    with exit 85 (not requeued); Snakemake reports it; the next `snakemake` resumes at that step. A plain cancel
    stays immediate (test_faults_cluster.py)."""
    wd = workflow(tmp_path, every=1000, save_s=0.5)
    sm = Snakemake(wd)
    try:
        job = training(sm, wd, steps_done=3)
        out = multinode(wd, "cancel", "--checkpoint", "--wait", "120").stdout
        rc = sm.wait(timeout=120)
    finally:
        sm.stop()
    assert rc != 0 and f"SLURM job(s) {job} checkpointed and ended" in out, out
    log = files(wd, job).log.read_text()
    assert "SIGTERM of a cancel that checkpoints first: passed on to the ranks as SIGUSR2" in log
    assert "[multinode] checkpointed for a cancel (multinode cancel --checkpoint, " in log
    saved = steps(complete_lines(files(wd, job).metrics))[-1]
    (wd / "release").touch()
    snakemake(wd, timeout=600)
    (first, second) = submitted(wd)
    resumed = [r for r in complete_lines(files(wd, second).metrics) if r.get("event") == "resume"]
    assert first == job and resumed and resumed[0]["step"] == saved, resumed
    figures("cancel --checkpoint", saved_step=saved)


@pytest.mark.one_release  # Snakemake's Ctrl-C and the adapter's cancel path: plugin logic, the same on any release
def test_snakemakes_first_ctrl_c_checkpoints_a_running_training_and_a_rerun_resumes_from_it(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """Ctrl-C: Snakemake cancels its jobs; a running training is first asked to checkpoint (the same request as
    `cancel --checkpoint`) and given --multinode-cancel-checkpoint-seconds to end. The rerun resumes at that step."""
    wd = workflow(tmp_path, every=1000, save_s=0.5)
    sm = Snakemake(wd)
    try:
        job = training(sm, wd, steps_done=3)
        sm.proc.send_signal(signal.SIGINT)
        sm.wait_line(f"asked SLURM job(s) {job} to checkpoint", "(Ctrl-C again: at once)", timeout=60)
        rc = sm.wait(timeout=180)
    finally:
        sm.stop()
    assert rc != 0
    assert "[multinode] checkpointed for a cancel (Snakemake's Ctrl-C, " in files(wd, job).log.read_text()
    saved = steps(complete_lines(files(wd, job).metrics))[-1]
    (wd / "release").touch()
    snakemake(wd, timeout=600)
    second = submitted(wd)[-1]
    resumed = [r for r in complete_lines(files(wd, second).metrics) if r.get("event") == "resume"]
    assert resumed and resumed[0]["step"] == saved, resumed
    figures("Ctrl-C checkpoints first", saved_step=saved)


def test_the_preempting_partition_exists_with_its_exact_names(slurm_cluster: Cluster) -> None:
    """What checks outside the team read: partition `urgent` over every node, PriorityTier above the default
    partition's, preempt/partition_prio and PreemptMode REQUEUE, the default GraceTime of 60 s."""
    config = slurm(slurm_cluster, "scontrol", "show", "config")
    assert "preempt/partition_prio" in config and "REQUEUE" in config.split("PreemptMode")[1].splitlines()[0]
    parts = {
        line.split()[0].split("=")[1]: dict(f.split("=", 1) for f in line.split() if "=" in f)
        for line in slurm(slurm_cluster, "scontrol", "-o", "show", "partition").splitlines()
    }
    urgent, default = parts["urgent"], parts[slurm_cluster.spec.partition]
    assert int(urgent["PriorityTier"]) > int(default["PriorityTier"]), parts
    assert urgent["Nodes"] == default["Nodes"] == slurm_cluster.spec.node_range
    assert default["GraceTime"] == "60" and default["PreemptMode"] == "REQUEUE", default
    assert json.loads(slurm_cluster.spec.spec_file.read_text())["preemption"] is True
