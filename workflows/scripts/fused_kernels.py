"""Optional fused kernels for lm.NativeLlama, one switch each: Liger's Triton kernels (liger-kernel) and
FlashAttention for Hopper (flash-attn-4's CuTe kernels, compute capability 9.0+).

Never required: with the `kernels` config key empty (the default) nothing here is imported, so the CPU path and CI
run without the packages. Only liger_kernel.functional is used (plain ops, no transformers monkeypatching, so it
works beside ColossalAI's transformers 4.51 pin). Effects measured on an H200: benchmarks/README.md.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Kernel:
    module: str  # what is imported
    pip: str  # what to install
    min_capability: tuple[int, int] = (0, 0)
    needs_bf16: bool = False


LIGER = Kernel("liger_kernel", "liger-kernel")
KERNELS: dict[str, Kernel] = {
    "liger_rms_norm": LIGER,
    "liger_swiglu": LIGER,
    "liger_rope": LIGER,
    "liger_fused_ce": LIGER,
    # Hopper's FlashAttention (FA3's algorithm), shipped as CuTe DSL kernels in flash-attn-4; bf16/fp16 only.
    "flash_attn_hopper": Kernel("flash_attn.cute", "flash-attn-4", min_capability=(9, 0), needs_bf16=True),
}
LIGER_KERNELS = [name for name, kernel in KERNELS.items() if kernel is LIGER]


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package is missing
        return False


def problem(names: list[str], cuda: bool, impl: str, bf16_compute: bool = True) -> str | None:
    """Why these kernels cannot be used here (None: they can). Checked before anything is imported."""
    if not isinstance(names, list) or not set(names) <= set(KERNELS):
        return f"kernels must be a list drawn from {list(KERNELS)}, got {names!r}"
    if not names:
        return None
    if impl != "native":
        return f"kernels {names} patch lm.NativeLlama: set model_impl native (not {impl!r})"
    if not cuda:
        return f"kernels {names} are GPU kernels: this machine has no CUDA (leave kernels empty on CPU)"
    for name in names:
        kernel = KERNELS[name]
        if kernel.needs_bf16 and not bf16_compute:
            return f"kernel {name} runs in bf16 only: set precision bf16 or bf16_master"
        if not _installed(kernel.module):
            return f"kernel {name} needs the optional package {kernel.pip} (pip install {kernel.pip}); not installed"
        if kernel.min_capability > (0, 0):
            have = torch.cuda.get_device_capability()
            if have < kernel.min_capability:
                need = ".".join(map(str, kernel.min_capability))
                return f"kernel {name} needs a GPU of compute capability {need}+ (Hopper); this one is {have}"
    return None


def _autocast_dtype(t: torch.Tensor) -> torch.dtype:
    # Liger's autograd Functions are not autocast-aware: cast inputs to the autocast dtype as torch.autocast would.
    if torch.is_autocast_enabled(t.device.type):
        return torch.get_autocast_dtype(t.device.type)
    return t.dtype


@functools.cache  # an op is registered once per process
def flash_attention_op() -> Any:
    """Causal FlashAttention as one torch custom op with its backward, so torch.compile keeps the whole model in
    one graph (calling the package's autograd Function directly breaks the graph at every layer: the Liger hooks
    measured -48% that way). The op works on (batch, seq, heads, head_dim); the function returned takes and
    returns SDPA's (batch, heads, seq, head_dim)."""
    lib = "multinode_kernels"

    @torch.library.custom_op(f"{lib}::flash_attn_fwd", mutates_args=())
    def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from flash_attn.cute import interface as fa

        out, lse = fa._flash_attn_fwd(q, k, v, causal=True, return_lse=True)[:2]
        return out.contiguous(), lse.contiguous()  # the strides register_fake promises (no-ops for the kernel's)

    @fwd.register_fake
    def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, h, _ = q.shape
        return q.new_empty(q.shape), q.new_empty((b, h, s), dtype=torch.float32)

    @torch.library.custom_op(f"{lib}::flash_attn_bwd", mutates_args=())
    def bwd(
        dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from flash_attn.cute import interface as fa

        dq, dk, dv = fa._flash_attn_bwd(q, k, v, out, dout, lse, causal=True)[:3]
        return dq.contiguous(), dk.contiguous(), dv.contiguous()

    @bwd.register_fake
    def _(
        dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        ctx.save_for_backward(*inputs, *output)

    def backward(ctx: Any, dout: torch.Tensor, _dlse: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        return bwd(dout.contiguous(), q, k, v, out, lse)

    fwd.register_autograd(backward, setup_context=setup_context)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # (b, h, s, d) in and out, like SDPA; the op itself wants (b, s, h, d), contiguous.
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        return fwd(q, k, v)[0].transpose(1, 2)

    return attend


def install(model: Any, names: list[str]) -> None:
    """Switch the NativeLlama's modules to the named kernels (their hooks default to None: plain PyTorch)."""
    if not names:
        return
    lf: Any = None
    if set(names) & set(LIGER_KERNELS):
        from liger_kernel import functional as lf
    attend = flash_attention_op() if "flash_attn_hopper" in names else None

    for module in model.modules():
        kind = type(module).__name__
        if kind == "RMSNorm" and "liger_rms_norm" in names:
            module.kernel = lambda x, w, eps: lf.rms_norm(x, w, eps, casting_mode="llama")
        elif kind == "MLP" and "liger_swiglu" in names:
            module.kernel = lf.swiglu
        elif kind == "Attention":
            if "liger_rope" in names:
                module.kernel = lambda q, k, cos, sin: lf.rope(q, k, cos[None], sin[None])
            if attend is not None:
                module.attend = attend
    if "liger_fused_ce" in names:

        def fused_ce(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            dtype = _autocast_dtype(hidden)
            h = hidden[:, :-1].reshape(-1, hidden.shape[-1]).to(dtype)
            return lf.fused_linear_cross_entropy(h, weight.to(dtype), labels[:, 1:].reshape(-1))[0]

        model.fused_ce = fused_ce
