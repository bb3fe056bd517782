"""kernels.py: optional fused kernels. Refused clearly where they cannot run; wired into NativeLlama correctly
(checked on CPU with a stand-in liger_kernel.functional made of reference ops, so no package or GPU is needed)."""

from __future__ import annotations

import sys
import types

import kernels
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
    ],
)
def test_kernels_that_cannot_run_are_refused_naming_why(names: object, cuda: bool, impl: str, says: str) -> None:
    assert says in (kernels.problem(names, cuda, impl) or "")  # type: ignore[arg-type]


def test_a_missing_package_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels.importlib.util, "find_spec", lambda name: None)
    assert "pip install liger-kernel" in (kernels.problem(["liger_fused_ce"], cuda=True, impl="native") or "")


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
    fused = lm.build_model({**cfg, "kernels": list(kernels.KERNELS)}, cuda=False)
    assert all(m.kernel is not None for m in fused.modules() if type(m).__name__ in ("RMSNorm", "MLP", "Attention"))
    assert fused.fused_ce is not None and plain.fused_ce is None
    out = fused(input_ids=ids, labels=ids)
    assert out.logits is None  # fused linear + cross entropy never materializes the logits
    torch.testing.assert_close(out.loss, plain(input_ids=ids, labels=ids).loss, rtol=0, atol=1e-5)
