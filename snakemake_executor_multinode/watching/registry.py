"""The run registry: every submission is recorded before sbatch returns, under .snakemake/multinode/runs/.

It is what lets a rerun reattach to a job a killed Snakemake left running (instead of submitting the same outputs
twice), what Ctrl-C cancels (this run's jobs, including one whose sbatch was still in flight), and what
`multinode status` reads. One small JSON file per submission, written to a temporary name and renamed: a reader
never sees half a record, and two runs in one folder never write the same file.

Reattach asks for the newest earlier submission of the same outputs once per job. Reading every record ever written
would cost more with every run (5,000 records: 144 ms per job), so each record with a job id also goes into an index
keyed by its outputs (.snakemake/multinode/index/<hash>.json: the best records of the two newest runs), one file
read per question whatever the history. A folder written before the index existed is indexed once, at the first
run that finds no index.

Damaged files (contract/state_files.py): a record that is cut short, garbage or another user's is left out with a
warning naming it (its job is then unknown to status, logs, report and Ctrl-C; reattach reads the index); a damaged
index entry is rebuilt from the records, so a damaged index never makes a rerun submit a job that still runs. When
that rebuild meets a damaged record too, the run stops before submitting (StateError), naming both files.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from snakemake_executor_multinode.contract.jobfiles import INDEX_DIR, RUNS_DIR
from snakemake_executor_multinode.contract.state_files import Damaged, StateError, foreign, ignored, read_json
from snakemake_executor_multinode.util.private_files import write_private

INDEX_KEEP = 2  # runs per outputs in the index: this run's own record never hides the one before it


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
    array: str = ""  # an element of a job array: the array's job name, which SLURM knows the element by
    tracking_id: str = ""  # the experiment its runs log to ($MULTINODE_RUN_ID); "": recorded before it existed


class Registry:
    def __init__(self, workdir: Path, run_id: str) -> None:
        self.root = workdir / RUNS_DIR
        self.run_id = run_id
        self.folder = self.root / run_id
        self.index = Index(workdir / INDEX_DIR)
        self.index.build_if_missing(self.root)
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)

    def record(self, sub: Submission) -> Submission:
        _write(self.folder / f"{sub.job_name}.json", asdict(sub))
        self.index.add(sub)
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
        """The newest submission of another run, with a job id, that writes exactly these outputs (one index read)."""
        return next((s for s in self.index.best(outputs) if s.run_id != self.run_id), None)


def _rank(sub: Submission) -> tuple[float, bool]:
    """Newer first; a job that a later run adopted has a record in each run (with the same submission time): a
    reported end in any of them wins the tie."""
    return (sub.submitted_at, sub.ended is not None)


class Index:
    """The best records of the newest runs for each set of outputs (a file per set, written whole)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, outputs: Sequence[str]) -> Path:
        key = hashlib.sha256("\0".join(sorted(outputs)).encode()).hexdigest()[:40]
        return self.folder / f"{key}.json"

    def best(self, outputs: Sequence[str]) -> list[Submission]:
        path = self.path(outputs)
        try:
            subs = _entries(path)
        except FileNotFoundError:
            return []
        except Damaged as err:
            unread: list[Path] = []
            subs = self._rebuilt(outputs, unread)
            if unread:  # the job of an unreadable record may write these outputs and still run
                raise StateError(
                    f"cannot tell whether an earlier job writes {', '.join(sorted(outputs))}: the reattach index "
                    f"{path} is damaged ({err.why}) and so is the run record {unread[0]}, which may be that job's. "
                    f"Remove {unread[0]} once `squeue --me` shows no job of that run, then run again"
                ) from None
            ignored(err, f"rebuilt from the run records ({len(subs)} entries)")
            try:
                with self._locked():
                    _write(path, [asdict(s) for s in subs])
            except OSError:
                pass  # read again from the records next time
        return [s for s in subs if tuple(sorted(s.outputs)) == tuple(sorted(outputs))]  # a hash never misleads

    def _rebuilt(self, outputs: Sequence[str], unread: list[Path] | None = None) -> list[Submission]:
        """The entry for `outputs` as the records give it (what `add` would have kept of them); the records that
        could not be read are added to `unread`."""
        wanted = tuple(sorted(outputs))
        newest: dict[str, Submission] = {}
        for sub in runs(self.folder.parent / RUNS_DIR.name, unread):
            if sub.jobid is not None and tuple(sorted(sub.outputs)) == wanted:
                if sub.run_id not in newest or _rank(sub) >= _rank(newest[sub.run_id]):
                    newest[sub.run_id] = sub
        return sorted(newest.values(), key=_rank, reverse=True)[:INDEX_KEEP]

    def add(self, sub: Submission, folder: Path | None = None) -> None:
        if sub.jobid is None:
            return  # sbatch has not answered: nothing to reattach to
        target = (folder or self.folder) / self.path(sub.outputs).name
        with self._locked(folder):
            try:
                entries = _entries(target)
            except FileNotFoundError:
                entries = []
            except Damaged as err:
                entries = self._rebuilt(sub.outputs)
                ignored(err, f"rebuilt from the run records ({len(entries)} entries)")
            newest = {s.run_id: s for s in entries}
            if sub.run_id not in newest or _rank(sub) >= _rank(newest[sub.run_id]):
                newest[sub.run_id] = sub
            kept = sorted(newest.values(), key=_rank, reverse=True)[:INDEX_KEEP]
            _write(target, [asdict(s) for s in kept])

    def drop(self, records: set[Path]) -> None:
        """Forget the entries of removed records (runs/<run>/<job name>.json; `multinode clean`)."""
        gone = {(p.parent.name, p.stem) for p in records}
        if not gone or not self.folder.is_dir():
            return
        for path in self.folder.glob("*.json"):
            with self._locked():
                try:
                    entries = _entries(path)
                except FileNotFoundError:
                    continue
                except Damaged as err:
                    ignored(err, "left as it is (a run that reads it rebuilds it from the records)")
                    continue
                left = [e for e in entries if (e.run_id, e.job_name) not in gone]
                if not left:
                    path.unlink(missing_ok=True)
                elif len(left) < len(entries):
                    _write(path, [asdict(e) for e in left])

    @contextmanager
    def _locked(self, folder: Path | None = None) -> Iterator[None]:
        """One writer of an entry at a time (two runs in one folder, or a run and `multinode clean`)."""
        path = (folder or self.folder) / ".lock"
        fh = open(path, "a")  # noqa: SIM115 (closed below)
        if why := foreign(os.fstat(fh.fileno()).st_uid):  # its content is never read: one of our own replaces it
            ignored(Damaged(path, why), "replaced by a lock file of this user")
            fh.close()
            path.unlink(missing_ok=True)
            fh = open(path, "a")  # noqa: SIM115
        with fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def build_if_missing(self, runs_root: Path) -> None:
        """Index a registry written before the index existed (or after `multinode clean` dropped it): once, into a
        temporary folder renamed into place, so that a run never reads half an index."""
        if self.folder.is_dir():
            return
        self.folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = Path(tempfile.mkdtemp(prefix=".index-", dir=self.folder.parent))
        for sub in runs(runs_root):
            self.add(sub, tmp)
        try:
            os.rename(tmp, self.folder)
        except OSError:  # another run built it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)


def _write(path: Path, data: object) -> None:
    write_private(path, json.dumps(data, sort_keys=True) + "\n")


_FIELDS = {f.name for f in fields(Submission)}
_TEXT = ("run_id", "rule", "job_name", "script", "log", "fingerprint", "array")
_TEXT_OR_NONE = ("jobid", "adopted_from", "ended")


def submission(data: object) -> Submission:
    """A record as read from its JSON; ValueError when it is no record (fields missing or of another type). Fields
    this version does not know (a newer plugin's) are left out."""
    if not isinstance(data, dict):
        raise ValueError(f"a JSON {type(data).__name__}, not a record")
    known = {k: v for k, v in data.items() if k in _FIELDS}
    outputs = known.get("outputs")
    wrong = [
        k for k in ("run_id", "rule", "job_name", "outputs", "wildcards", "attempt", "script")
        if k not in known
    ]  # fmt: skip
    if not wrong:
        wrong = [k for k in _TEXT if k in known and not isinstance(known[k], str)]
        wrong += [k for k in _TEXT_OR_NONE if known.get(k) is not None and not isinstance(known[k], str)]
        wrong += [] if isinstance(outputs, list) and all(isinstance(o, str) for o in outputs) else ["outputs"]
        wrong += [] if isinstance(known["wildcards"], dict) else ["wildcards"]
        wrong += [] if isinstance(known["attempt"], int) else ["attempt"]
        wrong += [k for k in ("submitted_at", "ended_at") if k in known and not _number_or_none(known[k])]
    if wrong:
        raise ValueError(f"not a registry record (field {wrong[0]!r} missing or wrong)")
    known["outputs"] = tuple(outputs)  # type: ignore[arg-type]
    return Submission(**known)


def _number_or_none(value: object) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def record_at(path: Path) -> Submission:
    """The record in this file; FileNotFoundError when it is gone, Damaged when it is no record of ours."""
    data = read_json(path)
    try:
        return submission(data)
    except ValueError as err:
        raise Damaged(path, str(err)) from None


def _entries(path: Path) -> list[Submission]:
    """An index file's entries; FileNotFoundError, or Damaged as `record_at`."""
    data = read_json(path)
    if not isinstance(data, list):
        raise Damaged(path, f"a JSON {type(data).__name__}, not a list of records")
    try:
        return [submission(e) for e in data]
    except ValueError as err:
        raise Damaged(path, str(err)) from None


def runs(root: Path, unread: list[Path] | None = None) -> Iterator[Submission]:
    """Every record of every run; a damaged one is said, left out and added to `unread`."""
    if root.is_dir():
        for folder in root.iterdir():
            yield from _read_folder(folder, unread)


def _read_folder(folder: Path, unread: list[Path] | None = None) -> Iterator[Submission]:
    if not folder.is_dir():
        return
    for path in folder.glob("*.json"):
        try:
            yield record_at(path)
        except FileNotFoundError:
            continue  # removed meanwhile
        except Damaged as err:
            ignored(err, "the record is left out: `multinode status`, logs, report and Ctrl-C do not know its job")
            if unread is not None:
                unread.append(path)
