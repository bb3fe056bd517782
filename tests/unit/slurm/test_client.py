"""SLURM's commands through SlurmClient: transient failures are waited out, permanent ones fail at once, and a
submission whose reply was lost is found by its unique name instead of being submitted twice.

These use a recording fake of the commands (what they print is SLURM's own wording); the real outage is proven on
the local cluster in test_faults_cluster.py."""

from __future__ import annotations

import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from snakemake_executor_multinode.slurm.client import (
    RetryPolicy,
    SlurmClient,
    SubmitError,
    job_order,
    parse_sacct,
    queue_key,
)
from snakemake_executor_multinode.slurm.pacing import Pace
from tests.helpers import Clock, FakeSlurm

DOWN = "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"


def client(fake: FakeSlurm, clock: Clock, notes: list[str], total: float = 600) -> SlurmClient:
    return SlurmClient(
        runner=fake, retry=RetryPolicy(total_seconds=total), notify=notes.append, sleep=clock.sleep, clock=clock
    )


def test_a_controller_outage_is_waited_out_with_growing_jittered_delays_and_one_notice_a_minute():
    fake = FakeSlurm(sbatch=[(1, "", DOWN)] * 12 + [(0, "77\n", "")], squeue=[(1, "", DOWN)] * 11 + [(0, "", "")])
    clock, notes = Clock(), []
    assert client(fake, clock, notes).submit(Path("job.sh"), Path("."), name="mn-run-train-1") == "77"
    assert clock.sleeps[0] <= 1.0 and max(clock.sleeps) <= 30.0
    assert clock.sleeps[3] > clock.sleeps[0]  # exponential
    assert 1 <= len(notes) <= clock.now / 60 + 1 and "Unable to contact slurm controller" in notes[0]


def test_a_permanent_refusal_fails_at_once_with_sbatchs_message():
    fake = FakeSlurm(
        sbatch=[
            (
                1,
                "",
                "sbatch: error: Batch job submission failed: Invalid account or account/"
                "partition combination specified",
            )
        ]
    )
    clock = Clock()
    with pytest.raises(SubmitError, match="Invalid account"):
        client(fake, clock, []).submit(Path("job.sh"), Path("."), name="n")
    assert fake.count("sbatch") == 1 and clock.sleeps == []


def test_a_lost_reply_is_found_by_the_submissions_name_and_never_becomes_two_jobs():
    # sbatch reached the controller, which queued job 90, but the reply never came back.
    fake = FakeSlurm(
        sbatch=[(1, "", "sbatch: error: Socket timed out on send/recv operation")], squeue=[(0, "90\n", "")]
    )
    assert client(fake, Clock(), []).submit(Path("job.sh"), Path("."), name="mn-run-train-1") == "90"
    assert fake.count("sbatch") == 1
    assert ["squeue", "-h", "-t", "all", "-n", "mn-run-train-1", "-o", "%F"] in fake.calls


def test_an_outage_longer_than_the_budget_ends_with_a_clear_error():
    fake = FakeSlurm(sbatch=[(1, "", DOWN)], squeue=[(1, "", DOWN)])
    clock = Clock()
    with pytest.raises(SubmitError, match=r"SLURM did not answer for \d+ s \(the limit"):
        client(fake, clock, [], total=120).submit(Path("job.sh"), Path("."), name="n")
    assert 120 <= clock.now <= 120 + 30


def test_cancel_waits_out_an_outage_too():
    fake = FakeSlurm(scancel=[(1, "", "scancel: error: Unable to contact slurm controller")] * 3 + [(0, "", "")])
    client(fake, Clock(), []).cancel(["5", "6"])
    assert fake.count("scancel") == 4 and fake.calls[-1] == ["scancel", "5", "6"]


@pytest.mark.parametrize(
    "refusal",
    [
        "sbatch: error: Batch job submission failed: RPC rate limit exceeded, try again later",
        "sbatch: error: Batch job submission failed: Resource temporarily unavailable",
        "sbatch: error: Batch job submission failed: Unexpected message received",
    ],
)
def test_a_refusal_for_rate_or_load_is_retried_and_submits_the_job_once(refusal):
    # the refused sbatch queued nothing: the name lookup finds no job, and the next sbatch submits it
    fake = FakeSlurm(sbatch=[(1, "", refusal), (0, "91\n", "")], squeue=[(0, "", "")])
    clock = Clock()
    assert client(fake, clock, []).submit(Path("job.sh"), Path("."), name="mn-run-x-1") == "91"
    assert fake.count("sbatch") == 2 and fake.count("squeue") == 1 and len(clock.sleeps) == 1


def test_every_sbatch_call_takes_a_token_of_the_pace():
    fake = FakeSlurm(sbatch=[(0, "5\n", "")])
    clock = Clock()
    paced = SlurmClient(runner=fake, sleep=clock.sleep, clock=clock, pace=Pace(2, 1, clock=clock, sleep=clock.sleep))
    for _ in range(3):
        paced.submit(Path("job.sh"), Path("."))
    assert clock.now == pytest.approx(1.0)  # one at once, then one every half second


def test_an_array_element_is_known_by_its_array_and_task_in_sacct_and_squeue():
    # sacct: JobIDRaw is the element's own id, JobID <array>_<task>; squeue -O: a pending element's JobID is the array's
    sacct = "2126|RUNNING|0:0|None|node1|2122_3\n2130|COMPLETED|0:0|None|node2|2130\n"
    assert set(parse_sacct(sacct)) == {"2122_3", "2130"}
    assert queue_key({"JobID": "2122", "ArrayJobID": "2122", "ArrayTaskID": "25"}) == "2122_25"
    assert queue_key({"JobID": "2130", "ArrayJobID": "2130", "ArrayTaskID": "N/A"}) == "2130"
    assert sorted(["42", "41_10", "41_2", "41"], key=job_order) == ["41", "41_2", "41_10", "42"]


def test_an_arrays_pending_elements_are_asked_one_per_line():
    """squeue collapses an array's pending elements into one `<id>_[a-b]` line unless asked with -r: read collapsed,
    every element would be unknown and, after three sweeps, reported lost (seen with a 500-element array)."""

    def squeue(cmd, **kw):
        if cmd[0] == "sacct":
            return subprocess.CompletedProcess(cmd, 0, "", "")
        one_per_line = "-r" in cmd
        out = "50_0|PENDING|Resources|\n50_1|PENDING|Resources|\n" if one_per_line else "50_[0-1]|PENDING|Resources|\n"
        return subprocess.CompletedProcess(cmd, 0, out, "")

    states = SlurmClient(runner=squeue).query(["50_0", "50_1"])
    assert {j: s.state for j, s in states.items()} == {"50_0": "PENDING", "50_1": "PENDING"}


def test_a_pending_job_whose_accounting_record_names_no_reason_is_explained_by_slurmctld():
    """SLURM 24.11's sacct keeps no reason for a pending job (a held one reads "None", where 22.05's says
    JobHeldUser; docs/slurm-versions.md): the reason comes from squeue. A job sacct explains costs no squeue."""
    fake = FakeSlurm(
        sacct=[(0, "7|PENDING|0:0|None|None assigned|7\n8|PENDING|0:0|Resources|None assigned|8\n", "")],
        squeue=[(0, "7|PENDING|JobHeldUser|\n", "")],
    )
    states = SlurmClient(runner=fake).query(["7", "8"])
    assert {j: s.reason for j, s in states.items()} == {"7": "JobHeldUser", "8": "Resources"}
    assert [c[c.index("-j") + 1] for c in fake.calls if c[0] == "squeue"] == ["7"]
    explained = FakeSlurm(sacct=[(0, "8|PENDING|0:0|Resources|None assigned|8\n", "")], squeue=[(1, "", "x")])
    SlurmClient(runner=explained).query(["8"])
    assert explained.count("squeue") == 0


def test_the_elements_of_an_array_cancelled_before_its_tasks_started_take_the_arrays_record():
    """A pending array cancelled as a whole (scancel, Ctrl-C, a failed dependency) leaves no record per element: sacct
    and squeue know `6_[0-3,7]` only (both releases). Its elements are cancelled, not lost."""
    fake = FakeSlurm(
        sacct=[
            (0, "", ""),  # sacct -j 6_0,6_2,6_7,9_1: no element record
            (0, "6|CANCELLED by 0|0:0|JobHeldUser|None assigned|6_[0-3,7]\n9|COMPLETED|0:0|None|node1|9_1\n", ""),
        ],
        squeue=[(0, "", "")],
    )
    states = SlurmClient(runner=fake).query(["6_0", "6_2", "6_7", "9_1"])
    assert {j: s.state for j, s in states.items()} == {"6_0": "CANCELLED", "6_2": "CANCELLED", "6_7": "CANCELLED"}
    assert fake.calls[-1][fake.calls[-1].index("-j") + 1] == "6,9"  # one more sacct, by the arrays' ids
    # without accounting: squeue's record of the ended array, by its bare id (its task range is gone)
    off = FakeSlurm(
        sacct=[(1, "", "sacct: error: accounting off")], squeue=[(0, "", ""), (0, "6|CANCELLED|None\n", "")]
    )
    assert {j: s.state for j, s in SlurmClient(runner=off).query(["6_1"]).items()} == {"6_1": "CANCELLED"}
    # 22.05's sacct may name such a record by the bare array id: it stands for every task without a record
    bare = FakeSlurm(sacct=[(0, "", ""), (0, "8|CANCELLED by 0|0:0|None|None assigned|8\n", "")], squeue=[(0, "", "")])
    assert {j: s.state for j, s in SlurmClient(runner=bare).query(["8_0", "8_1"]).items()} == {
        "8_0": "CANCELLED", "8_1": "CANCELLED"
    }  # fmt: skip


# --- preemption: what squeue says of a running job SLURM preempts (measured on 22.05 and 24.11) ----------------------
@pytest.mark.parametrize("state", ["RUNNING", "SIGNALING"])  # 24.11 says SIGNALING while it delivers the SIGTERM
def test_a_running_job_with_a_preempt_time_is_being_preempted_until_its_grace_time_ends(state):
    fake = FakeSlurm(squeue=(0, f"57|{state}|2026-12-06T05:47:18|2026-12-06T05:47:28|\n", ""))
    found = SlurmClient(runner=fake).preemption("57")
    assert found is not None and found.grace_s == 10
    assert fake.calls[0][:7] == ["squeue", "-h", "-r", "-t", "all", "-j", "57"]
    assert "PreemptTime:|" in fake.calls[0][-1]


@pytest.mark.parametrize(
    "row",
    [
        "57|RUNNING|N/A|2026-12-06T06:11:30|",  # a scancel's or the time limit's SIGTERM: no PreemptTime
        "57|COMPLETING|2026-12-06T05:47:18|2026-12-06T06:11:30|",  # the grace time's end (or a cancel during it)
        "",  # gone
    ],
)
def test_a_job_without_a_preempt_time_or_no_longer_running_is_not_being_preempted(row):
    assert SlurmClient(runner=FakeSlurm(squeue=(0, row + "\n", ""))).preemption("57") is None


def test_the_jobs_started_on_some_nodes_come_from_slurmctld_and_accounting_oldest_first():
    squeue = (
        "60|2026-12-06T05:48:03|2026-12-06T05:47:18|node[1-2]|N/A|N/A|\n"
        "59|N/A|2026-12-06T05:47:10|(null)|N/A|N/A|\n"  # pending: never started
    )
    sacct = "58|2026-12-06T05:47:40|2026-12-06T05:40:00|node2\n60|2026-12-06T05:48:03|2026-12-06T05:47:18|node[1-2]\n"
    fake = FakeSlurm(squeue=(0, squeue, ""), sacct=(0, sacct, ""))
    since = datetime.fromisoformat("2026-12-06T05:47:30").timestamp()
    found = SlurmClient(runner=fake).started_on(["node2", "node1"], since)
    assert [(s.jobid, s.nodes) for s in found] == [("58", "node2"), ("60", "node[1-2]")]  # 59 never started
    assert fake.called("squeue")[0][:7] == ["squeue", "-h", "-a", "-t", "all", "-w", "node1,node2"]
    assert fake.called("sacct")[0][fake.called("sacct")[0].index("-S") + 1] == "2026-12-06T05:47:30"


def test_step_names_say_which_jobs_run_a_training_step():
    out = "41.batch|batch|\n41.0|torchrun|\n42.batch|batch|\n40_3.0|torchrun|\n"
    fake = FakeSlurm(squeue=(0, out, ""))
    assert SlurmClient(runner=fake).step_names(["42", "41", "40_3"]) == {
        "41": {"batch", "torchrun"}, "42": {"batch"}, "40_3": {"torchrun"},
    }  # fmt: skip
    assert fake.calls[0][:5] == ["squeue", "-h", "-s", "-j", "40_3,41,42"]
