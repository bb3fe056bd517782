"""Completion markers report a finished job at once; a slow batched sweep catches jobs that die without one."""

from __future__ import annotations

import json
import subprocess

from snakemake_executor_multinode.slurm.client import JobState, SlurmClient, parse_sacct
from snakemake_executor_multinode.watching.job_status import COMPLETING_WAIT_S, JobStatus
from tests.helpers import Clock, FakeClient


def test_success_marker_needs_no_slurm_query(tmp_path):
    client, clock = FakeClient(), Clock()
    job_status = JobStatus(tmp_path, client, sweep_seconds=30, clock=clock)
    (tmp_path / "7.exit").write_text("0\n")
    out = job_status.poll(["7", "8"])
    assert out["7"].finished and out["7"].success
    assert not out["8"].finished
    assert client.queries == []


def test_failure_marker_asks_slurm_once_for_state_and_reason(tmp_path):
    client = FakeClient({"7": JobState("7", "FAILED", "3:0", "NonZeroExitCode", "node[1-2]")})
    job_status = JobStatus(tmp_path, client, clock=Clock())
    (tmp_path / "7.exit").write_text("3\n")
    (tmp_path / "7.failed-node").write_text("node2\n")
    out = job_status.poll(["7"])["7"]
    assert out.finished and not out.success
    text = out.describe()
    assert "SLURM state FAILED" in text and "reason NonZeroExitCode" in text and "failing node node2" in text


def test_sweep_is_rate_limited_and_catches_jobs_without_marker(tmp_path):
    clock = Clock()
    client = FakeClient({"9": JobState("9", "CANCELLED"), "10": JobState("10", "RUNNING")})
    job_status = JobStatus(tmp_path, client, sweep_seconds=30, clock=clock)
    assert not job_status.poll(["9", "10"])["9"].finished
    clock.now = 10
    job_status.poll(["9", "10"])
    assert client.queries == []  # no sweep before 30 s
    clock.now = 31
    out = job_status.poll(["9", "10"])
    assert client.queries == [["10", "9"]]  # one batched query for all
    assert out["9"].finished and not out["9"].success and not out["10"].finished


def test_a_failing_query_never_fails_a_job(tmp_path):
    clock = Clock()
    job_status = JobStatus(tmp_path, FakeClient(fail=True), sweep_seconds=1, clock=clock)
    clock.now = 5
    out = job_status.poll(["1"])
    assert not out["1"].finished and job_status.query_failures == 1


def test_squeue_answers_when_accounting_is_off():
    calls = []

    def runner(cmd, **kw):
        calls.append(cmd[0])
        if cmd[0] == "sacct":
            return subprocess.CompletedProcess(cmd, 1, "", "Slurm accounting storage is disabled")
        return subprocess.CompletedProcess(cmd, 0, "5|TIMEOUT|TimeLimit|node1\n", "")

    states = SlurmClient(runner=runner).query(["5"])
    assert calls == ["sacct", "squeue"] and states["5"].state == "TIMEOUT"


def test_sacct_parsing_takes_the_first_word_and_the_last_row():
    text = "12|REQUEUED|0:0|None|node1\n12|CANCELLED by 0|0:15|None|node1\n13|COMPLETED|0:0|None|node2\n"
    states = parse_sacct(text)
    assert states["12"].state == "CANCELLED" and states["13"].succeeded


def ended_run(
    tmp_path, job: str, live: JobState, exit_line: str, clock: Clock | None = None
) -> tuple[FakeClient, JobStatus]:
    """Job `job` ran on node1, its run wrote the exit marker `exit_line` ("<code> <restart>"); squeue shows `live`."""
    client = FakeClient({job: JobState(job, "RUNNING", "0:0", "None", "node1")})
    client.live_states[job] = live
    (tmp_path / f"{job}.exit").write_text(exit_line + "\n")
    return client, JobStatus(tmp_path, client, sweep_seconds=30, clock=clock or Clock())


def test_a_requeued_job_is_not_a_failure_and_its_last_run_reports_once(tmp_path):
    # `scontrol requeue` or preemption: the run ends with 143 (SIGTERM), SLURM holds the job and runs it again.
    client, job_status = ended_run(tmp_path, "9", JobState("9", "PENDING", "", "BeginTime", "", restarts=1), "143 0")
    first = job_status.poll(["9"])["9"]
    assert not first.finished and first.note == (
        "requeued (the run ended with exit 143; SLURM state PENDING), restart 1"
    )
    client.states["9"] = JobState("9", "RUNNING", "0:0", "None", "node2")
    again = job_status.poll(["9"])["9"]
    assert not again.finished and again.note is None  # the old run's marker is not read twice
    (tmp_path / "9.exit").write_text("0 1\n")  # the rerun's own marker
    last = job_status.poll(["9"])["9"]
    assert last.finished and last.success


def test_a_requeue_after_a_preemption_says_so_and_whether_the_run_checkpointed(tmp_path):
    _, job_status = ended_run(tmp_path, "9", JobState("9", "PENDING", "", "BeginTime", "", restarts=1), "85 0")
    notice = {"event": "preempted", "time": "2026-12-06T05:51:59+00:00", "ends": "2026-12-06T05:52:19+00:00",
              "grace_s": 20}  # fmt: skip
    (tmp_path / "9.preempt-notice").write_text(json.dumps(notice) + "\n")
    note = job_status.poll(["9"])["9"].note
    assert note is not None and note.startswith("requeued (preempted: SLURM's preemption SIGTERM at ")
    assert ", grace time 20 s, to " in note and note.endswith("; checkpointed), restart 1"), note


def test_a_failed_run_whose_marker_came_before_slurmctld_saw_the_end_is_not_yet_a_failure(tmp_path):
    # The EXIT trap wrote "1 0" while slurmctld still says RUNNING for this run (restart 0): not a requeue, not yet
    # a failure either (a preemption's requeue could still come).
    client, job_status = ended_run(tmp_path, "6", JobState("6", "RUNNING", "", "None", "node1", restarts=0), "1 0")
    waiting = job_status.poll(["6"])["6"]
    assert not waiting.finished and waiting.note is None
    client.live_states["6"] = JobState("6", "FAILED", "", "NonZeroExitCode", "node1", restarts=0)
    client.states["6"] = JobState("6", "FAILED", "1:0", "None", "node1")
    ended = job_status.poll(["6"])["6"]
    assert ended.finished and not ended.success and "job script exit 1" in ended.describe()


COMPLETING = JobState("6", "COMPLETING", "", "None", "node1", restarts=0)


def test_a_run_ended_by_sigterm_is_a_failure_once_slurm_names_its_end(tmp_path):
    # scancel: the job's exit marker (143) comes a moment before slurmctld names how it ended (COMPLETING, then
    # CANCELLED); the failure is reported with that name
    clock = Clock()
    client, job_status = ended_run(tmp_path, "6", COMPLETING, "143 0", clock)
    assert not job_status.poll(["6"])["6"].finished
    clock.now += 0.5
    client.live_states["6"] = JobState("6", "CANCELLED", "0:15", "None", "node1", restarts=0)
    ended = job_status.poll(["6"])["6"]
    assert ended.finished and not ended.success and "SLURM state CANCELLED" in ended.describe()


def test_a_run_ended_by_sigterm_and_completing_for_long_is_a_failure_after_a_short_wait(tmp_path):
    clock = Clock()
    client, job_status = ended_run(tmp_path, "6", COMPLETING, "143 0", clock)
    assert not job_status.poll(["6"])["6"].finished
    clock.now += COMPLETING_WAIT_S
    assert job_status.poll(["6"])["6"].finished


def test_a_failed_run_completing_with_its_own_restart_count_is_a_failure_at_once(tmp_path):
    # A dead node keeps the job COMPLETING until SlurmdTimeout; a requeue would have raised the restart count.
    client, job_status = ended_run(tmp_path, "6", JobState("6", "COMPLETING", "", "None", "node2", restarts=0), "1 0")
    (tmp_path / "6.failed-node").write_text("node2\n")
    ended = job_status.poll(["6"])["6"]
    assert ended.finished and not ended.success and ended.failed_node == "node2"
    client.live_states["6"] = JobState("6", "COMPLETING", "", "None", "node2", restarts=None)  # count unknown: wait
    (tmp_path / "6.exit").write_text("1 0\n")
    assert not JobStatus(tmp_path, client, sweep_seconds=30, clock=Clock()).poll(["6"])["6"].finished


def test_a_failed_run_whose_job_slurm_no_longer_holds_is_a_failure(tmp_path):
    client = FakeClient({"4": JobState("4", "CANCELLED", "0:15", "None", "node1")})
    job_status = JobStatus(tmp_path, client, sweep_seconds=30, clock=Clock())
    (tmp_path / "4.exit").write_text("143 0\n")
    out = job_status.poll(["4"])["4"]
    assert out.finished and not out.success and "SLURM state CANCELLED" in out.describe()


def test_a_failed_marker_waits_while_slurm_cannot_be_asked(tmp_path):
    job_status = JobStatus(tmp_path, FakeClient(fail=True), sweep_seconds=30, clock=Clock())
    (tmp_path / "5.exit").write_text("1 0\n")
    assert not job_status.poll(["5"])["5"].finished  # never a failure read from an unanswered query


def test_the_jobs_own_requeue_after_a_checkpoint_is_reported_once_per_restart(tmp_path):
    job_status = JobStatus(tmp_path, FakeClient(), sweep_seconds=30, clock=Clock())
    (tmp_path / "3.requeued").write_text("1 checkpointed before the time limit\n")
    assert job_status.poll(["3"])["3"].note == "requeued (checkpointed before the time limit), restart 1"
    assert job_status.poll(["3"])["3"].note is None
    (tmp_path / "3.requeued").write_text("2 checkpointed before the time limit\n")
    assert job_status.poll(["3"])["3"].note.endswith("restart 2")


def test_a_job_slurm_has_no_record_of_fails_after_a_few_sweeps_instead_of_hanging(tmp_path):
    # slurmctld killed within a second of a submission loses the job from its saved state; sacct never heard of it.
    client, clock = FakeClient(), Clock()
    job_status = JobStatus(tmp_path, client, sweep_seconds=30, clock=clock)
    for _ in range(2):
        clock.now += 30
        assert not job_status.poll(["12"])["12"].finished  # briefly unknown is normal (slurmdbd lags)
    clock.now += 30
    out = job_status.poll(["12"])["12"]
    assert out.finished and not out.success and "SLURM has no record of the job" in out.describe()


def test_an_unanswered_query_never_counts_towards_a_lost_job(tmp_path):
    client, clock = FakeClient(fail=True), Clock()
    job_status = JobStatus(tmp_path, client, sweep_seconds=30, clock=clock)
    for _ in range(5):
        clock.now += 30
        assert not job_status.poll(["12"])["12"].finished


def test_an_exit_marker_counts_only_for_the_submission_that_wrote_it(tmp_path):
    """A rebuilt cluster counts job ids from 1 again: the marker an earlier job 7 left is not the new job 7's."""
    client = FakeClient({"7": JobState("7", "RUNNING")})
    job_status = JobStatus(tmp_path, client, clock=Clock())
    job_status.expect("7", "mn-new-run-work")
    (tmp_path / "7.exit").write_text("0 0 mn-old-run-work\n")
    assert not job_status.poll(["7"], force_sweep=True)["7"].finished
    (tmp_path / "7.exit").write_text("0 0 mn-new-run-work\n")
    assert job_status.poll(["7"])["7"].success


def test_a_failed_run_waits_for_slurmctlds_word_before_it_is_a_failure(tmp_path):
    """Under load squeue may time out while sacct does not know the job yet: a requeue cannot be told from a failure
    then, so the job is asked about again, and reported with SLURM's state once slurmctld answers."""
    client = FakeClient({}, live={})
    job_status = JobStatus(tmp_path, client, clock=Clock())
    (tmp_path / "7.exit").write_text("3 0\n")
    client.fail_live = True
    assert not job_status.poll(["7"])["7"].finished
    client.fail_live = False
    client.live_states["7"] = JobState("7", "FAILED", restarts=0)
    out = job_status.poll(["7"])["7"]
    assert out.finished and not out.success and "SLURM state FAILED" in out.describe()


def test_a_crash_loop_the_job_script_ended_is_reported_with_its_runs_and_last_error(tmp_path):
    client = FakeClient({"9": JobState("9", "FAILED", "88:0", "NonZeroExitCode", "node1")})
    client.live_states["9"] = JobState("9", "FAILED", "88:0", "NonZeroExitCode", "node1", restarts=2)
    job_status = JobStatus(tmp_path, client, clock=Clock())
    (tmp_path / "9.exit").write_text("88 2\n")
    (tmp_path / "9.crashes").write_text("3 3\n")
    out = job_status.poll(["9"])["9"]
    assert out.finished and not out.success
    assert "a crash loop: 3 runs in a row failed soon after their start, the last with exit 3" in out.describe()


def test_a_preempted_run_in_accounting_is_no_end_while_slurmctld_holds_the_job(tmp_path):
    """PreemptMode=REQUEUE: sacct says PREEMPTED for the run SLURM just ended, while the job script (its training
    stopped by the grace time's end) has not written its marker yet; slurmctld holds the job (requeued): no failure.
    Under CANCEL slurmctld says PREEMPTED too: the job has ended."""
    client, clock = FakeClient({"5": JobState("5", "PREEMPTED", "0:0", "None", "node[1-2]")}), Clock()
    client.live_states["5"] = JobState("5", "PENDING", "", "BeginTime", "", restarts=1)
    job_status = JobStatus(tmp_path, client, sweep_seconds=30, clock=clock)
    held = job_status.poll(["5"], force_sweep=True)["5"]
    assert not held.finished and held.state is not None and held.state.state == "PENDING"
    client.live_states["5"] = JobState("5", "PREEMPTED", "", "None", "node[1-2]", restarts=0)  # CANCEL: ended
    ended = job_status.poll(["5"], force_sweep=True)["5"]
    assert ended.finished and not ended.success and "SLURM state PREEMPTED" in ended.describe()
