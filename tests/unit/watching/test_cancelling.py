"""A cancel that checkpoints first (watching/cancelling.py): `multinode cancel --checkpoint` and Snakemake's first
Ctrl-C. SLURM is a recording fake here; the real cancel is in tests/cluster/test_preemption_cluster.py."""

from __future__ import annotations

import pytest

from snakemake_executor_multinode.contract.jobfiles import CANCEL_MARKER, EXIT_MARKER, marker
from snakemake_executor_multinode.slurm.client import SlurmClient
from snakemake_executor_multinode.watching import cancelling
from tests.helpers import Clock, FakeSlurm

STEPS = "41.batch|batch|\n41.0|torchrun|\n42.batch|batch|\n"  # 41 trains, 42 runs a plain command


def fake_squeue(running: set[str]):
    """squeue: the jobs' steps (-s), or their states (-O), each job RUNNING while in `running`."""

    def answer(cmd: list[str]) -> tuple[int, str, str]:
        if "-s" in cmd:
            return 0, STEPS, ""
        ids = cmd[cmd.index("-j") + 1].split(",")
        rows = [f"{j}|{'RUNNING' if j in running else 'COMPLETED'}|None|node1|0|N/A|N/A|" for j in ids]
        return 0, "\n".join(rows) + "\n", ""

    return answer


def test_only_a_running_training_is_asked_to_checkpoint(tmp_path):
    fake = FakeSlurm(squeue=fake_squeue({"41", "42"}))
    assert cancelling.training(SlurmClient(runner=fake), ["41", "42", "43"]) == {"41"}


def test_the_training_gets_the_marker_then_sigterm_and_the_canceller_waits_for_its_end(tmp_path):
    running = {"41"}
    clock, said = Clock(), []
    fake = FakeSlurm(squeue=fake_squeue(running))

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 3:  # the training saved and the job ended with 85
            running.discard("41")
            marker(tmp_path, "41", EXIT_MARKER).write_text("85 0 mn-x\n")

    done = cancelling.checkpoint_then_cancel(
        SlurmClient(runner=fake), tmp_path, ["41"], 120, said.append, "multinode cancel --checkpoint",
        clock=clock, sleep=sleep,
    )  # fmt: skip
    assert marker(tmp_path, "41", CANCEL_MARKER).read_text().startswith("multinode cancel --checkpoint, ")
    assert fake.called("scancel") == [["scancel", "--signal=TERM", "41"]]  # the steps only: no plain scancel
    assert (done.checkpointed, done.ended, done.cancelled) == (["41"], [], [])
    assert said == ["asked SLURM job(s) 41 to checkpoint; waiting up to 120 s for them to end, then cancelling what "
                    "is left"]  # fmt: skip


def test_a_training_that_does_not_end_within_the_wait_is_cancelled(tmp_path):
    clock, said = Clock(), []
    fake = FakeSlurm(squeue=fake_squeue({"41"}))
    done = cancelling.checkpoint_then_cancel(
        SlurmClient(runner=fake), tmp_path, ["41"], 10, said.append, "x", clock=clock, sleep=clock.sleep
    )
    assert fake.called("scancel") == [["scancel", "--signal=TERM", "41"], ["scancel", "41"]]
    assert done.cancelled == ["41"] and 10 <= clock.now <= 10 + cancelling.POLL_S
    assert said[-1] == "SLURM job(s) 41 did not end within 10 s: cancelled"


def test_a_second_interrupt_during_the_wait_cancels_at_once_and_is_raised_again(tmp_path):
    fake = FakeSlurm(squeue=fake_squeue({"41"}))

    def interrupted(_seconds: float) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cancelling.checkpoint_then_cancel(
            SlurmClient(runner=fake), tmp_path, ["41"], 120, lambda _: None, "x", clock=Clock(), sleep=interrupted
        )
    assert fake.called("scancel") == [["scancel", "--signal=TERM", "41"], ["scancel", "41"]]


def test_a_marker_that_cannot_be_written_cancels_the_job_at_once(tmp_path):
    said: list[str] = []
    fake = FakeSlurm(squeue=fake_squeue({"41"}))
    done = cancelling.checkpoint_then_cancel(
        SlurmClient(runner=fake),
        tmp_path / "missing",
        ["41"],
        120,
        said.append,
        "x",
        clock=Clock(),
        sleep=lambda _: None,
    )
    assert fake.called("scancel") == [["scancel", "41"]] and done.cancelled == ["41"]
    assert said[0].startswith("SLURM job 41: cannot write ") and said[0].endswith("; cancelled without a checkpoint")
