"""Sharded, atomic training checkpoints through the ColossalAI Booster.

    CKPT_DIR/step_NNNNNNNN/
        model/           booster.save_model(shard=True): an index + size-limited shard files, per plugin IO
        optimizer/       booster.save_optimizer(shard=True): likewise
        lr_scheduler.pt  booster.save_lr_scheduler (written by rank 0)
        ranks/rankNNNNN.pt  per-rank state: RNG states; fp32 master weights where they are kept apart from the
                         model checkpoint (plugins.masters_apart): every rank its shard, or rank 0 alone where
                         every rank holds all of them (PluginSpec.replicated)
        trainer.json     step, tokens, elapsed, world and data-parallel size, config, and the manifest: "files",
                         every other file's relative path -> size and sha256, and "meta_sha256", the checksum of
                         trainer.json's own content; written last

Every rank writes into .tmp_step_NNNNNNNN; then every rank fsyncs every file there (the writer's fsync is the one
that counts on a shared filesystem), rank 0 hashes them into the manifest, writes trainer.json, fsyncs it and the
folders, renames the temp dir and fsyncs the parent: a checkpoint directory without the temp prefix is complete
and on disk. A shared filesystem is assumed. Who writes which files is the plugin's checkpoint IO
(plugins.PLUGIN_TABLE[...].checkpoint_io). A save that never finished (a rank or node killed while writing) leaves
its temp dir behind, never a checkpoint: the next start (Checkpointer.choose, rank 0) removes every temp dir of the
checkpoint folder with a line naming it, before any rank writes again.

Asynchronous saves (cfg ckpt_async, the default): the save is cut in two. The training's thread runs the start and
the plugin's IO with torch.save captured (background_save.captured: host-memory copies, the plugin's gathers, its
small index files), the ranks agree on it as on any phase, and `save` returns: that is the training's stall. The rest
(the copies written, fsync, manifest, publish, verification, pruning) runs on a thread, whose agreements use a gloo
group of their own (the training's thread goes on using `group`). `wait` (the next save calls it first; train.py
calls it at the exit) waits for it and raises its failure on every rank together, with the same message as a
synchronous save's; a process killed meanwhile leaves the temp dir, removed at the next start as above.

A failed save: the ranks agree after each phase (start, write, fsync, publish; diskspace.failures, an all-reduce of an
ok flag in place of each barrier), so a write that fails on one rank fails the save on every rank at once, none left
waiting in a barrier. Rank 0 removes the temp dir (and any left by an earlier failed or killed save) and every rank
raises diskspace.WriteFailed with one message naming the checkpoint and, for a full disk (ENOSPC, EDQUOT, or torch's
writer failing on a filesystem left with almost nothing free), the bytes needed (the size of the previous complete
checkpoint, which must stay until the new one verifies; without one, at least what was written) and the bytes free
after the removal. The previous checkpoints are untouched: pruning only ever follows a verified new one.

Verified checkpoints: after the rename rank 0 verifies the new checkpoint (sizes, then sha256) before pruning, and
pruning (keep_ckpts) counts verified checkpoints only, so the newest verified one is never deleted before a newer
one has verified. A resume (Checkpointer.choose) takes the newest checkpoint whose files all match its manifest;
a damaged one (a missing, truncated, empty or altered file) is skipped with a line naming the checkpoint, the
file and what is wrong, and the previous one is tried. One without a manifest (an older train.py) is taken, with
a line saying it could not be verified, only where nothing newer verifies. Rank 0 decides, every rank loads its
choice (broadcast).

Resume on the same world size restores everything exactly. On another world size the plugin's IO reshards the
model and optimizer (where its PluginSpec says resize_ok; else a ConfigError naming both sizes); the per-rank
state cannot follow, and that conversion is logged: RNG states stay as seeded, sharded fp32 master weights are
re-seeded from the checkpoint's model weights (ColossalAI's own load does that); replicated ones (bf16_master) are
restored from rank 0's copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import background_save
import diskspace
import numpy as np
import plugins
import torch
from lm import RESUME_MUTABLE_KEYS, ConfigError

FORMAT = "booster-sharded-v1"
CKPT_PREFIX = "step_"
TMP_PREFIX = f".tmp_{CKPT_PREFIX}"  # a save in progress, or one that never finished
MODEL, OPTIMIZER, SCHEDULER, RANKS, META = "model", "optimizer", "lr_scheduler.pt", "ranks", "trainer.json"
FILES, META_SHA = "files", "meta_sha256"  # trainer.json's manifest and its own checksum
NO_MANIFEST = "no manifest (written by an older train.py)"


@dataclass
class TrainState:
    step: int = 0
    tokens: int = 0
    elapsed: float = 0.0  # training wall seconds summed over all attempts


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def complete_checkpoints(ckpt_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, dir) of complete checkpoints, oldest first. Temp dirs never match (atomic rename)."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    found = []
    for path in root.glob(f"{CKPT_PREFIX}*"):
        if path.is_dir() and (path / META).is_file() and path.name[len(CKPT_PREFIX) :].isdigit():
            found.append((int(path.name[len(CKPT_PREFIX) :]), path))
    return sorted(found)


def unfinished_saves(ckpt_dir: str | Path) -> list[Path]:
    """The temp dirs of saves that never reached their rename, oldest step first."""
    root = Path(ckpt_dir)
    return sorted(p for p in root.glob(f"{TMP_PREFIX}*") if p.is_dir()) if root.is_dir() else []


def latest_checkpoint(ckpt_dir: str | Path) -> Path | None:
    ckpts = complete_checkpoints(ckpt_dir)
    return ckpts[-1][1] if ckpts else None


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def hash_threads(files: int) -> int:
    """Threads that hash a checkpoint's files: one a file, up to the CPUs this process may run on (SLURM's binding),
    at most 16. sha256 and the reads release the GIL, so the files hash in parallel: a checkpoint's shards are
    many files of about the same size (ColossalAI cuts them at 1 GB), and one thread would read them one by one."""
    return max(1, min(files, len(os.sched_getaffinity(0)), 16))


def file_hashes(step_dir: Path, rels: list[str], threads: int | None = None) -> list[str]:
    """The sha256 of each file (relative paths, in their order); `threads` None: hash_threads."""
    paths = [step_dir / rel for rel in rels]
    with ThreadPoolExecutor(threads or hash_threads(len(paths))) as pool:
        return list(pool.map(file_sha256, paths))


def data_files(step_dir: Path) -> list[str]:
    """Every file of a checkpoint but trainer.json, by relative path, sorted."""
    meta = step_dir / META
    return sorted(str(p.relative_to(step_dir)) for p in step_dir.rglob("*") if p.is_file() and p != meta)


def manifest(step_dir: Path, threads: int | None = None) -> dict[str, dict[str, Any]]:
    rels = data_files(step_dir)
    hashes = dict(zip(rels, file_hashes(step_dir, rels, threads), strict=True))
    return {rel: {"size": (step_dir / rel).stat().st_size, "sha256": hashes[rel]} for rel in rels}


def meta_sha256(meta: dict[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != META_SHA}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def verify(step_dir: Path) -> str | None:
    """None where every file matches the manifest (sizes first, then sha256); else what is wrong, naming the file;
    NO_MANIFEST for a checkpoint written before manifests."""
    try:
        meta = json.loads((step_dir / META).read_text())
    except (OSError, ValueError) as e:
        return f"{META}: unreadable ({type(e).__name__}: {e})"
    if not isinstance(meta, dict):
        return f"{META}: not a JSON object"
    if FILES not in meta:
        return NO_MANIFEST
    if meta.get(META_SHA) != meta_sha256(meta):
        return f"{META}: checksum mismatch"
    files = meta[FILES]
    if not isinstance(files, dict) or not all(
        isinstance(w, dict) and {"size", "sha256"} <= w.keys() for w in files.values()
    ):
        return f"{META}: malformed manifest"
    for rel, want in files.items():
        path = step_dir / rel
        if not path.is_file():
            return f"{rel}: missing"
        size = path.stat().st_size
        if size != want["size"]:
            return f"{rel}: size {size} != {want['size']} (saved)"
    rels = list(files)
    for rel, got in zip(rels, file_hashes(step_dir, rels), strict=True):
        if got != files[rel]["sha256"]:
            return f"{rel}: checksum mismatch"  # the first in the manifest's order, however the threads ran
    return None


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (O_RDONLY: Linux flushes either through a read-only descriptor)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path, files: bool = True) -> None:
    for dirpath, _, names in os.walk(root):
        if files:
            for name in names:
                fsync_path(Path(dirpath) / name)
        fsync_path(Path(dirpath))


def tree_bytes(root: Path) -> int:
    """The bytes of every file under `root` (0 where it does not exist)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.is_dir() else 0


def _relative(path: Path, folder: Path) -> str:
    try:
        return str(path.relative_to(folder))
    except ValueError:
        return str(path)


def rank_file(path: Path, rank: int) -> Path:
    return path / RANKS / f"rank{rank:05d}.pt"


def fp32_masters(model: Any, optimizer: Any) -> dict[str, torch.Tensor] | None:
    """This rank's fp32 master weights by parameter name, through the optimizer wrapper's public
    get_working_to_master_map() ({id(working param): master}); None where there are none."""
    get_map = getattr(optimizer, "get_working_to_master_map", None)
    working_to_master = get_map() if get_map is not None else None
    if not working_to_master:
        return None
    named = model.unwrap().named_parameters()
    return {name: working_to_master[id(p)] for name, p in named if id(p) in working_to_master}


def check_resume_config(saved: dict[str, Any], current: dict[str, Any]) -> None:
    changed = sorted(k for k in current if k not in RESUME_MUTABLE_KEYS and saved.get(k) != current[k])
    if changed:
        diff = {k: (saved.get(k), current[k]) for k in changed}
        raise ConfigError(f"checkpoint was written with a different config (saved, now): {diff}")


class Checkpointer:
    def __init__(
        self,
        booster: Any,
        model: Any,
        optimizer: Any,
        scheduler: Any,
        ckpt_dir: str | Path,
        cfg: dict[str, Any],
        dp_size: int,
    ) -> None:
        import torch.distributed as dist

        self.booster, self.model, self.optimizer, self.scheduler = booster, model, optimizer, scheduler
        self.root, self.cfg, self.dp_size = Path(ckpt_dir), cfg, dp_size
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.keep = max(1, cfg["keep_ckpts"])
        self.spec = plugins.spec_of(cfg)
        self.masters_apart = plugins.masters_apart(cfg)
        self.verified: set[Path] = set()  # checkpoints verified by this process (rank 0): pruning counts these
        self.save_cost: dict[str, float] = {}  # the last save's fsync_s, manifest_s, verify_s (rank 0)
        # The ranks agree on each phase of a save and on the resume point here: gloo, also under NCCL (no GPU sync),
        # and a group of its own, never matched against a collective of the plugin's save (diskspace.failures).
        self.group = dist.new_group(backend="gloo") if self.world > 1 else None
        self.writing: str | None = None  # what this rank's save writes now: named where an error does not say
        # ckpt_async: the save's second half runs on a thread (background_save), whose agreements need a group of
        # their own: the training's thread goes on using self.group (metrics lines) meanwhile.
        self.asynchronous = bool(cfg["ckpt_async"])
        self.background_group = dist.new_group(backend="gloo") if self.world > 1 and self.asynchronous else None
        self.background: background_save.Background | None = None  # the last save's second half, until waited for

    def log(self, msg: str) -> None:
        if self.rank == 0:
            print(msg, flush=True)

    def save(self, state: TrainState) -> Path:
        """Save, publish (rename) and verify a checkpoint; on every rank at once. A write that fails on any rank
        (a full disk above all) fails the save on every rank together with one message (WriteFailed: the checkpoint,
        the bytes needed and free); the partial save is removed and the previous checkpoints stay as they were.

        ckpt_async: this returns once every rank holds its host-memory copy of what it writes (save_cost: snapshot_s);
        writing, fsync, the manifest, the rename and the verification then run on a thread (background_save), and
        `wait` (the next save calls it first) waits for them and raises their failure, on every rank together."""
        self.wait()
        state = replace(state)  # as it is now: the training goes on changing its own while the second half runs
        final = self.root / f"{CKPT_PREFIX}{state.step:08d}"
        tmp = self.root / f"{TMP_PREFIX}{state.step:08d}"

        def begin() -> None:
            for stale in unfinished_saves(self.root):  # a failed save's: never complete
                shutil.rmtree(stale, ignore_errors=True)
            (tmp / RANKS).mkdir(parents=True)

        def write() -> None:
            # Every rank calls these: the plugin's IO decides who gathers and who writes.
            self.writing = f"{MODEL}/"
            self.booster.save_model(self.model, str(tmp / MODEL), shard=True)
            self.writing = f"{OPTIMIZER}/"
            self.booster.save_optimizer(self.optimizer, str(tmp / OPTIMIZER), shard=True)
            self.writing = SCHEDULER
            self.booster.save_lr_scheduler(self.scheduler, str(tmp / SCHEDULER))
            self.writing = str(rank_file(Path(), self.rank))
            writes_masters = self.masters_apart and (self.rank == 0 or not self.spec.replicated)
            masters = fp32_masters(self.model, self.optimizer) if writes_masters else None
            per_rank = {
                "rng": rng_state(),
                "masters": None if masters is None else {k: v.detach().cpu().clone() for k, v in masters.items()},
            }
            torch.save(per_rank, rank_file(tmp, self.rank))

        self._phase(begin if self.rank == 0 else None, final, tmp, self.group)
        if not self.asynchronous:
            self._phase(write, final, tmp, self.group)
            self.save_cost = self._complete(state, final, tmp, self.group)
            return final
        t0 = time.perf_counter()
        with background_save.captured(tmp) as capture:
            self._phase(write, final, tmp, self.group)
        self.save_cost = {"snapshot_s": round(time.perf_counter() - t0, 6)}

        def second_half() -> dict[str, float]:
            t1 = time.perf_counter()

            def writing(path: Path) -> None:
                self.writing = _relative(path, tmp)

            self._phase(lambda: capture.write(writing), final, tmp, self.background_group)
            cost = {"write_s": round(time.perf_counter() - t1, 6)}
            return {**cost, **self._complete(state, final, tmp, self.background_group)}

        self.background = background_save.Background(state.step, second_half)
        return final

    def wait(self) -> background_save.Background | None:
        """Wait for the second half of the last asynchronous save (None: none is pending): returned with its cost
        (write_s writing the copies, fsync_s, manifest_s, verify_s; background_s the whole of it) and the seconds
        this thread waited for it (waited_s). Its failure is
        raised here: a WriteFailed on every rank together (the second half agreed on it) and its partial save
        removed, as a synchronous save's."""
        pending, self.background = self.background, None
        if pending is None:
            return None
        pending.cost["waited_s"] = round(pending.join(), 6)
        pending.cost["background_s"] = round(pending.seconds, 6)
        return pending

    def _complete(self, state: TrainState, final: Path, tmp: Path, group: Any) -> dict[str, float]:
        """The save once every rank's files are in the temp dir: fsync, the manifest and trainer.json, the rename,
        the verification (rank 0) and pruning; the ranks agree on `group`. Its cost: fsync_s, manifest_s, verify_s
        (rank 0's; the others' are zero)."""
        import torch.distributed as dist

        # Every rank fsyncs every file: on a shared filesystem only the writer's own fsync flushes its data.
        t0 = time.perf_counter()
        self._phase(lambda: fsync_tree(tmp), final, tmp, group)
        fsync_s = time.perf_counter() - t0
        cost: dict[str, float] = {"fsync_s": 0.0, "manifest_s": 0.0, "verify_s": 0.0}

        def publish() -> None:
            t1 = time.perf_counter()
            meta = {
                "format": FORMAT,
                **asdict(state),
                "world_size": self.world,
                "dp_size": self.dp_size,
                "config": self.cfg,
                FILES: manifest(tmp),
            }
            meta[META_SHA] = meta_sha256(meta)
            cost["manifest_s"] = time.perf_counter() - t1
            t2 = time.perf_counter()
            self.writing = META
            (tmp / META).write_text(json.dumps(meta, indent=1))
            fsync_tree(tmp)  # trainer.json and every folder (the other files again: nothing left to flush)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            fsync_path(self.root)
            cost["fsync_s"] = fsync_s + time.perf_counter() - t2

        self._phase(publish if self.rank == 0 else None, final, tmp, group)
        if self.rank == 0:
            t3 = time.perf_counter()
            problem = verify(final)
            cost["verify_s"] = time.perf_counter() - t3
            if problem is None:
                self.verified.add(final)
                self._prune()
            else:  # not counted: the older verified ones stay
                self.log(f"checkpoint: {final} failed verification right after saving: {problem}; pruning skipped")
        if self.world > 1:
            dist.barrier(group=group)
        return {k: round(v, 6) for k, v in cost.items()}

    def _phase(self, work: Callable[[], None] | None, final: Path, tmp: Path, group: Any) -> None:
        """Run this rank's part of a save (None: nothing to do here), then agree with every rank on `group`: where
        any part failed, every rank raises WriteFailed together (diskspace.failures; also the barrier between
        phases)."""
        mine, self.writing = None, None
        if work is not None:
            try:
                work()
            except Exception as err:  # noqa: BLE001 - every rank must hear of it, whatever it is
                mine = self._describe(err, tmp)
        try:
            failed = diskspace.failures(group, self.world, mine)
        except diskspace.WriteFailed:  # the others did not come (inside a collective of the plugin's save)
            raise diskspace.WriteFailed(self._failure_message([mine], final, tmp), agreed=False) from None
        if failed:
            message = self._failure_message(failed, final, tmp) if self.rank == 0 else ""
            if self.world > 1:  # rank 0's words (it removed the partial save first) on every rank
                import torch.distributed as dist

                said = [message]
                dist.broadcast_object_list(said, src=0, group=group)
                message = said[0]
            raise diskspace.WriteFailed(message)

    def _describe(self, err: Exception, tmp: Path) -> dict[str, Any]:
        """What failed on this rank, for every rank to hear: a full disk by its name, any other error by its own
        words (and its stack on this rank's output)."""
        full = diskspace.disk_full(err, diskspace.free_bytes(self.root))
        if not full:
            traceback.print_exc()
        filename = getattr(err, "filename", None)
        writing = (_relative(Path(filename), tmp) if filename else self.writing) if full else None
        return {"rank": self.rank, "reason": diskspace.reason(err, full), "full": full, "writing": writing}

    def _failure_message(self, failed: list[dict[str, Any]], final: Path, tmp: Path) -> str:
        """The save's failure in one message; rank 0 removes the partial save first (a rank leaving alone leaves it
        to the next save). A full disk adds the bytes needed (the size of the previous checkpoint: with keep_ckpts
        the new one must fit beside it; without one, at least what was written) and free after the removal."""
        lead = next((f for f in failed if f["full"]), failed[0])
        others = len(failed) - 1
        who = f"rank {lead['rank']}" + (f" and {others} other rank{'s' if others > 1 else ''}" if others else "")
        who += f", writing {lead['writing']}" if lead["writing"] else ""
        message = f"cannot save checkpoint {final}: {lead['reason']} ({who})"
        written = tree_bytes(tmp)
        removed = self.rank == 0
        if removed:
            shutil.rmtree(tmp, ignore_errors=True)
        earlier = [path for _, path in complete_checkpoints(self.root) if path != final]
        previous = earlier[-1] if earlier else None
        if lead["full"]:
            if previous is not None:
                needed = f"{tree_bytes(previous)} bytes needed (the size of the previous checkpoint, {previous.name})"
            else:
                needed = f"at least {written} bytes needed (written before it failed; no earlier checkpoint to size it)"
            free = diskspace.free_bytes(self.root)
            message += f"; {needed}, {'an unknown number of' if free is None else free} bytes free in {self.root}"
        message += "; the partial save was removed" if removed else f"; the partial save {tmp} is left to the next save"
        message += f"; the previous checkpoint {previous} is kept" if previous else "; there is no earlier checkpoint"
        return message

    def _prune(self) -> None:
        """Delete the checkpoints older than the keep_ckpts-th newest verified one: those kept always include the
        newest verified checkpoint. Damaged checkpoints newer than it stay (a rerun saves over them)."""
        present = {path for _, path in complete_checkpoints(self.root)}
        self.verified &= present
        verified = sorted(self.verified, key=lambda p: p.name)
        if len(verified) < self.keep:
            return
        oldest_kept = verified[-self.keep].name
        for _, old in complete_checkpoints(self.root):
            if old.name < oldest_kept:
                shutil.rmtree(old, ignore_errors=True)
                self.verified.discard(old)

    def choose(self) -> tuple[Path | None, float]:
        """The checkpoint to resume from, and the seconds verification took (rank 0's; every rank gets its choice).

        Newest first: the first that verifies, or that has no manifest (an older train.py: taken with a line, as
        nothing newer verified); a damaged one is skipped with a line naming the file."""
        import torch.distributed as dist

        choice: list[Any] = [None, 0.0]
        if self.rank == 0:
            self.remove_unfinished()
            t0 = time.perf_counter()
            for _, path in reversed(complete_checkpoints(self.root)):
                problem = verify(path)
                if problem is None:
                    choice[0] = str(path)
                    break
                if problem == NO_MANIFEST:
                    self.log(f"checkpoint: {path} has {problem}: it could not be verified; resuming from it")
                    choice[0] = str(path)
                    break
                self.log(f"checkpoint: skipping damaged {path}: {problem}")
            else:
                if complete_checkpoints(self.root):
                    self.log(f"checkpoint: no checkpoint in {self.root} verified; starting from step 0")
            choice[1] = time.perf_counter() - t0
        if self.world > 1:
            dist.broadcast_object_list(choice, src=0, group=self.group)
        path = None if choice[0] is None else Path(choice[0])
        if path is not None:
            self.verified.add(path)
        return path, float(choice[1])

    def remove_unfinished(self) -> None:
        """Rank 0, at the start, before any rank saves: the temp dirs that a killed save left are removed, named. No
        rank of this run writes yet, and an earlier run's ranks are gone (a resume is a new launch)."""
        for tmp in unfinished_saves(self.root):
            self.log(f"checkpoint: removing {tmp}, the temp folder of a save that did not finish")
            shutil.rmtree(tmp, ignore_errors=True)

    def load(self, path: Path) -> TrainState:
        meta = json.loads((path / META).read_text())
        if meta.get("format") != FORMAT:
            raise ConfigError(
                f"{path}: checkpoint format {meta.get('format', 'unsharded (model.bin)')!r}; this train.py reads "
                f"{FORMAT!r} only. Resume it with the train.py that wrote it, or start a fresh --ckpt-dir"
            )
        check_resume_config(meta["config"], self.cfg)
        saved_world = meta["world_size"]
        resized = saved_world != self.world
        if resized and not self.spec.resize_ok:
            raise ConfigError(
                f"{path} was written by world size {saved_world}; this run has world size {self.world}, and plugin "
                f"{self.spec.name!r} cannot load it on another size. Resume with {saved_world} processes"
            )
        self.booster.load_model(self.model, str(path / MODEL))
        self.booster.load_optimizer(self.optimizer, str(path / OPTIMIZER))
        self.booster.load_lr_scheduler(self.scheduler, str(path / SCHEDULER))
        # Rank 0's file is read once: it holds replicated masters, and the resize log looks into it.
        first = self._rank_state(path, 0) if resized or self.spec.replicated else None
        if not resized:
            own = first if first is not None and self.rank == 0 else self._rank_state(path, self.rank)
            set_rng_state(own["rng"])
            self._restore_masters((first if self.spec.replicated else own)["masters"])
        elif self.spec.replicated:  # sharded masters: ColossalAI's load re-seeded them from the model weights
            self._restore_masters(first["masters"])
        if resized:
            self._log_resize(first, meta)
        return TrainState(step=meta["step"], tokens=meta["tokens"], elapsed=meta["elapsed"])

    @staticmethod
    def _rank_state(path: Path, rank: int) -> dict[str, Any]:
        return torch.load(rank_file(path, rank), map_location="cpu", weights_only=False)

    def _log_resize(self, first: dict[str, Any], meta: dict[str, Any]) -> None:
        """first: rank 0's per-rank state."""
        if first["masters"] is None:
            masters = "no fp32 masters apart from the model checkpoint"
        elif self.spec.replicated:
            masters = "fp32 master weights restored from rank 0's copy (every rank holds all of them)"
        else:
            masters = "fp32 master weights re-seeded from the checkpoint's model weights (they were saved per rank)"
        self.log(
            f"resume: world size {meta['world_size']} -> {self.world} (data-parallel {meta['dp_size']} -> "
            f"{self.dp_size}): model, optimizer and lr schedule resharded by the {self.spec.name} checkpoint IO; "
            f"per-rank RNG states not restored (kept as seeded); {masters}"
        )

    def _restore_masters(self, saved: dict[str, torch.Tensor] | None) -> None:
        current = fp32_masters(self.model, self.optimizer) if self.masters_apart else None
        if saved is None and current is None:
            return
        saved_shapes = {k: tuple(v.shape) for k, v in (saved or {}).items()}
        current_shapes = {k: tuple(v.shape) for k, v in (current or {}).items()}
        if saved is None or current is None or saved_shapes != current_shapes:
            diff = sorted(set(saved_shapes.items()) ^ set(current_shapes.items()))[:3]
            raise ConfigError(
                f"rank {self.rank}: the checkpoint's fp32 master weights do not match this run's layout "
                f"(first differences, name and shape: {diff}); refusing to drop them"
            )
        with torch.no_grad():
            for name, master in current.items():
                master.copy_(saved[name].to(master.device, master.dtype))
