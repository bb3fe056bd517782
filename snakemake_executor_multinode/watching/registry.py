"""The run registry: every submission is recorded before sbatch returns, under .snakemake/multinode/runs/.

It is what lets a rerun reattach to a job a killed Snakemake left running (instead of submitting the same outputs
twice), what Ctrl-C cancels (this run's jobs, including one whose sbatch was still in flight), and what
`multinode status` reads. One small JSON file per submission, written to a temporary name and renamed: a reader
never sees half a record, and two runs in one folder never write the same file.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from snakemake_executor_multinode.protocol import RUNS_DIR


@dataclass(frozen=True)
class Submission:
    run_id: str
    rule: str
    wildcards: dict[str, str]
    outputs: tuple[str, ...]
    job_name: str  # unique to the submission (plan.JobPlan.job_name)
    attempt: int
    script: str
    log: str = ""
    jobid: str | None = None  # None while sbatch has not answered (or never did)
    adopted_from: str | None = None  # the run whose job this run reattached to
    fingerprint: str = ""  # the plan's script without its job name: a changed rule is never reattached
    submitted_at: float = field(default_factory=time.time)
    # How the job ended, as the run that watched it reported it to Snakemake ("success", "failed"); None while no run
    # has seen it end. A reported end is never adopted again (reattach.py).
    ended: str | None = None
    ended_at: float | None = None


class Registry:
    def __init__(self, workdir: Path, run_id: str) -> None:
        self.root = workdir / RUNS_DIR
        self.run_id = run_id
        self.folder = self.root / run_id
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)

    def record(self, sub: Submission) -> Submission:
        path = self.folder / f"{sub.job_name}.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(sub), sort_keys=True) + "\n")
        os.replace(tmp, path)
        return sub

    def submitted(self, sub: Submission, jobid: str, log: str, script: str) -> Submission:
        return self.record(replace(sub, jobid=jobid, log=log, script=script))

    def adopt(self, earlier: Submission) -> Submission:
        """This run takes over an earlier run's job (reattach.py decides when)."""
        return self.record(replace(earlier, run_id=self.run_id, adopted_from=earlier.run_id))

    def ended(self, sub: Submission, how: str) -> Submission:
        """Record that this run saw the job end and reports it to Snakemake now (written before the report)."""
        return self.record(replace(sub, ended=how, ended_at=time.time()))

    def mine(self) -> list[Submission]:
        return list(_read_folder(self.folder))

    def latest_for(self, outputs: Sequence[str]) -> Submission | None:
        """The newest submission of another run, with a job id, that writes exactly these outputs. A job that a later
        run adopted has a record in each run (with the same submission time): a reported end in any of them wins."""
        want = tuple(sorted(outputs))
        best = None
        for sub in runs(self.root):
            if sub.run_id == self.run_id or sub.jobid is None or tuple(sorted(sub.outputs)) != want:
                continue
            if best is None or (sub.submitted_at, sub.ended is not None) > (best.submitted_at, best.ended is not None):
                best = sub
        return best


def runs(root: Path) -> Iterator[Submission]:
    if root.is_dir():
        for folder in root.iterdir():
            yield from _read_folder(folder)


def _read_folder(folder: Path) -> Iterator[Submission]:
    if not folder.is_dir():
        return
    for path in folder.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # removed meanwhile, or not ours
        data["outputs"] = tuple(data["outputs"])
        yield Submission(**data)
