"""Sharded, atomic training checkpoints through the ColossalAI Booster.

    CKPT_DIR/step_NNNNNNNN/
        model/           booster.save_model(shard=True): an index + size-limited shard files, per plugin IO
        optimizer/       booster.save_optimizer(shard=True): likewise
        lr_scheduler.pt  booster.save_lr_scheduler (written by rank 0)
        ranks/rankNNNNN.pt  per-rank state: RNG states; fp32 master weights where they are kept apart from the
                         model checkpoint (plugins.masters_apart): every rank its shard, or rank 0 alone where
                         every rank holds all of them (PluginSpec.replicated)
        trainer.json     step, tokens, elapsed, world and data-parallel size, config; written last

Every rank writes into .tmp_step_NNNNNNNN; rank 0 renames it once all ranks are done, so a checkpoint directory
without the temp prefix is complete. A shared filesystem is assumed. Who writes which files is the plugin's
checkpoint IO (plugins.PLUGIN_TABLE[...].checkpoint_io).

Resume on the same world size restores everything exactly. On another world size the plugin's IO reshards the
model and optimizer (where its PluginSpec says resize_ok; else a ConfigError naming both sizes); the per-rank
state cannot follow, and that conversion is logged: RNG states stay as seeded, sharded fp32 master weights are
re-seeded from the checkpoint's model weights (ColossalAI's own load does that); replicated ones (bf16_master) are
restored from rank 0's copy.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import plugins
import torch
from lm import RESUME_MUTABLE_KEYS, ConfigError

FORMAT = "booster-sharded-v1"
CKPT_PREFIX = "step_"
MODEL, OPTIMIZER, SCHEDULER, RANKS, META = "model", "optimizer", "lr_scheduler.pt", "ranks", "trainer.json"


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


def latest_checkpoint(ckpt_dir: str | Path) -> Path | None:
    ckpts = complete_checkpoints(ckpt_dir)
    return ckpts[-1][1] if ckpts else None


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

    def log(self, msg: str) -> None:
        if self.rank == 0:
            print(msg, flush=True)

    def save(self, state: TrainState) -> Path:
        import torch.distributed as dist

        final = self.root / f"{CKPT_PREFIX}{state.step:08d}"
        tmp = self.root / f".tmp_{CKPT_PREFIX}{state.step:08d}"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            (tmp / RANKS).mkdir(parents=True)
        dist.barrier()
        # Every rank calls these: the plugin's IO decides who gathers and who writes.
        self.booster.save_model(self.model, str(tmp / MODEL), shard=True)
        self.booster.save_optimizer(self.optimizer, str(tmp / OPTIMIZER), shard=True)
        self.booster.save_lr_scheduler(self.scheduler, str(tmp / SCHEDULER))
        writes_masters = self.masters_apart and (self.rank == 0 or not self.spec.replicated)
        masters = fp32_masters(self.model, self.optimizer) if writes_masters else None
        per_rank = {
            "rng": rng_state(),
            "masters": None if masters is None else {k: v.detach().cpu().clone() for k, v in masters.items()},
        }
        torch.save(per_rank, rank_file(tmp, self.rank))
        dist.barrier()
        if self.rank == 0:
            meta = {
                "format": FORMAT,
                **asdict(state),
                "world_size": self.world,
                "dp_size": self.dp_size,
                "config": self.cfg,
            }
            (tmp / META).write_text(json.dumps(meta, indent=1))
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            for _, old in complete_checkpoints(self.root)[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        dist.barrier()
        return final

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
