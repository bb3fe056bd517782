"""The code a job runs, frozen at submission: every run of the job (the first, each requeue, each SLURM restart)
executes the code it was submitted with, while its inputs and outputs stay where Snakemake expects them.

What is frozen (`--multinode-snapshot`): `git` (the default) takes the files git tracks in the workflow's
repository, with their uncommitted changes (an untracked file is not code git knows: data and outputs often are; a
command that names one is warned about); a comma-separated list of files and folders (relative to the working
directory) takes those, for a workflow without git; `off` freezes nothing.

Where: a content-addressed store under .snakemake/multinode/objects (one read-only file per distinct content, named
by its sha256) and one folder per snapshot under .snakemake/multinode/snapshots/<digest>/, mirroring the
repository's layout with hard links into the store: a file that did not change costs nothing twice, a snapshot that
did not change is the same folder. A stat cache (size, mtime, inode) spares hashing unchanged files again.

How the job reaches it: the command's paths to frozen files, relative (to the working directory) or absolute (inside
the repository: the example's `{workflow.basedir}/scripts/train.py`), are rewritten to the snapshot's copies. A
Python script then imports its siblings from the snapshot too (sys.path[0] is the script's folder); an inner
Snakemake reads the frozen Snakefile, and with it the frozen scripts and config. Declared outputs and logs are never
rewritten. Where nothing is frozen, the job script checks at every restart that the files the command names are
unchanged (a manifest of their sha256) and stops naming the changed ones, instead of running a mix of versions.

A snapshot is never trusted blindly: the first time a run uses one that exists, every file is checked against what
was frozen (its size, inode and mtime against the stat cache; hashed where they changed, so a check after the first
costs stat calls only). A file that is cut short, overwritten, missing or another user's is said and replaced from
the repository's file of the same content, in place (a running job keeps its path). A damaged stat cache is said
and left out: the code is hashed anew.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from snakemake_executor_multinode.contract.jobfiles import StateFolders
from snakemake_executor_multinode.contract.state_files import Damaged, foreign, ignored, read_json
from snakemake_executor_multinode.planning.settings import SettingsError
from snakemake_executor_multinode.util.private_files import StateWriteError, no_space

# A path in a shell command: after the start, blank, quote, '=' or '(' (--script=x.py, $(cat x)); made of the
# characters paths are made of; ends at a blank, quote, or shell operator.
_PATH = re.compile(r"(?:^|(?<=[\s'\"=(]))(/?[\w.@%+,~-]+(?:/[\w.@%+,~-]+)*)(?=$|[\s'\";&|)<>])")
CHUNK = 1 << 20
# A run plans many jobs at once (the submission check plans every job, a fan-out submits hundreds in a second): a
# snapshot this recent is taken as it is, without even the stat calls (10,000 files: 0.12 s). An edit that lands
# within it of a submission is as much a race as an edit during the submission itself.
REUSE_S = 2.0


class SnapshotError(SettingsError):
    """A snapshot setting that names nothing, a path outside the workflow, an unreadable file."""


@dataclass(frozen=True)
class Snapshot:
    """One frozen state of the code."""

    repo: Path  # the repository (git) or the working directory (a list of paths): what `root` mirrors
    root: Path  # .snakemake/multinode/snapshots/<digest>
    digest: str  # sha256 over (path, mode, content hash) of every file: equal snapshots, equal digests
    files: frozenset[str]  # paths relative to `repo`
    commit: str | None = None  # git HEAD
    uncommitted: str | None = None  # sha256 of the uncommitted changes (git diff HEAD + untracked files), if any

    def describe(self) -> str:
        where = f"commit {self.commit[:12]}" if self.commit else str(self.repo)
        extra = f" + uncommitted changes {self.uncommitted[:12]}" if self.uncommitted else ""
        return f"snapshot {self.digest[:12]} of {where}{extra} ({len(self.files)} files)"


class SnapshotStore:
    """Freezes the code for one run's submissions; `freeze()` is cheap while nothing changed (stat calls only)."""

    def __init__(self, workdir: Path, setting: str) -> None:
        self.workdir = workdir
        self.setting = setting.strip()
        folders = StateFolders(workdir)
        self.objects, self.snapshots = folders.objects, folders.snapshots
        self._cache_path = self.objects / "stat-cache.json"
        self._cache: dict[str, list] | None = None
        self._last: tuple[tuple, Snapshot] | None = None
        self._last_at = -REUSE_S
        self._fresh: tuple[Snapshot | None] | None = None  # freeze()'s answer within REUSE_S, None among them
        self._checked: set[str] = set()  # snapshots this store has checked against what was frozen
        self.paths = self._paths_setting() if self.setting not in ("git", "off") else ()

    # --- what is frozen ---------------------------------------------------------------------------------------
    def _paths_setting(self) -> tuple[Path, ...]:
        """The listed files and folders, checked before the first submission."""
        named = [p.strip() for p in self.setting.split(",") if p.strip()]
        if not named:
            raise SnapshotError(f"--multinode-snapshot={self.setting!r}: names nothing; give git, off or paths")
        out = []
        root = self.workdir.resolve()
        for name in named:
            path = (self.workdir / name).resolve()
            if path != root and root not in path.parents:
                raise SnapshotError(f"--multinode-snapshot: {name!r} is outside the workflow folder {root}")
            if not path.exists():
                raise SnapshotError(f"--multinode-snapshot: {name!r} does not exist")
            for f in [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]:
                if not os.access(f, os.R_OK):
                    raise SnapshotError(f"--multinode-snapshot: {f} is not readable")
            out.append(path)
        return tuple(out)

    def _listing(self) -> tuple[Path, list[str], str | None] | None:
        """(the folder the snapshot mirrors, its files relative to it, git HEAD), or None when nothing is frozen."""
        if self.setting == "off":
            return None
        if self.paths:
            root = self.workdir.resolve()
            files = []
            for path in self.paths:
                found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
                files += [str(f.relative_to(root)) for f in found]
            return root, sorted(set(files)), None
        top = _git(self.workdir, "rev-parse", "--show-toplevel")
        if top is None:
            return None
        repo = Path(top.strip())
        listed = _git(repo, "ls-files", "-z", "--cached")
        commit = _git(repo, "rev-parse", "--verify", "-q", "HEAD")
        files = [f for f in (listed or "").split("\0") if f and (repo / f).is_file()]  # a deleted file: not code
        return repo, sorted(set(files)), commit.strip() if commit else None

    # --- freezing ---------------------------------------------------------------------------------------------
    def freeze(self) -> Snapshot | None:
        """The code now (None: nothing frozen, as outside a git repository). An answer is reused for REUSE_S, a
        "nothing" as much as a snapshot: a git process per planned job costs more than planning it."""
        now = time.monotonic()
        if self._fresh is not None and now - self._last_at < REUSE_S:
            return self._fresh[0]
        snap = self._freeze()
        self._fresh, self._last_at = (snap,), time.monotonic()
        return snap

    def _freeze(self) -> Snapshot | None:
        listing = self._listing()
        if listing is None:
            return None
        repo, files, commit = listing
        stats = tuple((f, *_stat(repo / f)) for f in files)
        if self._last is not None and self._last[0] == (repo, commit, stats):
            return self._last[1]
        cache = self._load_cache()
        entries = []
        for f, size, mtime, ino, mode in stats:
            key = str(repo / f)
            cached = cache.get(key)
            digest = cached[3] if cached and cached[:3] == [size, mtime, ino] else _sha256(repo / f)
            cache[key] = [size, mtime, ino, digest]
            entries.append((f, mode & 0o111 != 0, digest))
        total = hashlib.sha256(json.dumps(entries).encode()).hexdigest()
        root = self.snapshots / total
        if not root.is_dir():
            new = sum(st[1] for st, (_, x, digest) in zip(stats, entries, strict=True) if not self._has(digest, x))
            try:
                self._build(repo, root, entries)
            except OSError as err:  # a full disk: said with the bytes of code the store did not hold yet
                if not no_space(err):
                    raise
                raise StateWriteError(Path(err.filename or root), err, new, "the code not yet in the store") from err
            self._note_built(root, entries, cache)
        elif total not in self._checked:
            self._repair(repo, root, entries, cache)
        self._checked.add(total)
        mine = _FROZEN + str(root) + os.sep  # the cache keeps this snapshot's files only: it never grows with runs
        for key in [k for k in cache if k.startswith(_FROZEN) and not k.startswith(mine)]:
            del cache[key]
        self._save_cache(cache)
        snap = Snapshot(repo, root, total, frozenset(files), commit, self._uncommitted(repo, commit))
        self._last = ((repo, commit, stats), snap)
        return snap

    def _build(self, repo: Path, root: Path, entries: Sequence[tuple[str, bool, str]]) -> None:
        """The snapshot folder, built aside and renamed into place: a reader never sees half of it."""
        self.snapshots.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=self.snapshots))
        try:
            for f, executable, digest in entries:
                obj = self._object(repo / f, digest, executable)
                dest = tmp / f
                dest.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(obj, dest)
                except OSError:  # another filesystem, or no hard links: a copy, read-only as the object
                    shutil.copy2(obj, dest)
            os.rename(tmp, root)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not root.is_dir():  # another run built the same snapshot meanwhile: fine
                raise

    def _object_path(self, digest: str, executable: bool) -> Path:
        return self.objects / digest[:2] / (digest + (".x" if executable else ""))

    def _has(self, digest: str, executable: bool) -> bool:
        return self._object_path(digest, executable).exists()

    def _object(self, source: Path, digest: str, executable: bool) -> Path:
        obj = self._object_path(digest, executable)
        if obj.exists() and (why := self._damage(obj, digest, self._load_cache())) is not None:
            ignored(Damaged(obj, why), f"stored anew from {source}")
            obj.unlink()
        if not obj.exists():
            obj.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(dir=obj.parent, prefix=".new-")
            try:
                with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
                    shutil.copyfileobj(src, out, CHUNK)
                os.chmod(tmp, 0o500 if executable else 0o400)  # read-only: a hard link must never be edited in place
                os.replace(tmp, obj)
            except BaseException:  # a full disk: no half object left taking its space
                Path(tmp).unlink(missing_ok=True)
                raise
        return obj

    def _uncommitted(self, repo: Path, commit: str | None) -> str | None:
        """A hash of the tracked files' changes since the commit; None when there are none."""
        if commit is None:
            return None
        diff = _git(repo, "diff", "HEAD", "--binary") or ""
        return hashlib.sha256(diff.encode()).hexdigest() if diff else None

    def _load_cache(self) -> dict[str, list]:
        if self._cache is None:
            try:
                cache = read_json(self._cache_path)
                if not isinstance(cache, dict) or not all(_cache_entry(v) for v in cache.values()):
                    raise Damaged(self._cache_path, "not a stat cache")
                self._cache = cache
            except FileNotFoundError:
                self._cache = {}
            except Damaged as err:
                ignored(err, "the code is hashed anew and the cache written again")
                self._cache = {}
        return self._cache

    # --- checking a snapshot that exists ----------------------------------------------------------------------
    def _damage(self, path: Path, digest: str, cache: dict[str, list]) -> str | None:
        """What is wrong with a frozen file (None: it is what was frozen). Its stat unchanged since it was last
        found intact: intact; else hashed."""
        try:
            st = path.lstat()
        except OSError:
            return "missing"
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if why := foreign(st.st_uid):
            return why
        key = _FROZEN + str(path)
        if cache.get(key) == [st.st_size, st.st_mtime_ns, st.st_ino, digest]:
            return None
        try:
            found = _sha256(path)
        except OSError as err:
            return f"cannot be read ({err.strerror})"
        if found != digest:
            return f"its content is not what was frozen ({st.st_size} bytes, sha256 {found[:12]} != {digest[:12]})"
        cache[key] = [st.st_size, st.st_mtime_ns, st.st_ino, digest]
        return None

    def _repair(self, repo: Path, root: Path, entries: Sequence[tuple[str, bool, str]], cache: dict) -> None:
        """Check every file of an existing snapshot; replace each damaged one, in place, from the repository."""
        for f, executable, digest in entries:
            dest = root / f
            why = self._damage(dest, digest, cache)
            if why is None:
                continue
            ignored(Damaged(dest, why), f"replaced from {repo / f}")
            obj = self._object_path(digest, executable)
            if self._damage(obj, digest, cache) is not None:
                obj.unlink(missing_ok=True)  # the same damaged inode (said above): stored anew
            fresh = self._object(repo / f, digest, executable)
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.{os.getpid()}.new")
            try:
                os.link(fresh, tmp)
            except OSError:
                shutil.copy2(fresh, tmp)
            os.replace(tmp, dest)
            cache.pop(_FROZEN + str(dest), None)
        self._note_built(root, entries, cache)

    def _note_built(self, root: Path, entries: Sequence[tuple[str, bool, str]], cache: dict) -> None:
        """Remember the stat of each frozen file as it was made: the next check of the snapshot hashes nothing."""
        for f, _, digest in entries:
            path = root / f
            if _FROZEN + str(path) not in cache:
                try:
                    st = path.lstat()
                except OSError:
                    continue
                cache[_FROZEN + str(path)] = [st.st_size, st.st_mtime_ns, st.st_ino, digest]

    def _save_cache(self, cache: dict[str, list]) -> None:
        """Only spares hashing: one that cannot be written (a full disk) is left as it was."""
        tmp = self._cache_path.with_name(self._cache_path.name + f".{os.getpid()}")
        try:
            self.objects.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp.write_text(json.dumps(cache))
            os.replace(tmp, self._cache_path)
        except OSError:
            tmp.unlink(missing_ok=True)


_FROZEN = "frozen:"  # the stat cache's key prefix of a snapshot's file (the rest: a repository's file)


def _cache_entry(value: object) -> bool:
    return isinstance(value, list) and len(value) == 4 and all(isinstance(v, int) for v in value[:3]) and \
        isinstance(value[3], str)  # fmt: skip


def rewrite(command: str, snap: Snapshot, workdir: Path, keep: Iterable[str] = ()) -> str:
    """The command with every path to a frozen file pointing into the snapshot; `keep` (outputs, logs) untouched."""
    kept = {os.path.normpath(workdir / k) for k in keep}
    repo = str(snap.repo)

    def frozen(m: re.Match[str]) -> str:
        text = m.group(1)
        absolute = os.path.normpath(text if text.startswith("/") else workdir / text)
        if absolute in kept or not absolute.startswith(repo + os.sep):
            return text
        rel = os.path.relpath(absolute, repo)
        return str(snap.root / rel) if rel in snap.files else text

    return _PATH.sub(frozen, command)


def unfrozen(command: str, snap: Snapshot, workdir: Path, keep: Iterable[str] = ()) -> list[Path]:
    """Files inside the snapshot's folder that the command names but that are not frozen (untracked by git)."""
    repo = os.path.normpath(snap.repo)
    return [
        f for f in named_files(command, workdir, keep)
        if str(f).startswith(repo + os.sep) and os.path.relpath(f, repo) not in snap.files
    ]  # fmt: skip


# What a command's named file must look like to count as code: a script or config by its suffix, or an executable
# or shebang file. Data and records a job writes while it runs (`--metrics m.jsonl`, a log, a checkpoint) are not code:
# hashed, they would stop every restart of the job that wrote them (exit 86).
CODE_SUFFIXES = frozenset(
    ".py .pyx .sh .bash .zsh .r .R .jl .pl .rb .lua .js .m .ipynb .yaml .yml .toml .cfg .ini .json .smk".split()
)


def is_code(path: Path) -> bool:
    if path.suffix in CODE_SUFFIXES or os.access(path, os.X_OK):
        return True
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == b"#!"
    except OSError:
        return False


def named_files(command: str, workdir: Path, keep: Iterable[str] = ()) -> list[Path]:
    """The existing code files (`is_code`) a command names (relative or absolute), outputs and logs aside: what a
    restart checks when nothing is frozen."""
    kept = {os.path.normpath(workdir / k) for k in keep}
    found = []
    for m in _PATH.finditer(command):
        path = Path(os.path.normpath(m.group(1) if m.group(1).startswith("/") else workdir / m.group(1)))
        if str(path) not in kept and path.is_file() and path not in found and is_code(path):
            found.append(path)
    return found


def hashes(files: Sequence[Path]) -> list[tuple[str, Path]]:
    return [(_sha256(f), f) for f in files]


def manifest(hashed: Sequence[tuple[str, Path]]) -> str:
    """`sha256sum -c` input for the files `hashes` gave (absolute paths, as the job script checks them)."""
    return "".join(f"{h}  {f}\n" for h, f in hashed)


def _stat(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _git(where: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", "-C", str(where), *args], capture_output=True, text=True, errors="replace", timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None
