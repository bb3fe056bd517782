"""What freezing the code costs at submission (planning/snapshot.py): time and disk, for this repository (the example
workflow's) and for a generated git repository of N files.

    python benchmarks/snapshot.py [--files 10000] [--out results-snapshot.json]

Measured, side by side in one run: the first submission (hash, copy into the store, hard-link the snapshot), a
later submission of the same run with nothing changed (stat calls only), a new run with nothing changed (its stat
cache from disk), and a submission after one file changed (one file hashed and stored; the snapshot folder new).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from snakemake_executor_multinode.planning.snapshot import REUSE_S, SnapshotStore  # noqa: E402


def disk(path: Path) -> int:
    """Bytes of the distinct files under `path` (a hard-linked file counts once)."""
    seen, total = set(), 0
    for root, _, names in os.walk(path):
        for name in names:
            st = os.lstat(os.path.join(root, name))
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_size
    return total


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, round(time.perf_counter() - start, 4)


def measure(repo: Path, workdir: Path) -> dict:
    store = SnapshotStore(workdir, "git")
    first, t_first = timed(store.freeze)
    _, t_reused = timed(store.freeze)  # within REUSE_S: taken as it is
    store._last_at -= REUSE_S  # as if the next submission came later: the stat calls run
    _, t_same = timed(store.freeze)
    _, t_new_run = timed(SnapshotStore(workdir, "git").freeze)
    assert first is not None
    edited = repo / sorted(first.files)[0]
    edited.write_bytes(edited.read_bytes() + b"\n# edited\n")
    store._last_at -= REUSE_S
    second, t_edit = timed(store.freeze)
    assert second is not None and second.digest != first.digest
    state = workdir / ".snakemake" / "multinode"
    return {
        "files": len(first.files),
        "code_bytes": sum((repo / f).stat().st_size for f in first.files),
        "first_s": t_first,
        "within_reuse_window_s": t_reused,
        "unchanged_same_run_s": t_same,
        "unchanged_new_run_s": t_new_run,
        "one_file_changed_s": t_edit,
        "store_bytes_after_two_snapshots": disk(state / "objects"),
        "snapshot_dirs": len(list((state / "snapshots").iterdir())),
    }


def generated_repo(root: Path, files: int) -> Path:
    repo = root / "gen"
    for i in range(files):
        path = repo / f"pkg{i // 500:03d}" / f"mod{i:05d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# module {i}\n" + "x = 1\n" * 200)  # ~1.2 kB, a typical source file
    (repo / ".gitignore").write_text(".snakemake/\n")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.email=b@b", "-c", "user.name=b", "commit", "-qm", "gen"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    return repo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=10000, help="files in the generated repository")
    parser.add_argument("--out", type=Path, help="also write the results here (JSON)")
    args = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="mn-snapshot-bench-") as tmp:
        clone = Path(tmp) / "example"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        for tracked in subprocess.run(
            ["git", "-C", str(REPO), "diff", "--name-only", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.split():  # this checkout's uncommitted changes, as a user's working tree has them
            if (REPO / tracked).is_file():
                shutil.copy2(REPO / tracked, clone / tracked)
        results["example_repository"] = measure(clone, clone)
        gen = generated_repo(Path(tmp), args.files)
        results[f"generated_{args.files}_files"] = measure(gen, gen)
    print(json.dumps(results, indent=1))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
