"""Faults injected into a running `snakemake --executor multinode` on the real local SLURM cluster.

Each test injects one fault by pid (read from a daemon's pid file, from Snakemake's Popen or from a file the job
writes; never by process name) and proves that nothing is lost and nothing is run or submitted twice. Jobs wait for a
release file the test creates; the test waits for events (a line of Snakemake's output, a file, a SLURM state). The
timeouts only stop hangs: no verdict depends on how long anything takes. The one fixed duration is the slurmctld
outage itself (the fault, not a verdict).

The measured figures (fault -> notice, jobs lost, duplicates) are printed as `[figures] ...` lines (pytest -s).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import JobFiles, StateFolders
from snakemake_executor_multinode.sandbox import cluster
from tests.helpers import (
    END_STATES,
    RELEASED,
    Cluster,
    Snakemake,
    alive,
    figures,
    jobs_from,
    lines,
    records,
    restart_slurmd,
    run_log_names,
    sacct_jobs,
    snakemake,
    squeue_states,
    torchrun_rule,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # each takes 10-100 s: job starts, SLURM's requeue delay

WAIT_FOR = "while [ ! -e release ]; do sleep 0.2; done"  # a job's only way on: the test creates `release`


# --- what the workflow folder and SLURM say --------------------------------------------------------------------------


def daemon_pid(cl: Cluster, name: str) -> int | None:
    """The daemon's pid from its pid file, if that process is alive and is that daemon (checked in /proc)."""
    pidfile = {"slurmctld": "run/slurmctld.pid", "slurmdbd": "run/slurmdbd.pid"}[name]
    try:
        pid = int((cl.spec.dir / pidfile).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if alive(pid, name) else None


def kill_daemon(cl: Cluster, name: str) -> float:
    """SIGKILL the daemon by the pid in its pid file; return when it is gone (time.monotonic())."""
    pid = daemon_pid(cl, name)
    assert pid is not None, f"{name} is not running: nothing to inject the fault into"
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid, name), f"end of {name} (pid {pid})", 30)
    return time.monotonic()


@contextmanager
def daemon_outage(cl: Cluster) -> Iterator[None]:
    """Hold the cluster folder's own lock (the one `multinode cluster up/down` take) while a daemon is down. Without
    it, a test session starting meanwhile on the shared cluster finds the cluster not up and its fixture's
    `cluster.up` rebuilds it from scratch (fresh state: every running job on it lost; seen once here). Holding the
    lock, such a `cluster.up` stops at once with "another `multinode cluster` command is working on ..."."""
    with open(cl.spec.dir / ".lock", "w") as fh:

        def locked() -> bool:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        wait_for(locked, f"the lock of {cl.spec.dir} (a `multinode cluster` command is working on it)", 600)
        yield


def nodes_healthy(cl: Cluster) -> bool:
    """Every node answers and takes jobs: idle, or busy with someone's jobs (others share the test cluster)."""
    proc = cl.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
    states = dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)
    want = {cl.spec.node_name(i) for i in cl.spec.node_indices}
    return (
        proc.returncode == 0
        and set(states) == want
        and all(s in ("idle", "mixed", "allocated") for s in states.values())
    )


@pytest.fixture
def workflow(slurm_cluster: Cluster, tmp_path: Path) -> Iterator[Path]:
    """A fresh workflow folder; afterwards, every job submitted from it that is still active is cancelled (only
    those: other engineers' jobs on the shared cluster are never touched)."""
    wd = tmp_path / "wf"
    wd.mkdir()
    yield wd
    (wd / "release").touch()
    if daemon_pid(slurm_cluster, "slurmctld") is None:
        return  # the test's own `finally` restarts it; nothing can be cancelled without it
    ids = {r["jobid"] for r in records(wd) if r.get("jobid")} | jobs_from(slurm_cluster, wd)
    if ids:
        left = [j for j, s in squeue_states(slurm_cluster, sorted(ids)).items() if s not in END_STATES]
        if left:
            slurm_cluster.run("scancel", *left, check=False)


def snakefile(wd: Path, text: str) -> None:
    (wd / "Snakefile").write_text(text)


# --- 1. an admin requeues a running two-node job -----------------------------------------------------------------
REQUEUE = f"""
rule work:
    output: "out.txt"
    resources: nodes=2, own_launcher=True
    shell:
        "echo run-${{{{SLURM_RESTART_COUNT:-0}}}} >> runs.txt; {WAIT_FOR}; "
        "echo run-${{{{SLURM_RESTART_COUNT:-0}}}} >> writes.txt; echo run-${{{{SLURM_RESTART_COUNT:-0}}}} > {{output}}"
"""


def test_scontrol_requeue_of_a_running_two_node_job_is_news_not_a_failure(slurm_cluster, workflow):
    wd = workflow
    snakefile(wd, REQUEUE)
    sm = Snakemake(wd)
    try:
        job, _ = sm.submitted("work")
        wait_for(lambda: lines(wd / "runs.txt") == ["run-0"], "the first run of the job", 300)
        assert squeue_states(slurm_cluster, [job]) == {job: "RUNNING"}
        slurm_cluster.run("scontrol", "requeue", job)  # the fault: an admin, before maintenance
        fault = time.monotonic()
        noticed, note = sm.wait_line(f"SLURM job {job}", "requeued (", "restart 1", timeout=120)
        # the job runs again (after SLURM's BeginTime delay) and only then may it finish
        wait_for(lambda: lines(wd / "runs.txt") == ["run-0", "run-1"], "the second run of the job", 300)
        assert sm.alive(), sm.text
        (wd / "release").touch()
        rc = sm.wait()
    finally:
        sm.stop()
    assert rc == 0, sm.text
    assert not [line for _, line in sm.matching("Error")], sm.text
    assert lines(wd / "runs.txt") == ["run-0", "run-1"]  # ran twice: once per run of the job
    assert lines(wd / "writes.txt") == ["run-1"]  # the output written once, by the second run
    assert lines(wd / "out.txt") == ["run-1"]
    logdir = StateFolders(wd).logs / "rule_work"
    assert sorted(p.name for p in logdir.rglob("*.log")) == run_log_names(job, 1)
    first, second = (next(logdir.rglob(name)).read_text() for name in run_log_names(job, 1))
    assert "restart 0," in first and "[multinode] exit 143," in first and "exit 0," not in first
    assert "restart 1," in second and "[multinode] exit 0," in second
    # one SLURM job, one submission: the requeue was never mistaken for a failure and resubmitted
    assert [r["jobid"] for r in records(wd)] == [job]
    assert jobs_from(slurm_cluster, wd) == {job}
    runs = sacct_jobs(slurm_cluster, {records(wd)[0]["job_name"]}, {job})
    assert list(runs) == [job] and runs[job][-1] == "COMPLETED"
    figures(
        "scontrol requeue",
        fault_to_notice_s=round(noticed - fault, 1),
        note=repr(note.split(": ", 1)[-1]),
        jobs_lost=0,
        duplicate_submissions=len(records(wd)) - 1,
        runs=len(lines(wd / "runs.txt")),
    )


# --- 2. Snakemake SIGKILLed while its job runs; the rerun reattaches -----------------------------------------------
REATTACH = f"""
rule work:
    output: "out.txt"
    resources: nodes=2, own_launcher=True
    shell: "echo $SLURM_JOB_ID >> runs.txt; {WAIT_FOR}; echo $SLURM_JOB_ID >> writes.txt; echo done > {{output}}"
"""


def unlock(wd: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--unlock"], cwd=wd, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def kill_snakemake_while_its_job_runs(wd: Path, cl: Cluster) -> tuple[str, str, float]:
    """Run 1 submits the job; once the job runs, SIGKILL Snakemake (by its pid). Returns (job, run id, when)."""
    first = Snakemake(wd)
    try:
        job, _ = first.submitted("work")
        wait_for(lambda: lines(wd / "runs.txt") == [job], "the job running", 300)
        os.kill(first.pid, signal.SIGKILL)
        killed = time.monotonic()
        assert first.wait(60) == -signal.SIGKILL
    finally:
        first.stop()
    assert squeue_states(cl, [job]) == {job: "RUNNING"}  # the job outlives its Snakemake
    (run_id,) = {r["run_id"] for r in records(wd)}
    return job, run_id, killed


@pytest.mark.snakemake8
def test_rerun_after_snakemake_was_killed_reattaches_to_the_running_job(slurm_cluster, workflow):
    wd = workflow
    snakefile(wd, REATTACH)
    job, first_run, killed = kill_snakemake_while_its_job_runs(wd, slurm_cluster)
    locked = snakemake(wd, jobs=1, check=False)  # the killed run's lock stays behind
    assert locked.returncode != 0 and "Directory cannot be locked" in locked.stderr, locked.stderr
    assert len(records(wd)) == 1  # refused before anything was submitted
    unlock(wd)
    rerun_started = time.monotonic()
    second = Snakemake(wd)  # exactly the first command again: nothing else to type
    try:
        noticed, line = second.wait_line(f"reattached to SLURM job {job} (", timeout=120)
        assert "running, submitted" in line
        # no second job: the rerun's registry record (written right after that line) is the first run's job, adopted
        recs = wait_for(lambda: len(r := records(wd)) == 2 and r, "the rerun's registry record", 30)
        assert {r["jobid"] for r in recs} == {job}, recs
        adopted = next(r for r in recs if r["run_id"] != first_run)
        assert adopted["adopted_from"] == first_run
        assert jobs_from(slurm_cluster, wd) == {job}
        assert not second.matching("rule work: SLURM job")  # the line of a new submission
        (wd / "release").touch()
        rc = second.wait()
    finally:
        second.stop()
    assert rc == 0, second.text
    assert lines(wd / "runs.txt") == [job] and lines(wd / "writes.txt") == [job]  # ran once, wrote once
    assert lines(wd / "out.txt") == ["done"]
    assert jobs_from(slurm_cluster, wd) == {job}
    runs = sacct_jobs(slurm_cluster, {r["job_name"] for r in records(wd)}, {job})
    assert runs == {job: ["COMPLETED"]}
    figures(
        "Snakemake SIGKILLed, rerun",
        rerun_start_to_reattach_s=round(noticed - rerun_started, 1),
        kill_to_reattach_s=round(noticed - killed, 1),
        jobs_lost=0,
        duplicate_jobs=len(runs) - 1,
    )
    # The adopting run saw the job end and recorded it: a later rerun for a deleted output runs the job anew.
    (wd / "out.txt").unlink()
    again = snakemake(wd, jobs=1, check=False)
    text = again.stdout + again.stderr
    assert again.returncode == 0, text
    assert f"not reattaching to SLURM job {job} of run" in text and "its end (success) was reported" in text, text
    (new,) = [r for r in records(wd) if r["jobid"] != job]
    assert new["adopted_from"] is None and lines(wd / "runs.txt") == [job, new["jobid"]]
    assert lines(wd / "out.txt") == ["done"]


def test_a_forced_rerun_while_the_old_job_runs_submits_anew_and_says_the_old_one_still_runs(slurm_cluster, workflow):
    """-F asks for the job to run again: a job a killed run left running is not adopted for it, and the user is told
    that it still runs (it writes the same output)."""
    wd = workflow
    snakefile(wd, REATTACH)
    job, first_run, _ = kill_snakemake_while_its_job_runs(wd, slurm_cluster)
    unlock(wd)
    second = Snakemake(wd, "-F")
    try:
        _, warning = second.wait_line(f"SLURM job {job} of run {first_run} writes the same outputs", timeout=120)
        assert "still running" in warning and "the job is forced" in warning and f"scancel {job}" in warning
        _, line = second.wait_line("rule work: SLURM job", "node(s)", timeout=120)  # a new submission's line
        new = line.split("SLURM job ")[1].split()[0]
        assert new != job and not second.matching("reattached")
        wait_for(lambda: new in lines(wd / "runs.txt"), "the new job running", 300)
        (wd / "release").touch()
        rc = second.wait()
    finally:
        second.stop()
    assert rc == 0, second.text
    assert lines(wd / "runs.txt") == [job, new] and lines(wd / "out.txt") == ["done"]
    recs = {r["run_id"]: r for r in records(wd)}
    assert len(recs) == 2 and recs[first_run]["jobid"] == job and recs[first_run]["ended"] is None
    (rerun,) = set(recs) - {first_run}
    assert recs[rerun]["jobid"] == new and recs[rerun]["adopted_from"] is None and recs[rerun]["ended"] == "success"


def test_rerun_with_no_reattach_submits_a_new_job(slurm_cluster, workflow):
    wd = workflow
    snakefile(wd, REATTACH)
    job, first_run, _ = kill_snakemake_while_its_job_runs(wd, slurm_cluster)
    unlock(wd)
    second = Snakemake(wd, "--multinode-no-reattach")
    try:
        new, _ = second.submitted("work")
        assert new != job
        assert not second.matching("reattached")
        recs = {r["run_id"]: r for r in records(wd)}
        assert len(recs) == 2 and recs[first_run]["jobid"] == job
        (rerun,) = set(recs) - {first_run}
        assert recs[rerun]["jobid"] == new and recs[rerun]["adopted_from"] is None
        wait_for(lambda: jobs_from(slurm_cluster, wd) == {job, new}, "both jobs in SLURM", 60)
        # the old job would write the same output: the user's part with --multinode-no-reattach is to cancel it
        slurm_cluster.run("scancel", job)
        wait_for(lambda: squeue_states(slurm_cluster, [job]).get(job) == "CANCELLED", f"job {job} cancelled", 120)
        wait_for(lambda: new in lines(wd / "runs.txt"), "the new job running", 300)
        (wd / "release").touch()
        rc = second.wait()
    finally:
        second.stop()
    assert rc == 0, second.text
    assert lines(wd / "runs.txt") == [job, new] and lines(wd / "writes.txt") == [new]
    runs = sacct_jobs(slurm_cluster, {r["job_name"] for r in records(wd)}, {job, new})
    assert runs == {job: ["CANCELLED"], new: ["COMPLETED"]}


def test_rerun_takes_the_result_of_a_job_that_finished_while_snakemake_was_away(slurm_cluster, workflow):
    """What a user types, step by step, when the job ended before the rerun: --unlock, then --rerun-incomplete
    (Snakemake refuses outputs it had marked incomplete); the plugin then adopts the finished job's result."""
    wd = workflow
    snakefile(wd, REATTACH)
    job, first_run, _ = kill_snakemake_while_its_job_runs(wd, slurm_cluster)
    (wd / "release").touch()
    wait_for(lambda: squeue_states(slurm_cluster, [job]).get(job) == "COMPLETED", f"job {job} COMPLETED", 120)
    assert lines(wd / "out.txt") == ["done"]
    refused = snakemake(wd, jobs=1, check=False)  # the output exists and the killed run had marked it incomplete
    assert refused.returncode != 0, refused.stdout + refused.stderr
    assert "IncompleteFilesException" in refused.stderr and "--rerun-incomplete" in refused.stderr, refused.stderr
    locked = snakemake(wd, "--rerun-incomplete", jobs=1, check=False)
    assert locked.returncode != 0 and "Directory cannot be locked" in locked.stderr, locked.stderr
    assert [r["jobid"] for r in records(wd)] == [job]  # both refused before anything was submitted
    unlock(wd)
    rerun = snakemake(wd, "--rerun-incomplete", jobs=1, check=False)
    text = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, text
    assert f"reattached to SLURM job {job} (finished while Snakemake was away, submitted" in text, text
    assert lines(wd / "runs.txt") == [job] and lines(wd / "writes.txt") == [job]  # not run again
    assert lines(wd / "out.txt") == ["done"]
    assert {r["jobid"] for r in records(wd)} == {job} and jobs_from(slurm_cluster, wd) == {job}
    assert sacct_jobs(slurm_cluster, {r["job_name"] for r in records(wd)}, {job}) == {job: ["COMPLETED"]}
    again = snakemake(wd, jobs=1, check=False)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    forced = snakemake(wd, "-F", jobs=1, check=False)  # the adopted result was reported: -F runs the job again
    text = forced.stdout + forced.stderr
    assert forced.returncode == 0 and f"not reattaching to SLURM job {job} of run" in text, text
    (new,) = [r for r in records(wd) if r["jobid"] != job]
    assert new["adopted_from"] is None and lines(wd / "runs.txt") == [job, new["jobid"]]
    assert lines(wd / "out.txt") == ["done"]


# --- 3. Ctrl-C cancels exactly this run's jobs ------------------------------------------------------------------
CTRL_C = f"""
rule work:
    output: "{{run}}/{{name}}.txt"
    resources: nodes=2, own_launcher=True
    shell:
        "echo {{wildcards.run}}{{wildcards.name}} >> runs.txt; touch started-{{wildcards.run}}{{wildcards.name}}; "
        "{WAIT_FOR}; echo {{wildcards.run}}{{wildcards.name}} > {{output}}"
"""


def test_ctrl_c_cancels_exactly_this_runs_jobs_not_those_of_another_run_in_the_same_folder(slurm_cluster, workflow):
    wd = workflow
    snakefile(wd, CTRL_C)
    # Two runs in one folder: Snakemake's lock refuses only runs whose outputs (or inputs) overlap. Their outputs lie
    # in folders of their own: at its end an interrupted Snakemake removes the empty folders of its missing outputs
    # (dag.cleanup_workdir), which would pull a shared `out/` away from under the other run's running job.
    run_a = Snakemake(wd, "a/1.txt", "a/2.txt", jobs=2)
    run_b = Snakemake(wd, "b/1.txt")
    try:
        for name in ("a1", "a2", "b1"):
            wait_for(lambda name=name: (wd / f"started-{name}").exists(), f"job {name} running", 300)
        recs = records(wd)
        a_jobs = sorted((r["jobid"] for r in recs if r["wildcards"]["run"] == "a"), key=int)
        (b_job,) = [r["jobid"] for r in recs if r["wildcards"]["run"] == "b"]
        assert len({r["run_id"] for r in recs}) == 2 and len(a_jobs) == 2
        assert set(squeue_states(slurm_cluster, [*a_jobs, b_job]).values()) == {"RUNNING"}
        run_a.proc.send_signal(signal.SIGINT)  # Ctrl-C, by the pid of run A
        fault = time.monotonic()
        rc_a = run_a.wait(120)
        cancelled = wait_for(
            lambda: set(squeue_states(slurm_cluster, a_jobs).values()) == {"CANCELLED"} and time.monotonic(),
            "run A's jobs CANCELLED",
            120,
        )
        assert rc_a != 0
        run_a.wait_line("cancelling SLURM jobs " + " ".join(a_jobs), timeout=5)
        assert squeue_states(slurm_cluster, [b_job]) == {b_job: "RUNNING"}
        assert run_b.alive(), run_b.text
        (wd / "release").touch()
        rc_b = run_b.wait()
    finally:
        run_a.stop()
        run_b.stop()
    assert rc_b == 0, run_b.text
    assert not run_b.matching("cancelling")
    assert lines(wd / "b/1.txt") == ["b1"]
    assert not (wd / "a/1.txt").exists() and not (wd / "a/2.txt").exists()
    assert sorted(lines(wd / "runs.txt")) == ["a1", "a2", "b1"]
    assert jobs_from(slurm_cluster, wd) == {*a_jobs, b_job}
    assert squeue_states(slurm_cluster, [*a_jobs, b_job]) == {**dict.fromkeys(a_jobs, "CANCELLED"), b_job: "COMPLETED"}
    figures("Ctrl-C", sigint_to_all_cancelled_s=round(cancelled - fault, 1), other_runs_jobs_cancelled=0)


# --- 4. slurmctld outage while a job ends and the next one is submitted ----------------------------------------
OUTAGE_SECONDS = 60
CHAIN = f"""
rule all:
    input: "down.txt"
rule up:
    output: "up.txt"
    resources: nodes=2, own_launcher=True
    shell: "echo up >> runs.txt; {WAIT_FOR}; echo up > {{output}}"
rule down:
    input: "up.txt"
    output: "down.txt"
    shell: "echo down >> runs.txt; cat {{input}} > {{output}}"
"""


def saved_by_slurmctld(cl: Cluster, job: str) -> None:
    """Wait until slurmctld's saved state (StateSaveLocation) holds the job as it is now, running. slurmctld saves its
    state a second or a few after a change; a SIGKILL inside that window loses the newest jobs (seen here: a job that
    had just started was purged on restart as "defunct" and its id given to the next submission). That window is
    SLURM's, not the plugin's: the fault under test is the outage of a controller whose state is on disk. A job
    update is a change slurmctld saves; its comment, a unique word, shows up in the saved file."""
    word = f"saved-{uuid.uuid4().hex[:12]}"
    cl.run("scontrol", "update", f"JobId={job}", f"Comment={word}")

    def saved() -> bool:
        try:
            return word.encode() in (cl.spec.dir / "state" / "job_state").read_bytes()
        except FileNotFoundError:  # between slurmctld's renames
            return False

    # polled often: the kill follows the save closely, so that little else (other engineers' jobs) is unsaved
    wait_for(saved, f"slurmctld's saved state with job {job} running", 60, interval=0.02)


def ensure_slurmctld(cl: Cluster) -> None:
    if daemon_pid(cl, "slurmctld") is None:
        cluster._slurmctld_up(cl.spec)  # the sandbox's own start: recovers the saved state (no -c)
    wait_for(lambda: nodes_healthy(cl), "every node answering (idle, mixed or allocated)", 180)


def test_slurmctld_outage_while_a_job_ends_and_the_next_is_submitted(slurm_cluster, workflow):
    wd = workflow
    snakefile(wd, CHAIN)
    sm = Snakemake(wd)
    try:
        up, _ = sm.submitted("up")
        wait_for(lambda: lines(wd / "runs.txt") == ["up"], "the upstream job running", 300)
        saved_by_slurmctld(slurm_cluster, up)
        with daemon_outage(slurm_cluster):
            try:
                killed = kill_daemon(slurm_cluster, "slurmctld")  # the fault
                (wd / "release").touch()  # the upstream job ends during the outage: the downstream sbatch meets it
                noticed, notice = sm.wait_line("waiting for SLURM (sbatch)", timeout=120)
                time.sleep(max(0.0, killed + OUTAGE_SECONDS - time.monotonic()))  # the outage itself, not a verdict
                assert daemon_pid(slurm_cluster, "slurmctld") is None  # nobody restarted it: the outage was real
                assert not sm.matching("rule down: SLURM job") and sm.alive(), sm.text
                cluster._slurmctld_up(slurm_cluster.spec)  # the sandbox's own start: recovers the saved state
                restarted = time.monotonic()
            finally:
                ensure_slurmctld(slurm_cluster)
        submitted, line = sm.wait_line("rule down: SLURM job", timeout=300)
        down = line.split("SLURM job ")[1].split()[0]
        rc = sm.wait(300)
    finally:
        sm.stop()
    assert rc == 0, sm.text
    assert not sm.matching("Error"), sm.text
    assert lines(wd / "runs.txt") == ["up", "down"]  # every job ran exactly once
    assert lines(wd / "down.txt") == ["up"]
    recs = records(wd)
    assert sorted((r["rule"], r["jobid"]) for r in recs) == [("down", down), ("up", up)]  # submitted once each
    runs = sacct_jobs(slurm_cluster, {r["job_name"] for r in recs}, {up, down})
    assert runs == {up: ["COMPLETED"], down: ["COMPLETED"]}
    assert jobs_from(slurm_cluster, wd) == {up, down}
    figures(
        "slurmctld outage",
        kill_to_waiting_notice_s=round(noticed - killed, 1),
        notice=repr(notice.split("waiting for SLURM", 1)[1][:90]),
        outage_s=round(restarted - killed, 1),
        restart_to_submitted_s=round(submitted - restarted, 1),
        jobs_lost=0,
        duplicate_jobs=len(runs) - 2,
    )


# --- 5. accounting (slurmdbd) outage ------------------------------------------------------------------------------
ACCOUNTING = f"""
rule all:
    input: "ok.txt", "cancelled.txt", "killed.txt"
rule ok:
    output: "ok.txt"
    shell: "touch started-ok; {WAIT_FOR}; echo ok > {{output}}"
rule cancelled:
    output: "cancelled.txt"
    shell: "touch started-cancelled; while true; do sleep 0.2; done"
rule killed:
    output: "killed.txt"
    # $PPID: the job script's shell (the rule runs in a child bash); the loop ends once that shell is gone
    shell: "echo $PPID > killed.pid; while kill -0 $PPID 2>/dev/null; do sleep 0.2; done"
"""


def ensure_slurmdbd(cl: Cluster) -> None:
    if daemon_pid(cl, "slurmdbd") is None:
        cluster._slurmdbd_up(cl.spec)  # the sandbox's own start; it waits until sacctmgr answers


def test_slurmdbd_outage_gives_no_false_failure_and_jobs_ending_without_a_marker_are_noticed(slurm_cluster, workflow):
    wd = workflow
    snakefile(wd, ACCOUNTING)
    sm = Snakemake(wd, "--keep-going", "--multinode-sweep-seconds", "5", jobs=3)
    try:
        recs = wait_for(lambda: len(r := [x for x in records(wd) if x.get("jobid")]) == 3 and r, "3 submissions", 120)
        job = {r["rule"]: r["jobid"] for r in recs}
        started = ("started-ok", "started-cancelled", "killed.pid")
        wait_for(lambda: all((wd / f).exists() for f in started), "the three jobs running", 300)
        with daemon_outage(slurm_cluster):
            try:
                killed_dbd = kill_daemon(slurm_cluster, "slurmdbd")  # the fault
                sacct = slurm_cluster.run("sacct", "-X", "-n", "-j", job["ok"], check=False)
                assert sacct.returncode != 0, sacct.stdout  # accounting really is gone
                (wd / "release").touch()
                sm.wait_line("Finished jobid", "(Rule: ok)", timeout=120)
                # a job killed without running its EXIT trap (the OOM killer, a node's kernel): no marker
                shell = int((wd / "killed.pid").read_text())
                assert alive(shell, "slurm_script"), "killed.pid names no job script shell"  # its comm, from /proc
                os.kill(shell, signal.SIGKILL)
                fault_killed = time.monotonic()
                noticed_killed, err_killed = sm.wait_line(f"SLURM job {job['killed']} failed", timeout=180)
                # the sweep that found it asked about the running job `cancelled` too: no false failure
                assert not sm.matching(f"SLURM job {job['cancelled']} failed"), sm.text
                # a job cancelled: its trap writes a failing marker, which is checked against SLURM's state
                slurm_cluster.run("scancel", job["cancelled"])
                fault_cancelled = time.monotonic()
                noticed_cancelled, err_cancelled = sm.wait_line(f"SLURM job {job['cancelled']} failed", timeout=180)
                assert daemon_pid(slurm_cluster, "slurmdbd") is None  # the answers came without accounting
                rc = sm.wait(300)
                down_s = time.monotonic() - killed_dbd
            finally:
                ensure_slurmdbd(slurm_cluster)
    finally:
        sm.stop()
    assert rc != 0  # two jobs failed, and were reported as failed
    assert lines(wd / "ok.txt") == ["ok"]  # no false failure
    assert not sm.matching(f"SLURM job {job['ok']} failed"), sm.text
    assert not (wd / "killed.txt").exists() and not (wd / "cancelled.txt").exists()
    # squeue's answer (sacct was down): a state, no exit code (sacct's answer has one); no marker was read
    assert "SLURM state FAILED" in err_killed and "exit code" not in err_killed, err_killed
    assert "job script exit" not in err_killed, err_killed
    assert "SLURM state CANCELLED" in err_cancelled and "job script exit 143" in err_cancelled, err_cancelled
    assert "exit code" not in err_cancelled, err_cancelled
    # accounting catches up once it is back: every job recorded, each once
    runs = sacct_jobs(slurm_cluster, {r["job_name"] for r in recs}, set(job.values()))
    assert set(runs) == set(job.values()) and all(len(states) == 1 for states in runs.values()), runs
    figures(
        "slurmdbd outage",
        kill_shell_to_failure_noticed_s=round(noticed_killed - fault_killed, 1),
        scancel_to_failure_noticed_s=round(noticed_cancelled - fault_cancelled, 1),
        slurmdbd_down_s=round(down_s, 1),
        false_failures=0,
        killed_job=err_killed.split("failed: ", 1)[-1][:80],
    )


# --- 6. Snakemake exiting on a job's error cancels exactly this run's jobs ---------------------------------------
ON_ERROR = f"""
rule fail:
    output: "{{run}}/fail.txt"
    shell: "touch started-fail-{{wildcards.run}}; while [ ! -e fail-now ]; do sleep 0.2; done; exit 3"
rule long:
    output: "{{run}}/long.txt"
    resources: nodes=2, own_launcher=True
    shell: "touch started-long-{{wildcards.run}}; {WAIT_FOR}; echo {{wildcards.run}} > {{output}}"
"""


def test_exiting_on_a_failed_job_cancels_this_runs_running_jobs_not_others(slurm_cluster, workflow):
    wd = workflow
    snakefile(wd, ON_ERROR)
    # a job of the same user submitted by hand from the same folder: never this run's
    hand = slurm_cluster.run(
        "sbatch", "--parsable", "-o", "/dev/null", "--wrap", f"touch started-hand; {WAIT_FOR}", cwd=wd
    ).stdout.strip()
    run_a = Snakemake(wd, "a/fail.txt", "a/long.txt", jobs=2)  # without --keep-going
    run_b = Snakemake(wd, "b/long.txt")
    try:
        for name in ("started-fail-a", "started-long-a", "started-long-b", "started-hand"):
            wait_for(lambda name=name: (wd / name).exists(), name, 300)
        recs = records(wd)
        job = {(r["wildcards"]["run"], r["rule"]): r["jobid"] for r in recs}
        long_a, fail_a, long_b = job["a", "long"], job["a", "fail"], job["b", "long"]
        assert set(squeue_states(slurm_cluster, [long_a, fail_a, long_b, hand]).values()) == {"RUNNING"}
        (wd / "fail-now").touch()  # the fault: run A's `fail` job exits 3 while its `long` job runs
        failed, _ = run_a.wait_line(f"SLURM job {fail_a} failed", timeout=180)
        rc_a = run_a.wait(180)  # Snakemake exits on the error, not after the long job
        ended = time.monotonic()
        cancel = run_a.wait_line("cancelling SLURM jobs", timeout=5)[1]
        assert cancel.split("cancelling SLURM jobs ", 1)[1].split(" (")[0].split() == [long_a], cancel
        assert "(a job failed and --keep-going is off)" in cancel
        assert squeue_states(slurm_cluster, [long_a]) == {long_a: "CANCELLED"}
        assert squeue_states(slurm_cluster, [long_b, hand]) == {long_b: "RUNNING", hand: "RUNNING"}
        assert run_b.alive(), run_b.text
        (wd / "release").touch()
        rc_b = run_b.wait()
        wait_for(lambda: squeue_states(slurm_cluster, [hand]).get(hand) == "COMPLETED", "the hand job COMPLETED", 120)
    finally:
        run_a.stop()
        run_b.stop()
    assert rc_a != 0 and rc_b == 0, run_a.text + run_b.text
    assert not run_b.matching("cancelling")
    assert lines(wd / "b/long.txt") == ["b"] and not (wd / "a/long.txt").exists()
    assert jobs_from(slurm_cluster, wd) == {long_a, fail_a, long_b, hand}
    figures("exit on error", error_to_snakemake_exit_s=round(ended - failed, 1), other_jobs_cancelled=0)


# --- 8. a burst of submissions meets a controller that stops answering ---------------------------------------------
FAN_OUT = 60
FANOUT = f"""
rule all:
    input: expand("shard/{{i}}.txt", i=range({FAN_OUT}))
rule shard:
    output: "shard/{{i}}.txt"
    shell: "echo $SLURM_JOB_ID >> ran/{{wildcards.i}}; echo done > {{output}}"
"""


@pytest.mark.one_release
def test_a_burst_of_submissions_through_a_frozen_slurmctld_submits_and_runs_every_job_exactly_once(
    slurm_cluster, workflow
):
    """60 independent jobs submitted as fast as the pace allows (--multinode-submit-rate 20); once 10 are in,
    slurmctld is stopped (SIGSTOP by its pid) for longer than sbatch's MessageTimeout, then continued: sbatch calls
    time out, some after slurmctld queued their job (a lost reply), and are retried with backoff. Every job is
    submitted once, runs once, and the run ends with rc 0."""
    wd = workflow
    snakefile(wd, FANOUT)
    (wd / "ran").mkdir()
    # each job its own sbatch (as one job array they would be one submission: no burst)
    sm = Snakemake(wd, "--multinode-submit-rate", "20", "--multinode-no-arrays", jobs=FAN_OUT)
    try:
        wait_for(lambda: len([r for r in records(wd) if r.get("jobid")]) >= 10, "10 submissions", 300)
        pid = daemon_pid(slurm_cluster, "slurmctld")
        assert pid is not None
        with daemon_outage(slurm_cluster):
            os.kill(pid, signal.SIGSTOP)  # the fault: a controller that hangs (overloaded, swapping)
            try:
                sm.wait_line("waiting for SLURM (sbatch)", timeout=120)
            finally:
                os.kill(pid, signal.SIGCONT)
        rc = sm.wait(600)
    finally:
        sm.stop()
    assert rc == 0, sm.text
    assert sorted(int(p.name) for p in (wd / "ran").iterdir()) == list(range(FAN_OUT))
    assert all(len(lines(p)) == 1 for p in (wd / "ran").iterdir())  # every job ran exactly once
    recs = records(wd)
    ids = {r["jobid"] for r in recs}
    assert len(recs) == FAN_OUT and len(ids) == FAN_OUT and None not in ids  # one submission per job
    assert jobs_from(slurm_cluster, wd) == ids  # SLURM holds no duplicate
    figures("frozen slurmctld during a burst", jobs=FAN_OUT, submissions=len(recs), duplicates=0)


# --- 9. a node's slurmd restarts under a running two-node job -------------------------------------------------------
# Every rank writes where and as which process it starts (start-<rank>: host pid relaunch, one line per start), then
# all_reduces until `release` exists (RELEASED); rank 0 counts the collectives (steps.txt, by rename).
RING = (
    RELEASED
    + """
import os, pathlib, socket, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, host = dist.get_rank(), socket.gethostname()
with open(f"start-{rank}", "a") as fh:
    fh.write(f"{host} {os.getpid()} {os.environ.get('MULTINODE_RELAUNCH', 'unset')}\\n")
step = 0
while not released("release"):
    step += 1
    if rank == 0:
        pathlib.Path("steps.tmp").write_text(str(step))
        os.replace("steps.tmp", "steps.txt")
    time.sleep(0.1)
dist.barrier()
if rank == 0:
    pathlib.Path(sys.argv[1]).write_text(os.environ["SLURM_JOB_ID"] + "\\n")
dist.destroy_process_group()
"""
)

RING_RULE = torchrun_rule("ring.py", "nodes=2, gpus=1")


def steps(wd: Path) -> int:
    text = (wd / "steps.txt").read_text().strip() if (wd / "steps.txt").exists() else ""
    return int(text) if text.isdigit() else 0


def test_a_slurmd_restart_on_a_node_of_a_running_two_node_job_is_no_failure(slurm_cluster, workflow):
    """slurmd restarted (SIGTERM by pid, started again as the sandbox starts it) on the non-head node of a running
    2-node torch job: the job's step lives in slurmstepd, which outlives its slurmd (proctrack/cgroup), and the new
    slurmd finds it again. The ranks go on, the job completes with exit 0, one submission, one run, no failure."""
    wd = workflow
    (wd / "ring.py").write_text(RING)
    snakefile(wd, RING_RULE)
    sm = Snakemake(wd)
    try:
        job, joblog = sm.submitted("train")
        wait_for(lambda: all((wd / f"start-{r}").exists() for r in (0, 1)) and steps(wd) >= 3, "both ranks", 300)
        starts = {r: (wd / f"start-{r}").read_text().split() for r in (0, 1)}
        (head, _, _), (other, other_pid, _) = starts[0], starts[1]
        assert head != other and any(alive(int(other_pid), c) for c in ("python3", "python")), starts
        with daemon_outage(slurm_cluster):  # a node without slurmd: a parallel session's `up` must not rebuild
            stopped, registered = restart_slurmd(slurm_cluster, other)  # the fault
        before = steps(wd)
        wait_for(lambda: steps(wd) >= before + 5, "the ranks' collectives going on after the restart", 120, sm.proc)
        assert squeue_states(slurm_cluster, [job]) == {job: "RUNNING"}
        (wd / "release").touch()
        rc = sm.wait()
    finally:
        sm.stop()
    assert rc == 0, sm.text
    assert not sm.matching("Error") and not sm.matching("failed") and not sm.matching("requeued ("), sm.text
    assert lines(wd / "out.txt") == [job]
    # every rank started once, as the same process on the same node, in the first launch: nothing was restarted
    assert {r: (wd / f"start-{r}").read_text().split() for r in (0, 1)} == starts
    assert [s[2] for s in starts.values()] == ["0", "0"], starts
    # one submission, one SLURM job, one run of it, COMPLETED; the job script's record agrees
    recs = records(wd)
    assert [r["jobid"] for r in recs] == [job], recs
    assert sacct_jobs(slurm_cluster, {recs[0]["job_name"]}, {job}) == {job: ["COMPLETED"]}
    files = JobFiles.from_log(joblog)
    runs = [json.loads(x) for x in files.runs.read_text().splitlines()]
    assert [(x["event"], x["restart"]) for x in runs] == [("start", 0), ("end", 0)] and runs[1]["exit"] == 0, runs
    assert files.restart_logs() == []
    log = joblog.read_text()
    assert "[multinode] exit 0," in log and "does not answer" not in log, log
    figures("slurmd restart", node=other, stop_to_registered_s=round(registered - stopped, 1), jobs_failed=0)
