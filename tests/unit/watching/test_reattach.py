"""When a rerun adopts an earlier run's SLURM job, and when it submits anew (reattach.py): each rule of the decision,
on a real registry folder, with SLURM's answers and the exit markers given by the test."""

from __future__ import annotations

from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import EXIT_MARKER, StateFolders
from snakemake_executor_multinode.slurm.client import JobState
from snakemake_executor_multinode.watching.job_status import JobStatus
from snakemake_executor_multinode.watching.reattach import RunReason, decide
from snakemake_executor_multinode.watching.registry import Registry, Submission
from tests.helpers import FakeClient

OUTPUTS = ("out.txt",)


def slurm(state: str | None = None, name: str = "mn-old-work") -> FakeClient:
    """Job 41 in `state`, as accounting and slurmctld say, under the job name `name`."""
    states = {"41": JobState("41", state)} if state else {}
    return FakeClient(states, live=states, names={"41": name})


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A workflow folder where run `old` submitted job 41 for out.txt with fingerprint f1."""
    Registry(tmp_path, "old").record(
        Submission("old", "work", {}, OUTPUTS, "mn-old-work", 1, "s.sh", "l.log", "41", fingerprint="f1")
    )
    StateFolders(tmp_path).state.mkdir(parents=True)
    return tmp_path


NOTHING = RunReason()  # Snakemake runs the job for a missing output only


def judge(folder: Path, client: FakeClient, reason: RunReason = NOTHING, fingerprint: str = "f1", **kw):
    job_status = JobStatus(StateFolders(folder).state, client)  # type: ignore[arg-type]
    return decide("work", OUTPUTS, fingerprint, reason, Registry(folder, "new"), job_status, folder, **kw)


def finished(folder: Path, code: int = 0) -> None:
    StateFolders(folder).marker("41", EXIT_MARKER).write_text(f"{code} 0 mn-old-work\n")


def test_a_running_job_of_a_killed_run_is_adopted(folder):
    verdict = judge(folder, slurm("RUNNING"))
    assert verdict.adopt is not None and verdict.adopt.jobid == "41" and verdict.adopt.adopted_from == "old"
    assert verdict.message.startswith("rule work: reattached to SLURM job 41 (running, submitted")


def test_a_job_whose_end_a_run_reported_is_never_adopted(folder):
    registry = Registry(folder, "old")
    registry.ended(registry.mine()[0], "success")
    verdict = judge(folder, slurm("COMPLETED"), RunReason(incomplete_jobids=("41",)))
    assert verdict.adopt is None and "its end (success) was reported" in verdict.message


@pytest.mark.parametrize(
    "reason, said",
    [
        (RunReason(forced=True), "the job is forced"),
        (RunReason(changed=("changed params",)), "Snakemake found changed params"),
    ],
)
def test_a_forced_or_changed_job_runs_anew_and_a_still_running_old_one_is_named(folder, reason, said):
    verdict = judge(folder, slurm("RUNNING"), reason)
    assert verdict.adopt is None and verdict.warning
    assert said in verdict.message and "still running" in verdict.message and "scancel 41" in verdict.message


def test_another_job_script_runs_anew(folder):
    verdict = judge(folder, slurm("PENDING"), fingerprint="f2")
    assert verdict.adopt is None and "its job script differs" in verdict.message


def test_a_job_id_that_slurm_gave_to_another_job_is_not_adopted(folder):
    verdict = judge(folder, slurm("RUNNING", name="someone-else"))
    assert verdict.adopt is None and "its id now belongs to job 'someone-else'" in verdict.message


def test_a_job_that_finished_unseen_is_adopted_only_when_snakemake_asks_for_exactly_it(folder):
    finished(folder)
    (folder / "out.txt").write_text("done\n")
    assert judge(folder, slurm("COMPLETED")).adopt is None  # not --rerun-incomplete for it
    assert judge(folder, slurm("COMPLETED"), RunReason(incomplete_jobids=("40",))).adopt is None
    verdict = judge(folder, slurm("COMPLETED"), RunReason(incomplete_jobids=("41",)))
    assert verdict.adopt is not None and "finished while Snakemake was away" in verdict.message


def test_a_job_that_finished_unseen_is_not_adopted_when_its_output_is_gone_or_it_failed(folder):
    finished(folder)
    gone = judge(folder, slurm("COMPLETED"), RunReason(incomplete_jobids=("41",)))
    assert gone.adopt is None and "out.txt is missing" in gone.message
    (folder / "out.txt").write_text("half\n")
    finished(folder, code=1)
    failed = judge(folder, slurm("FAILED"), RunReason(incomplete_jobids=("41",)))
    assert failed.adopt is None and "without success" in failed.message


def test_no_reattach_and_no_earlier_submission_say_nothing(folder):
    assert judge(folder, slurm("RUNNING"), enabled=False).message is None
    job_status = JobStatus(folder, slurm())  # type: ignore[arg-type]
    fresh = decide("work", ("other.txt",), "f1", RunReason(), Registry(folder, "new"), job_status, folder)
    assert fresh.adopt is None and fresh.message is None
