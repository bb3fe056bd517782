"""One run as the adapter drives it (session.py; its submissions: submitting.py), with sbatch and squeue answered by
the test: plan, submit, watch, end. Every step leaves what the next run needs: the registry record, the job script,
the provenance record."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import (
    EXIT_MARKER,
    FAILED_NODE_MARKER,
    JobFiles,
    StateFolders,
    marker,
)
from snakemake_executor_multinode.planning.plan import RuleJob
from snakemake_executor_multinode.planning.request import RequestError
from snakemake_executor_multinode.session import Session, SubmitRefused
from snakemake_executor_multinode.watching import provenance
from snakemake_executor_multinode.watching.reattach import RunReason
from tests.helpers import FakeSlurm, fake_session


def Slurm(refuse: str = "") -> FakeSlurm:  # noqa: N802 (reads as the fake it builds)
    """sbatch hands out job ids from 41 (or refuses) and names its release; squeue and sacct know nothing."""
    ids = itertools.count(41)

    def sbatch(cmd: list[str]) -> tuple[int, str, str]:
        if cmd == ["sbatch", "--version"]:  # asked once, before the first plan
            return 0, "slurm-wlm 22.05.8\n", ""
        return (1, "", f"sbatch: error: {refuse}") if refuse else (0, f"{next(ids)}\n", "")

    return FakeSlurm(sbatch=sbatch)


def test_a_job_is_planned_submitted_watched_and_ended_with_its_records(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    s, said = fake_session(tmp_path, Slurm())
    job = RuleJob(
        "train", {"nodes": 2, "own_launcher": True}, "python train.py > out.txt", key="0.1", keep=("out.txt",),
        outputs=("out.txt",),
    )  # fmt: skip
    plan = s.plan(job)
    sub = s.submit(plan, ["out.txt"], RunReason())
    assert sub.jobid == "41" and Path(sub.script).read_text() == plan.script
    assert any(line.startswith("rule train: SLURM job 41 (2 node(s) x 0 GPU(s))") for line in said)
    assert plan.code_manifest.read_text().endswith(f"  {tmp_path / 'train.py'}\n")  # nothing frozen: checked
    [record] = s.registry.mine()
    assert (record.jobid, record.ended) == ("41", None)
    assert s.poll([(sub, "train")])["41"].finished is False  # no marker, SLURM silent: still running
    StateFolders(tmp_path).marker("41", EXIT_MARKER).write_text(f"0 0 {sub.job_name}\n")
    outcome = s.poll([(sub, "train")])["41"]
    ended = s.end(sub, outcome)
    assert ended.success and s.registry.mine()[0].ended == "success"
    rec = provenance.find(tmp_path, "out.txt")
    assert rec is not None and rec["rule"] == "train" and rec["code"]["snapshot"] is None
    assert json.dumps(rec).count(str(tmp_path / "train.py")) == 1  # its hash is recorded


def test_a_retry_avoids_the_node_a_job_failed_on_and_every_node_a_spare_replaced_in_it(tmp_path):
    s, _ = fake_session(tmp_path, Slurm())
    job = RuleJob(
        "train", {"nodes": 2, "spare_nodes": 1, "own_launcher": True}, "python t.py", key="0.1", outputs=("out.txt",)
    )
    sub = s.submit(s.plan(job), ["out.txt"], RunReason())
    replacements = JobFiles.from_log(sub.log).replacements
    replacements.parent.mkdir(parents=True, exist_ok=True)
    replacements.write_text(
        '{"event": "replaced", "node": "node2", "spare": "node3", "why": "exited with 1"}\n'
        '{"event": "replaced", "node": "node3", "spare": "node4", "why": "exited with 1"}\n'
    )
    StateFolders(tmp_path).marker("41", EXIT_MARKER).write_text(f"1 0 {sub.job_name}\n")
    StateFolders(tmp_path).marker("41", FAILED_NODE_MARKER).write_text("node4\n")
    assert not s.end(sub, s.poll([(sub, "train")])["41"]).success
    retry = s.plan(replace(job, attempt=2))
    assert "#SBATCH --exclude=node2,node3,node4" in retry.script


def test_the_session_refuses_a_multi_node_job_whose_command_leaves_nodes_idle(tmp_path):
    """The launch check runs in the session's plan (plan_job), beside the container check: the adapter only passes
    the facts."""
    s, _ = fake_session(tmp_path, Slurm())
    with pytest.raises(RequestError, match=r"^rule train: nodes=2, gpus=0 but its command never starts"):
        s.plan(RuleJob("train", {"nodes": 2}, "python train.py", key="0.1", shellcmd="python train.py"))
    with pytest.raises(RequestError, match=r"it is a script rule, so nothing starts `multinode torchrun`"):
        s.plan(RuleJob("train", {"nodes": 2}, "snakemake ...", key="0.2", kind="script rule"))
    torchrun = "multinode torchrun train.py"
    assert s.plan(RuleJob("train", {"nodes": 2}, torchrun, key="0.3", shellcmd=torchrun)).request.nodes == 2


def test_a_job_started_by_a_sites_own_launcher_gets_no_stall_watchdog(tmp_path):
    """The watchdog lives in `multinode torchrun`: a job of --multinode-launchers (accelerate, deepspeed, ...) has
    none, so its request and script say 0 instead of the adaptive timeout a `multinode torchrun` job gets."""
    s, _ = fake_session(tmp_path, Slurm())
    s.planner.launchers = ("bash",)  # --multinode-launchers=bash (Planner checks the name on PATH)
    own = "bash run_ranks.sh"
    plan = s.plan(RuleJob("train", {"nodes": 2}, own, key="0.1", shellcmd=own))
    assert plan.request.launcher.stall_timeout_s == 0 and "MULTINODE_STALL_TIMEOUT=0 " in plan.script
    torchrun = "multinode torchrun train.py"
    plan = s.plan(RuleJob("train", {"nodes": 2}, torchrun, key="0.2", shellcmd=torchrun))
    assert plan.request.launcher.stall_timeout_s is None and "MULTINODE_STALL_TIMEOUT=auto " in plan.script


def test_a_refused_submission_names_the_rule_and_keeps_the_script(tmp_path):
    s, _ = fake_session(tmp_path, Slurm(refuse="Invalid account or account/partition combination specified"))
    plan = s.plan(RuleJob("train", {"nodes": 2, "own_launcher": True}, "true", key="0.1", outputs=("out.txt",)))
    try:
        s.submit(plan, ["out.txt"], RunReason())
    except SubmitRefused as err:
        assert "rule 'train': sbatch refused the job: Invalid account" in str(err) and "script kept at" in str(err)
    else:
        raise AssertionError("no refusal")
    [record] = s.registry.mine()
    assert record.jobid is None  # recorded before sbatch: a Ctrl-C would look for it by name


def test_an_upstream_jobs_id_becomes_an_afterok_dependency(tmp_path):
    slurm = Slurm()
    s, _ = fake_session(tmp_path, slurm)
    first = s.plan(RuleJob("prep", {}, "true", key="0.1", outputs=("a.txt",)))
    s.submit(first, ["a.txt"], RunReason())
    second = s.plan(RuleJob("train", {}, "true", key="1.1", outputs=("b.txt",)))
    s.submit(second, ["b.txt"], RunReason(), upstream=["a.txt"])
    sbatch = [c for c in slurm.calls if c[0] == "sbatch" and "--parsable" in c]
    assert "--dependency=afterok:41" in sbatch[1] and "--kill-on-invalid-dep=yes" in sbatch[1]


# --- jobs handed over together: job arrays ---------------------------------------------------------------------
def shards(s: Session, n: int, rule: str = "shard", resources: dict | None = None, start: int = 0) -> list:
    return [
        (s.plan(RuleJob(rule, resources or {}, f"echo {i} > s{i}.txt", wildcards={"i": i}, key=f"{i}.1",
                        outputs=(f"s{i}.txt",))), [f"s{i}.txt"], RunReason())
        for i in range(start, start + n)
    ]  # fmt: skip


def test_single_node_jobs_of_one_rule_with_the_same_resources_go_as_one_job_array(tmp_path):
    slurm = Slurm()
    s, said = fake_session(tmp_path, slurm)
    jobs = shards(s, 3) + shards(s, 1, rule="other") + shards(s, 2, resources={"mem_mb": 2000}, start=10)
    jobs += [
        (
            s.plan(RuleJob("train", {"nodes": 2, "own_launcher": True}, "true", key="t.1", outputs=("m.txt",))),
            ["m.txt"],
            RunReason(),
        )
    ]
    subs = s.submit_many(jobs)
    # the 2-node job goes first (on its own); then the groups, in the order their first job came
    assert [sub.jobid for sub in subs] == ["42_0", "42_1", "42_2", "43", "44_0", "44_1", "41"]
    submitted = [c for c in slurm.calls if c[0] == "sbatch" and c != ["sbatch", "--version"]]
    assert len(submitted) == 4  # two arrays, a job of its own, the 2-node job
    array = (tmp_path / subs[0].log).parent.parent / f"{subs[0].array}.sh"
    text = array.read_text()
    assert "#SBATCH --array=0-2" in text and "#SBATCH --output=/dev/null" in text
    for i, sub in enumerate(subs[:3]):
        element = Path(sub.script)  # <array>_<i>.attempt1.sh, the same file the array's script runs by its name
        assert element.name == f"42_{i}.attempt1.sh" and element.samefile(element.with_name(f"{sub.job_name}.sh"))
        assert f'{i}) export MULTINODE_ARRAY_KEY="${{SLURM_ARRAY_JOB_ID}}_{i}"; exec bash' in text
        assert Path(sub.log).name == f"42_{i}.attempt1.log" and sub.array == subs[0].array
    assert {r.jobid for r in s.registry.mine()} == {sub.jobid for sub in subs}  # a record per element
    assert subs[3].array == "" and subs[6].array == ""
    assert any("SLURM job array 42 of 3 jobs" in line for line in said)


def test_with_no_arrays_every_job_goes_on_its_own(tmp_path):
    slurm = Slurm()
    s, _ = fake_session(tmp_path, slurm, no_arrays=True)
    assert [sub.jobid for sub in s.submit_many(shards(s, 3))] == ["41", "42", "43"]


def test_a_group_larger_than_slurms_array_limit_goes_as_several_arrays(tmp_path, monkeypatch):
    monkeypatch.setattr("snakemake_executor_multinode.submitting.MAX_ARRAY", 2)
    s, _ = fake_session(tmp_path, Slurm())
    assert [sub.jobid for sub in s.submit_many(shards(s, 5))] == ["41_0", "41_1", "42_0", "42_1", "43"]


def test_an_array_elements_end_is_read_from_its_own_marker(tmp_path):
    s, _ = fake_session(tmp_path, Slurm())
    subs = s.submit_many(shards(s, 2))
    state = StateFolders(tmp_path).state
    marker(state, "41_1", EXIT_MARKER).write_text(f"0 0 {subs[1].job_name}\n")
    outcomes = s.poll([(sub, "shard") for sub in subs])
    assert outcomes["41_1"].success and not outcomes["41_0"].finished


def test_a_pending_job_is_explained_once_and_only_once_the_scheduler_has_said_why(tmp_path):
    """A job just submitted reads reason "None" until the scheduler looks at it (seen under load): nothing is said
    then, and the real reason is said once it comes."""
    from snakemake_executor_multinode.slurm.client import JobState
    from snakemake_executor_multinode.watching.job_status import Outcome

    s, said = fake_session(tmp_path, Slurm(), pending_notice_seconds=0)
    sub = s.submit(s.plan(RuleJob("held", {}, "true", key="0.1", outputs=("h.txt",))), ["h.txt"], RunReason())
    for reason in ("None", "(null)", "JobHeldUser", "JobHeldUser"):
        s.watch.explain_wait(sub, "held", Outcome("41", False, state=JobState("41", "PENDING", reason=reason)))
    waits = [line for line in said if "is waiting" in line]
    assert waits == [
        "SLURM job 41 (held) is waiting: JobHeldUser: held by you (scontrol hold); `scontrol release 41` lets it start"
    ]


def test_slurm_extra_is_read_with_the_options_of_the_release_the_session_finds(tmp_path):
    """sbatch --version is asked once, before the first plan: on 22.05 a 24.11 option is refused, naming it."""
    s, _ = fake_session(tmp_path, Slurm())
    with pytest.raises(RequestError, match=r"--segment is not an sbatch option \(sbatch 22\.05\.8\)"):
        s.plan(RuleJob("train", {"slurm_extra": "--segment=2"}, "true", key="0.1", outputs=("out.txt",)))
    s.plan(RuleJob("train", {}, "true", key="0.2", outputs=("out2.txt",)))
    assert s.slurm_version == "22.05.8" and s.client.runner.calls.count(["sbatch", "--version"]) == 1


def test_ctrl_c_asks_running_trainings_to_checkpoint_and_cancels_everything_else_at_once(tmp_path):
    """Snakemake's first Ctrl-C (cancel_all): job 41 runs a training step, 42 a plain command, 43 waits. 42 and 43
    are cancelled at once; 41 gets its cancel marker and SIGTERM to its steps, and is cancelled only if it has not
    ended within --multinode-cancel-checkpoint-seconds."""
    from snakemake_executor_multinode.contract.jobfiles import CANCEL_MARKER, marker

    steps = "41.batch|batch|\n41.0|torchrun|\n42.batch|batch|\n"
    ended = "41|COMPLETED|None|node1|0|N/A|N/A|\n"

    def squeue(cmd: list[str]) -> tuple[int, str, str]:
        return (0, steps, "") if "-s" in cmd else (0, ended, "")

    s, said = fake_session(tmp_path, FakeSlurm(squeue=squeue))
    s.cancel_all(["41", "42", "43"])
    fake = s.client.runner
    assert isinstance(fake, FakeSlurm)
    assert fake.called("scancel") == [["scancel", "42", "43"], ["scancel", "--signal=TERM", "41"]]
    assert marker(s.folders.state, "41", CANCEL_MARKER).read_text().startswith("Snakemake's Ctrl-C, ")
    assert any("asked SLURM job(s) 41 to checkpoint" in line and "(Ctrl-C again: at once)" in line for line in said)


def test_with_the_setting_at_0_ctrl_c_cancels_every_job_at_once(tmp_path):
    fake = FakeSlurm()
    s, _ = fake_session(tmp_path, fake, cancel_checkpoint_seconds=0)
    s.cancel_all(["41", "42"])
    assert fake.called("scancel") == [["scancel", "41", "42"]] and not fake.called("squeue", "-h", "-s")
