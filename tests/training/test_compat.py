"""compat.py's patches: each still needed (the stock behaviour is still broken), still applying (ColossalAI still
makes the call it fixes), and working once applied. A failure here means: drop or rewrite that patch."""

from __future__ import annotations

import compat
import pytest
import torch

PATCHES = {patch.name: patch for patch in compat.PATCHES}


@pytest.mark.parametrize("name", list(PATCHES))
def test_the_patch_is_still_needed(name: str) -> None:
    # Probes the unpatched behaviour (kept aside by compat before patching), so the order of tests is irrelevant.
    assert PATCHES[name].needed(), f"{name}: the stock behaviour works now; drop this patch ({PATCHES[name].why})"


@pytest.mark.parametrize("name", list(PATCHES))
def test_the_patch_still_applies_colossalai_makes_the_call_it_fixes(name: str) -> None:
    module, text = PATCHES[name].call_site
    assert PATCHES[name].applies(), f"{module} no longer contains {text!r}: re-check or drop the patch {name}"


def test_patched_cpu_accelerator_gives_rng_state_seeds_and_synchronizes() -> None:
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator

    compat.apply_patches(cuda=False)
    compat.apply_patches(cuda=False)  # idempotent
    acc = CpuAccelerator()
    acc.manual_seed(5)
    state = acc.get_rng_state()
    first = torch.rand(3)
    torch.set_rng_state(state)
    assert torch.equal(torch.rand(3), first)
    acc.manual_seed(5)
    assert torch.equal(torch.rand(3), first)  # manual_seed seeds the CPU generator
    assert acc.synchronize() is None
    import torch.distributed as dist

    assert dist.is_hccl_available() is False


def test_cpu_accelerator_keeps_the_stock_methods_the_patches_do_not_touch() -> None:
    # set_rng_state and manual_seed_all were patched once; set_rng_state works stock and manual_seed_all has no
    # caller on the training path, so neither is patched (a patch must earn its test above).
    assert {"set_rng_state", "manual_seed_all"}.isdisjoint(name.split(".")[-1] for name in PATCHES)


def test_patched_sharded_loading_puts_a_fused_optimizers_step_on_the_parameter_device() -> None:
    from colossalai.checkpoint_io import general_checkpoint_io, utils

    compat.apply_patches(cuda=False)
    stock = compat._STOCK["sharded_optimizer_loading_epilogue"]
    assert general_checkpoint_io.sharded_optimizer_loading_epilogue is not stock
    param = torch.nn.Parameter(torch.zeros(2, device="meta"))
    optimizer = torch.optim.AdamW([param], fused=True)
    utils.load_states_into_optimizer(optimizer, {0: {"step": torch.tensor(3.0)}}, {0: param})
    general_checkpoint_io.sharded_optimizer_loading_epilogue(optimizer)
    step = optimizer.state[param]["step"]
    assert (step.device, step.dtype) == (param.device, torch.float32)


def test_on_cuda_only_the_device_independent_patches_apply() -> None:
    assert [p.name for p in compat.PATCHES if not p.cpu_only] == ["sharded_optimizer_loading_epilogue"]
