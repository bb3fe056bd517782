"""Runtime patches that hold ColossalAI 0.5.0 and torch >= 2.11 together (ColossalAI pins torch <= 2.5.1).

Most are for ColossalAI's CPU accelerator (applied on CPU only); one fixes sharded optimizer loading on any device.

Each `Patch` knows how to probe the stock behaviour it works around (`needed`) and where ColossalAI still makes
the call it fixes (`call_site`). tests/training/test_compat.py asserts both for every patch, so a test fails once a
patch is no longer needed (a new ColossalAI or torch fixed it) or no longer applies (the call site moved): then
drop or rewrite the patch. ColossalAI is imported lazily, inside the functions.
"""

from __future__ import annotations

import importlib
import inspect
import sys
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


def _move_steps_to_param_device(optimizer: torch.optim.Optimizer) -> None:
    """What torch's own Optimizer.load_state_dict does: a fused or capturable optimizer keeps `step` as a float32
    tensor on the parameter's device (its CUDA kernels read it there)."""
    for group in optimizer.param_groups:
        if not (group.get("fused") or group.get("capturable")):
            continue
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor) and step.device != p.device:
                optimizer.state[p]["step"] = step.to(p.device, torch.float32)


def _patch_loading_epilogue() -> None:
    import colossalai.booster.plugin  # noqa: F401  (every module that imports the epilogue by name)
    from colossalai.checkpoint_io import utils

    original = _STOCK.setdefault("sharded_optimizer_loading_epilogue", utils.sharded_optimizer_loading_epilogue)

    def epilogue(optimizer: torch.optim.Optimizer) -> None:
        original(optimizer)
        _move_steps_to_param_device(optimizer)

    for module in list(sys.modules.values()):
        if getattr(module, "sharded_optimizer_loading_epilogue", None) is original:
            module.sharded_optimizer_loading_epilogue = epilogue  # type: ignore[attr-defined]


def _sharded_load_leaves_step_off_the_param_device() -> bool:
    """Load a fused AdamW's state through ColossalAI's stock loader, the parameter on the meta device: the stock
    loader leaves `step` on the CPU it was read to."""
    from colossalai.checkpoint_io import utils

    for patch in PATCHES:  # the loader calls the accelerator's synchronize (unsupported stock on CPU)
        if patch.name == "CpuAccelerator.synchronize" and patch.needed():
            patch.apply()
    param = torch.nn.Parameter(torch.zeros(2, device="meta"))
    optimizer = torch.optim.AdamW([param], fused=True)
    state = {0: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(2), "exp_avg_sq": torch.zeros(2)}}
    utils.load_states_into_optimizer(optimizer, state, {0: param})
    _STOCK.get("sharded_optimizer_loading_epilogue", utils.sharded_optimizer_loading_epilogue)(optimizer)
    return optimizer.state[param]["step"].device != param.device


@dataclass(frozen=True)
class Patch:
    name: str
    why: str
    needed: Callable[[], bool]  # True while the stock behaviour is still broken
    call_site: tuple[str, str]  # (module, source text): ColossalAI still makes the call this patch fixes
    apply: Callable[[], None]
    cpu_only: bool = True

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
    Patch(
        name="sharded_optimizer_loading_epilogue",
        why="ColossalAI's sharded optimizer load keeps `step` where it was read (CPU), unlike torch's own "
        "load_state_dict; a fused AdamW on CUDA then fails at its next step. The epilogue moves it to the device",
        needed=_sharded_load_leaves_step_off_the_param_device,
        call_site=("colossalai.checkpoint_io.utils", 'if key != "step":'),
        apply=_patch_loading_epilogue,
        cpu_only=False,
    ),
)


def apply_patches(cuda: bool) -> None:
    """Apply the patches this device needs (idempotent): all on CPU, the device-independent ones on CUDA."""
    for patch in PATCHES:
        if not (cuda and patch.cpu_only):
            patch.apply()
