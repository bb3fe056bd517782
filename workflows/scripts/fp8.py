"""FP8 matmuls for training (config key `fp8`), through torchao's float8 training (`torchao.float8`).

Every nn.Linear of the decoder blocks becomes a torchao Float8Linear: its forward and both backward matmuls run in
float8 (e4m3) with dynamic scales, on the GPU's FP8 tensor cores; weights, gradients and the optimizer keep their
own dtype. The output head stays in bf16: its logits feed the loss directly, and FP8 there costs the most accuracy
for the least time. Opt-in, off by default; measured gain and loss parity: benchmarks/README.md.

Needs a GPU with FP8 tensor cores (compute capability 8.9+: Ada, Hopper and later), bf16 compute, torch.compile
(torchao's casts and scales are separate kernels without it) and the package torchao. Checked before anything is
imported, like fused_kernels.problem.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
from torch import nn

# torchao's recipe names (torchao.float8.Float8LinearRecipeName): tensorwise (one scale per tensor, cuBLAS), rowwise
# (a scale per row, CUTLASS), rowwise_with_gw_hp (rowwise with the weight gradient in bf16).
RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
MIN_CAPABILITY = (8, 9)
KEEP_HIGH_PRECISION = ("lm_head",)  # module names that stay bf16


def problem(recipe: Any, cuda: bool, bf16_compute: bool, compiled: bool) -> str | None:
    """Why `fp8: recipe` cannot run here (None: it can, or fp8 is off). The plugin and model: lm.validate_config."""
    if recipe is None:
        return None
    if recipe not in RECIPES:
        return f"fp8 {recipe!r} unknown; choose null (off) or one of {list(RECIPES)}"
    if not cuda:
        return f"fp8 {recipe!r} needs a GPU with FP8 tensor cores: this machine has no CUDA (set fp8: null on CPU)"
    have = torch.cuda.get_device_capability()
    if have < MIN_CAPABILITY:
        need = ".".join(map(str, MIN_CAPABILITY))
        return (
            f"fp8 {recipe!r} needs FP8 tensor cores, compute capability {need}+ (Ada, Hopper or later); "
            f"{torch.cuda.get_device_name()} is {have[0]}.{have[1]}: set fp8: null"
        )
    if not bf16_compute:
        return f"fp8 {recipe!r} runs beside bf16 compute: set precision bf16 or bf16_master"
    if not compiled:
        return f"fp8 {recipe!r} needs compile: true (without it torchao's scaling runs as separate slow kernels)"
    if importlib.util.find_spec("torchao") is None:
        return f"fp8 {recipe!r} needs the optional package torchao (pip install torchao); not installed"
    return None


def _convertible(module: nn.Module, name: str) -> bool:
    if not isinstance(module, nn.Linear) or name.split(".")[-1] in KEEP_HIGH_PRECISION:
        return False
    out_features, in_features = module.weight.shape
    return out_features % 16 == 0 and in_features % 16 == 0  # FP8 GEMMs need both dims in multiples of 16


def convert(model: nn.Module, recipe: str) -> None:
    """Swap the decoder's nn.Linear layers for Float8Linear in place."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    convert_to_float8_training(model, module_filter_fn=_convertible, config=Float8LinearConfig.from_recipe_name(recipe))
