"""Optional fused kernels for lm.NativeLlama: Liger's Triton kernels (the liger-kernel package), one switch each.

Never required: with the `kernels` config key empty (the default) nothing here is imported, so the CPU path and CI
run without the package. Only liger_kernel.functional is used (plain ops, no transformers monkeypatching, so it
works beside ColossalAI's transformers 4.51 pin). Effects measured on an H200: benchmarks/README.md.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

KERNELS = ("liger_rms_norm", "liger_swiglu", "liger_rope", "liger_fused_ce")
PACKAGE = "liger_kernel"


def problem(names: list[str], cuda: bool, impl: str) -> str | None:
    """Why these kernels cannot be used here (None: they can). Checked before anything is imported."""
    if not isinstance(names, list) or not set(names) <= set(KERNELS):
        return f"kernels must be a list drawn from {list(KERNELS)}, got {names!r}"
    if not names:
        return None
    if impl != "native":
        return f"kernels {names} patch lm.NativeLlama: set model_impl native (not {impl!r})"
    if not cuda:
        return f"kernels {names} are Triton GPU kernels: this machine has no CUDA (leave kernels empty on CPU)"
    if importlib.util.find_spec(PACKAGE) is None:
        return f"kernels {names} need the optional package liger-kernel (pip install liger-kernel); it is not installed"
    return None


def _autocast_dtype(t: torch.Tensor) -> torch.dtype:
    # Liger's autograd Functions are not autocast-aware: cast inputs to the autocast dtype as torch.autocast would.
    if torch.is_autocast_enabled(t.device.type):
        return torch.get_autocast_dtype(t.device.type)
    return t.dtype


def install(model: Any, names: list[str]) -> None:
    """Switch the NativeLlama's modules to the named kernels (their hooks default to None: plain PyTorch)."""
    if not names:
        return
    from liger_kernel import functional as lf

    for module in model.modules():
        kind = type(module).__name__
        if kind == "RMSNorm" and "liger_rms_norm" in names:
            module.kernel = lambda x, w, eps: lf.rms_norm(x, w, eps, casting_mode="llama")
        elif kind == "MLP" and "liger_swiglu" in names:
            module.kernel = lf.swiglu
        elif kind == "Attention" and "liger_rope" in names:
            module.kernel = lambda q, k, cos, sin: lf.rope(q, k, cos[None], sin[None])
    if "liger_fused_ce" in names:

        def fused_ce(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            dtype = _autocast_dtype(hidden)
            h = hidden[:, :-1].reshape(-1, hidden.shape[-1]).to(dtype)
            return lf.fused_linear_cross_entropy(h, weight.to(dtype), labels[:, 1:].reshape(-1))[0]

        model.fused_ce = fused_ce
