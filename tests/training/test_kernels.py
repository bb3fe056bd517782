"""fused_kernels.py: optional fused kernels. Refused clearly where they cannot run; wired into NativeLlama correctly
(checked on CPU with a stand-in liger_kernel.functional made of reference ops, so no package or GPU is needed)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import fused_kernels as kernels
import lm
import pytest
import torch
import torch.nn.functional as F

from .helpers import TINY


def test_no_kernels_needs_nothing() -> None:
    assert kernels.problem([], cuda=False, impl="native") is None
    assert lm.DEFAULT_CONFIG["kernels"] == []


@pytest.mark.parametrize(
    ("names", "cuda", "impl", "says"),
    [
        (["flash"], True, "native", "kernels must be a list drawn from"),
        ("liger_rope", True, "native", "kernels must be a list drawn from"),
        (["liger_rope"], True, "hf", "set model_impl native"),
        (["liger_rope"], False, "native", "no CUDA"),
        (["flash_attn_hopper"], False, "native", "no CUDA"),
    ],
)
def test_kernels_that_cannot_run_are_refused_naming_why(names: object, cuda: bool, impl: str, says: str) -> None:
    assert says in (kernels.problem(names, cuda, impl) or "")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "package"), [("liger_fused_ce", "liger-kernel"), ("flash_attn_hopper", "flash-attn-4")]
)
def test_a_missing_package_is_named(monkeypatch: pytest.MonkeyPatch, name: str, package: str) -> None:
    monkeypatch.setattr(kernels, "_installed", lambda module: False)
    assert f"pip install {package}" in (kernels.problem([name], cuda=True, impl="native") or "")


def test_flash_attention_for_hopper_is_refused_on_older_gpus_and_in_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "_installed", lambda module: True)
    monkeypatch.setattr(kernels.torch.cuda, "get_device_capability", lambda: (8, 0))
    assert "compute capability 9.0+" in (kernels.problem(["flash_attn_hopper"], cuda=True, impl="native") or "")
    assert "bf16 only" in (kernels.problem(["flash_attn_hopper"], True, "native", bf16_compute=False) or "")
    monkeypatch.setattr(kernels.torch.cuda, "get_device_capability", lambda: (9, 0))
    assert kernels.problem(["flash_attn_hopper"], cuda=True, impl="native") is None


def test_a_missing_parent_package_reads_as_not_installed() -> None:
    assert kernels._installed("no_such_package_here.cute") is False


def reference_functional() -> types.ModuleType:
    """liger_kernel.functional's four ops, written in plain PyTorch (their documented semantics)."""
    mod = types.ModuleType("liger_kernel.functional")

    def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, casting_mode: str = "llama") -> torch.Tensor:
        h = x.float()
        return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (1, s, d) -> (1, 1, s, d)
        return tuple(t * cos + lm.rotate_half(t) * sin for t in (q, k))

    def fused_linear_cross_entropy(h: torch.Tensor, w: torch.Tensor, target: torch.Tensor) -> tuple:
        return F.cross_entropy((h @ w.T).float(), target), None, None, None

    mod.rms_norm = rms_norm  # type: ignore[attr-defined]
    mod.swiglu = lambda a, b: F.silu(a) * b  # type: ignore[attr-defined]
    mod.rope = rope  # type: ignore[attr-defined]
    mod.fused_linear_cross_entropy = fused_linear_cross_entropy  # type: ignore[attr-defined]
    return mod


def test_each_kernel_replaces_its_op_and_the_loss_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    package = types.ModuleType("liger_kernel")
    package.functional = reference_functional()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "liger_kernel", package)
    monkeypatch.setitem(sys.modules, "liger_kernel.functional", package.functional)  # type: ignore[attr-defined]
    cfg = lm.merge_config({**TINY, "seq_len": 32})
    ids = torch.randint(0, lm.DATA_VOCAB, (2, 32))
    plain = lm.build_model(cfg, cuda=False)
    fused = lm.build_model({**cfg, "kernels": kernels.LIGER_KERNELS}, cuda=False)
    assert all(m.kernel is not None for m in fused.modules() if type(m).__name__ in ("RMSNorm", "MLP", "Attention"))
    assert fused.fused_ce is not None and plain.fused_ce is None
    out = fused(input_ids=ids, labels=ids)
    assert out.logits is None  # fused linear + cross entropy never materializes the logits
    torch.testing.assert_close(out.loss, plain(input_ids=ids, labels=ids).loss, rtol=0, atol=1e-5)


def reference_flash_interface() -> types.ModuleType:
    """flash_attn.cute.interface's forward and backward entry points, in plain PyTorch: (b, s, h, d) tensors, causal,
    the log-sum-exp as (b, h, s) float32, as the package documents them."""
    mod = types.ModuleType("flash_attn.cute.interface")

    def scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:  # (b, h, s, s), masked, scaled
        s = q.transpose(1, 2) @ k.permute(0, 2, 3, 1) / q.shape[-1] ** 0.5
        return s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))

    def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, return_lse: bool) -> tuple:
        assert causal and return_lse
        s = scores(q, k)
        out = (s.softmax(-1) @ v.transpose(1, 2)).transpose(1, 2).contiguous()
        return out, s.float().logsumexp(-1), None, None, None

    def bwd(q, k, v, out, dout, lse, causal):  # type: ignore[no-untyped-def]
        # Written out, as the kernel does (autograd cannot record inside a custom op): P from the saved lse.
        assert causal
        p = torch.exp(scores(q, k) - lse[..., None])
        do, vt = dout.transpose(1, 2), v.transpose(1, 2)
        dv = p.transpose(-1, -2) @ do
        ds = p * (do @ vt.transpose(-1, -2) - (do * out.transpose(1, 2)).sum(-1, keepdim=True))
        ds = ds / q.shape[-1] ** 0.5
        dq, dk = ds @ k.transpose(1, 2), ds.transpose(-1, -2) @ q.transpose(1, 2)
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)

    mod._flash_attn_fwd = fwd  # type: ignore[attr-defined]
    mod._flash_attn_bwd = bwd  # type: ignore[attr-defined]
    return mod


def test_flash_attention_for_hopper_is_one_compilable_op_with_sdpa_s_loss_and_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    interface = reference_flash_interface()
    cute = types.ModuleType("flash_attn.cute")
    cute.interface = interface  # type: ignore[attr-defined]
    package = types.ModuleType("flash_attn")
    package.cute = cute  # type: ignore[attr-defined]
    for name, mod in (("flash_attn", package), ("flash_attn.cute", cute), ("flash_attn.cute.interface", interface)):
        monkeypatch.setitem(sys.modules, name, mod)
    cfg = lm.merge_config({**TINY, "seq_len": 32})
    ids = torch.randint(0, lm.DATA_VOCAB, (2, 32))
    plain = lm.build_model(cfg, cuda=False)
    fused = lm.build_model({**cfg, "kernels": ["flash_attn_hopper"]}, cuda=False)
    assert all(m.attend is not None for m in fused.modules() if type(m).__name__ == "Attention")
    # fullgraph=True fails on any graph break: the op and its backward stay inside one compiled graph.
    compiled = torch.compile(fused, fullgraph=True, backend="aot_eager")
    loss = compiled(input_ids=ids, labels=ids).loss
    ref = plain(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(loss, ref, rtol=0, atol=1e-5)
    loss.backward()
    ref.backward()
    for (name, p), q in zip(fused.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_no_training_module_shadows_the_kernels_package_bitsandbytes_imports():
    """The scripts' folder is first on sys.path: a kernels.py there answers bitsandbytes' `from kernels import
    get_kernel` (its CPU backend's optional Hub kernels) with our module: broken where the package is installed."""
    assert not (Path(lm.__file__).parent / "kernels.py").exists()
