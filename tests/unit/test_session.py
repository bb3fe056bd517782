"""One run as the adapter drives it (session.py), with sbatch and squeue answered by the test: plan, submit, watch,
end. Every step leaves what the next run needs: the registry record, the job script, the provenance record."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from snakemake_executor_multinode import protocol
from snakemake_executor_multinode.planning.plan import RuleJob
from snakemake_executor_multinode.planning.settings import Settings
from snakemake_executor_multinode.session import Session, SubmitRefused
from snakemake_executor_multinode.slurm.client import SlurmClient
from snakemake_executor_multinode.watching import provenance
from snakemake_executor_multinode.watching.reattach import RunReason


class Slurm:
    """sbatch hands out job ids from 41 (or refuses); squeue and sacct know nothing."""

    def __init__(self, refuse: str = "") -> None:
        self.refuse, self.next, self.calls = refuse, 41, []

    def __call__(self, cmd, **kw):
        self.calls.append(cmd)
        if cmd[0] == "sbatch":
            if self.refuse:
                return subprocess.CompletedProcess(cmd, 1, "", f"sbatch: error: {self.refuse}")
            self.next += 1
            return subprocess.CompletedProcess(cmd, 0, f"{self.next - 1}\n", "")
        return subprocess.CompletedProcess(cmd, 0, "", "")


def session(tmp_path: Path, slurm: Slurm) -> tuple[Session, list[str]]:
    said: list[str] = []
    s = Session(Settings(snapshot="off"), tmp_path, said.append, said.append, run_id="run1")
    s.client = s.tracker.client = SlurmClient(runner=slurm)
    return s, said


def test_a_job_is_planned_submitted_watched_and_ended_with_its_records(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    s, said = session(tmp_path, Slurm())
    job = RuleJob("train", {"nodes": 2}, "python train.py > out.txt", key="0.1", keep=("out.txt",))
    plan = s.plan(job, ["out.txt"])
    sub = s.submit(plan, ["out.txt"], RunReason())
    assert sub.jobid == "41" and Path(sub.script).read_text() == plan.script
    assert any(line.startswith("rule train: SLURM job 41 (2 node(s) x 0 GPU(s))") for line in said)
    assert plan.code_manifest.read_text().endswith(f"  {tmp_path / 'train.py'}\n")  # nothing frozen: checked
    [record] = s.registry.mine()
    assert (record.jobid, record.ended) == ("41", None)
    assert s.poll([(sub, "train")])["41"].finished is False  # no marker, SLURM silent: still running
    protocol.marker(tmp_path / protocol.STATE_DIR, "41", protocol.EXIT_MARKER).write_text(f"0 0 {sub.job_name}\n")
    outcome = s.poll([(sub, "train")])["41"]
    ended = s.end(sub, outcome)
    assert ended.success and s.registry.mine()[0].ended == "success"
    rec = provenance.find(tmp_path, "out.txt")
    assert rec is not None and rec["rule"] == "train" and rec["code"]["snapshot"] is None
    assert json.dumps(rec).count(str(tmp_path / "train.py")) == 1  # its hash is recorded


def test_a_refused_submission_names_the_rule_and_keeps_the_script(tmp_path):
    s, _ = session(tmp_path, Slurm(refuse="Invalid account or account/partition combination specified"))
    plan = s.plan(RuleJob("train", {"nodes": 2}, "true", key="0.1"), ["out.txt"])
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
    s, _ = session(tmp_path, slurm)
    first = s.plan(RuleJob("prep", {}, "true", key="0.1"), ["a.txt"])
    s.submit(first, ["a.txt"], RunReason())
    second = s.plan(RuleJob("train", {}, "true", key="1.1"), ["b.txt"])
    s.submit(second, ["b.txt"], RunReason(), upstream=["a.txt"])
    sbatch = [c for c in slurm.calls if c[0] == "sbatch" and "--parsable" in c]
    assert "--dependency=afterok:41" in sbatch[1] and "--kill-on-invalid-dep=yes" in sbatch[1]
