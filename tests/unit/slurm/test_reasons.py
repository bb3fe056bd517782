"""SLURM's pending reasons in plain words, with what to do; the hopeless ones are failures, not waits."""

from __future__ import annotations

import pytest

from snakemake_executor_multinode.slurm import reasons
from snakemake_executor_multinode.slurm.client import JobState, parse_squeue
from snakemake_executor_multinode.watching.job_status import JobStatus
from tests.helpers import FakeClient

ISSUE_LIST = [
    "Resources", "Priority", "Dependency", "DependencyNeverSatisfied", "ReqNodeNotAvail", "PartitionTimeLimit",
    "QOSMaxGRESPerUser", "AssocGrpGRES", "QOSMaxJobsPerUserLimit", "BeginTime", "JobHeldUser", "JobHeldAdmin",
    "InvalidAccount", "InvalidQOS",
]  # fmt: skip


@pytest.mark.parametrize("reason", ISSUE_LIST)
def test_every_reason_users_meet_is_said_in_plain_words(reason):
    said = reasons.say(reason, "41")
    assert said.startswith(f"{reason}: ") and len(said) > len(reason) + 20
    assert "<job>" not in said


def test_squeues_decorated_reasons_are_understood_and_unknown_ones_passed_on():
    # squeue %r as recorded on the local cluster: a down node is named in parentheses
    assert reasons.explain("ReqNodeNotAvail, UnavailableNodes:node2") is reasons.REASONS["ReqNodeNotAvail"]
    assert reasons.say("SomethingNew") == "SomethingNew"
    assert "scontrol release 41" in reasons.say("JobHeldUser", "41")


@pytest.mark.parametrize(
    "line, hopeless",
    [
        ("41|PENDING|DependencyNeverSatisfied|", True),
        ("41|PENDING|InvalidAccount|", True),
        ("41|PENDING|Resources|", False),
        ("41|PENDING|JobHeldAdmin|", False),
    ],
)
def test_a_job_that_can_never_start_is_a_failure_not_a_wait(tmp_path, line, hopeless):
    out = JobStatus(tmp_path, FakeClient(parse_squeue(line))).poll(["41"], force_sweep=True)["41"]  # type: ignore[arg-type]
    assert out.finished is hopeless
    if hopeless:
        assert not out.success and "it can never start" in out.describe()
    else:
        assert out.state == JobState("41", "PENDING", "", line.split("|")[2], "")
