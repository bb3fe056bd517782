"""Runtime patches that hold ColossalAI 0.5.0 and torch 2.13 (CPU) together. Applied on CPU only, never on GPU.

Each `Patch` knows how to probe the stock behaviour it works around (`needed`) and where ColossalAI still makes
the call it fixes (`call_site`). tests/training/test_compat.py asserts both for every patch, so a test fails once a
patch is no longer needed (a new ColossalAI or torch fixed it) or no longer applies (the call site moved): then
drop or rewrite the patch. ColossalAI is imported lazily, inside the functions.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

_STOCK: dict[str, Any] = {}  # CpuAccelerator's own methods, kept before patching so `needed` can probe them


def _cpu_accelerator() -> Any:
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator

    for name in ("get_rng_state", "manual_seed", "synchronize"):
        _STOCK.setdefault(name, CpuAccelerator.__dict__[name])
    return CpuAccelerator


def _raises(call: Callable[[], Any], error: type[BaseException]) -> bool:
    try:
        call()
    except error:
        return True
    return False


def _stock_raises(name: str, error: type[BaseException], *args: Any) -> bool:
    accelerator = _cpu_accelerator()()
    return _raises(lambda: _STOCK[name](accelerator, *args), error)


def _set(name: str, fn: Callable[..., Any]) -> Callable[[], None]:
    def apply() -> None:
        setattr(_cpu_accelerator(), name, fn)

    return apply


def _add_is_hccl_available() -> None:
    import torch.distributed as dist

    if not hasattr(dist, "is_hccl_available"):
        dist.is_hccl_available = lambda: False  # type: ignore[attr-defined]


# Read at import, before any patch: torch's CPU builds lack it (CUDA builds have it).
_TORCH_HAS_IS_HCCL_AVAILABLE = hasattr(torch.distributed, "is_hccl_available")


@dataclass(frozen=True)
class Patch:
    name: str
    why: str
    needed: Callable[[], bool]  # True while the stock behaviour is still broken
    call_site: tuple[str, str]  # (module, source text): ColossalAI still makes the call this patch fixes
    apply: Callable[[], None]

    def applies(self) -> bool:
        module, text = self.call_site
        return text in inspect.getsource(importlib.import_module(module))


PATCHES: tuple[Patch, ...] = (
    Patch(
        name="CpuAccelerator.get_rng_state",
        why="passes a device to torch.get_rng_state(), which takes none (TypeError); tensor-parallel layers seed "
        "their Randomizer through it",
        needed=lambda: _stock_raises("get_rng_state", TypeError),
        call_site=("colossalai.shardformer.layer.utils", "get_accelerator().get_rng_state()"),
        apply=_set("get_rng_state", lambda self, device=None: torch.get_rng_state()),
    ),
    Patch(
        name="CpuAccelerator.manual_seed",
        why="raises 'not supported for cpu accelerator'; the tensor-parallel Randomizer calls it",
        needed=lambda: _stock_raises("manual_seed", RuntimeError, 0),
        call_site=("colossalai.shardformer.layer.utils", "get_accelerator().manual_seed(seed)"),
        apply=_set("manual_seed", lambda self, seed: torch.manual_seed(seed)),
    ),
    Patch(
        name="CpuAccelerator.synchronize",
        why="raises 'not supported for cpu accelerator'; loading a sharded optimizer checkpoint calls it "
        "(CPU work is synchronous: a no-op is exact)",
        needed=lambda: _stock_raises("synchronize", RuntimeError),
        call_site=("colossalai.checkpoint_io.utils", "get_accelerator().synchronize()"),
        apply=_set("synchronize", lambda self, device=None: None),
    ),
    Patch(
        name="torch.distributed.is_hccl_available",
        why="absent from torch's CPU builds; pipeline p2p asks for it once NCCL is unavailable",
        needed=lambda: not _TORCH_HAS_IS_HCCL_AVAILABLE,
        call_site=("colossalai.pipeline.p2p", "torch.distributed.is_hccl_available()"),
        apply=_add_is_hccl_available,
    ),
)


def apply_cpu_patches() -> None:
    """Apply every patch (idempotent). Only for ColossalAI's CPU accelerator: the GPU path needs none."""
    for patch in PATCHES:
        patch.apply()
