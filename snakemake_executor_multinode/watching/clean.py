"""`multinode clean`: remove what finished jobs left under .snakemake/multinode/, never what a queued or running job
still needs, and never a file Snakemake declared as an output.

Per job (a submission record): its record, its script and logs (every file of its log stem: restarts, node files,
metrics, runs, stall and NCCL traces), its code manifest and its markers; a job array's script with its last
element. Then the code snapshots no kept job's script
names and the stored objects no snapshot holds, and the reattach index's entries of removed records. The outputs'
provenance records (provenance/) are kept: an output keeps saying what made it.

A job is kept when SLURM says it is queued or running (one squeue for every job whose end no run has recorded; when
SLURM does not answer, every such job is kept), when it is younger than --older-than, or with --keep-failed when no
run saw it succeed. A file named by two records (an adopted job, a job id SLURM handed out again) goes only with
the last of them.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from snakemake_executor_multinode.contract.jobfiles import MARKERS, JobFiles, PendingFiles, StateFolders, array_script
from snakemake_executor_multinode.contract.state_files import Damaged, ignored
from snakemake_executor_multinode.slurm.client import job_order
from snakemake_executor_multinode.util.units import timespan_seconds
from snakemake_executor_multinode.watching import registry
from snakemake_executor_multinode.watching.registry import Submission

FRESH_S = 600.0  # snapshots and objects younger than this may belong to a submission in flight: never removed


class CleanError(ValueError):
    """An option that cannot be used; the message names it and what is allowed."""


@dataclass
class CleanPlan:
    remove: dict[Path, int] = field(default_factory=dict)  # path -> bytes (a folder: everything in it)
    removed_records: set[Path] = field(default_factory=set)
    kept: dict[str, int] = field(default_factory=dict)  # why -> jobs
    note: str = ""

    @property
    def size(self) -> int:
        return sum(self.remove.values())


def older_than_seconds(text: str) -> float:
    """'30d', '12h', '90m', '0' (every finished job)."""
    try:
        seconds = timespan_seconds(text) if text.strip() not in ("0", "") else 0.0
    except ValueError:
        seconds = -1.0
    if seconds < 0:
        raise CleanError(f"--older-than {text!r}: a duration such as 30d, 12h or 90m, or 0 (every finished job)")
    return seconds


def plan(
    workdir: Path,
    older_than_s: float,
    keep_failed: bool,
    active: Callable[[list[str]], set[str] | None],
    now: float | None = None,
) -> CleanPlan:
    """What a clean would remove. `active(ids)`: the ids SLURM holds as queued or running, None if it did not answer."""
    now = time.time() if now is None else now
    result = CleanPlan()
    records = [(path, sub) for path, sub in _records(StateFolders(workdir).runs)]
    unsure = sorted({s.jobid for _, s in records if s.jobid and s.ended is None}, key=job_order)
    running = active(unsure) if unsure else set()
    if running is None:
        running = set(unsure)
        result.note = f"SLURM did not answer: kept {len(unsure)} job(s) no run saw end"
    outputs = {(workdir / o).resolve() for _, s in records for o in s.outputs}

    def why_kept(sub: Submission) -> str | None:
        if sub.jobid in running:
            return "queued or running"
        if now - max(sub.submitted_at, sub.ended_at or 0.0) < older_than_s:
            return "younger than --older-than"
        if keep_failed and sub.ended != "success":
            return "not seen to succeed (--keep-failed)"
        return None

    kept, gone = [], []
    for path, sub in records:
        why = why_kept(sub)
        if why:
            kept.append(sub)
            result.kept[why] = result.kept.get(why, 0) + 1
        else:
            gone.append((path, sub))
    kept_files = {f for sub in kept for f in _job_files(workdir, sub)}
    for path, sub in gone:
        result.removed_records.add(path)
        for f in [path, *_job_files(workdir, sub)]:
            if f not in kept_files and f.resolve() not in outputs and f.exists():
                result.remove[f] = f.stat().st_size
    _snapshots(workdir, kept, now, result)
    return result


def apply(workdir: Path, cleaning: CleanPlan) -> None:
    for path in sorted(cleaning.remove, key=lambda p: len(p.parts), reverse=True):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    folders = StateFolders(workdir)
    registry.Index(folders.index).drop(cleaning.removed_records)
    for folder in (folders.runs, folders.logs):
        _remove_empty_dirs(folder)


def _records(runs_root: Path) -> Iterable[tuple[Path, Submission]]:
    if not runs_root.is_dir():
        return
    for path in sorted(runs_root.glob("*/*.json")):
        try:
            yield path, registry.record_at(path)
        except FileNotFoundError:
            continue
        except Damaged as err:
            ignored(err, "kept with its job's files: remove it by hand once `squeue --me` shows no job of that run")


def _job_files(workdir: Path, sub: Submission) -> list[Path]:
    """Every file of the job's log stem (<jobid>.attempt<n>.*) beside its log, its code manifest and its markers."""
    files: list[Path] = []
    if sub.log:
        log = Path(sub.log) if Path(sub.log).is_absolute() else workdir / sub.log
        files += JobFiles.from_log(log).all_files()
        if log.parent.is_dir():
            # the code manifest, and a job array element's script under its job name (the array's script runs it)
            pending = PendingFiles(log.parent, sub.job_name)
            files += [pending.code_manifest, pending.script]
        if sub.array:
            files.append(array_script(log.parent, sub.array))  # the array's script: goes with its last element
    if sub.script:
        files.append(Path(sub.script) if Path(sub.script).is_absolute() else workdir / sub.script)
    if sub.jobid:
        files += [StateFolders(workdir).marker(sub.jobid, suffix) for suffix in MARKERS]
    return files


def _snapshots(workdir: Path, kept: list[Submission], now: float, result: CleanPlan) -> None:
    """Snapshot folders no kept job's script names, then objects only the store still holds (one link)."""
    snapshots = StateFolders(workdir).snapshots
    if not snapshots.is_dir():
        return
    named = ""
    for sub in kept:
        try:
            named += Path(sub.script).read_text(errors="replace")
        except OSError:
            continue
    dropped: set[Path] = set()
    for folder in snapshots.iterdir():
        if folder.name.startswith(".") or folder.name in named or now - folder.stat().st_mtime < FRESH_S:
            continue
        dropped.add(folder)
        result.remove[folder] = sum(
            p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.stat().st_nlink == 1
        )
    # an object's links: the store's own and one per snapshot holding it; those of dropped snapshots go with them
    held: dict[int, int] = {}
    for folder in dropped:
        for p in folder.rglob("*"):
            if p.is_file():
                held[p.stat().st_ino] = held.get(p.stat().st_ino, 0) + 1
    objects = StateFolders(workdir).objects
    for obj in objects.glob("*/*") if objects.is_dir() else []:
        st = obj.stat()
        if obj.is_file() and st.st_nlink - held.get(st.st_ino, 0) <= 1 and now - st.st_mtime >= FRESH_S:
            result.remove[obj] = st.st_size


def _remove_empty_dirs(root: Path) -> None:
    if not root.is_dir():
        return
    for dirpath, _, _ in sorted(os.walk(root), key=lambda w: len(w[0]), reverse=True):
        if Path(dirpath) != root:
            try:
                os.rmdir(dirpath)
            except OSError:
                pass  # not empty


def size_text(n: float) -> str:
    for unit in ("B", "kB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
