"""bf16 working weights in the model, fp32 master weights in the optimizer (precision `bf16_master`, torch_ddp).

The model's parameters are cast to bf16 in place, so every activation, the embedding output and each residual add
are bf16 and no autocast is needed. The optimizer keeps an fp32 copy of every parameter (its param groups hold the
masters, so AdamW's state, the lr schedule and the checkpointed optimizer are fp32), as ColossalAI's own
MixedPrecisionOptimizer does for its bf16 plugins. Unlike that one, nothing here waits for the GPU: gradients move
to the masters, are clipped and copied back with foreach kernels and no host sync, so the CPU keeps running ahead.

Gradients are accumulated over micro steps and all-reduced by DDP in bf16 (half the bytes of fp32); the clip norm,
the update and the weights it produces are fp32. checkpoint.py saves the masters per rank through
get_working_to_master_map(), the hook ColossalAI's mixed-precision optimizers expose.
"""

from __future__ import annotations

from typing import Any

import torch
from colossalai.interface import OptimizerWrapper
from torch import nn


class MasterWeightOptimizer(OptimizerWrapper):
    """Wraps an optimizer built over the model's fp32 parameters: the groups get fp32 clones (the masters) and the
    model's parameters become bf16 in place. Make the lr scheduler over `optim` before wrapping (it reads only the
    groups' lr); the Booster keeps this wrapper as it is."""

    def __init__(self, optim: torch.optim.Optimizer) -> None:
        super().__init__(optim)
        self.working: list[nn.Parameter] = []
        self.masters: list[torch.Tensor] = []
        for group in optim.param_groups:
            masters = []
            for p in group["params"]:
                if p.dtype != torch.float32:
                    raise ValueError(f"bf16_master: expected fp32 parameters to copy as masters, got {p.dtype}")
                master = p.detach().clone()
                with torch.no_grad():
                    p.data = p.data.to(torch.bfloat16)  # the same Parameter object: DDP and torch.compile see bf16
                self.working.append(p)
                self.masters.append(master)
                masters.append(master)
            group["params"] = masters
        self._grads_on_masters = False

    def _grads_to_masters(self) -> None:
        """Once per step: fp32 copies of the working gradients become the masters' gradients."""
        if self._grads_on_masters:
            return
        pairs = [(m, w) for m, w in zip(self.masters, self.working, strict=True) if w.grad is not None]
        for master, working in zip(self.masters, self.working, strict=True):
            if working.grad is None:
                master.grad = None  # AdamW skips it, as it would skip the working parameter
            elif master.grad is None:
                master.grad = torch.empty_like(master)  # kept between steps: no allocation per step
        if pairs:
            torch._foreach_copy_([m.grad for m, _ in pairs], [w.grad for _, w in pairs])
        self._grads_on_masters = True

    def clip_grad_by_norm(self, max_norm: float, norm_type: float = 2.0, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The global norm of the fp32 gradients; no host sync (torch scales by a clamped tensor factor)."""
        self._grads_to_masters()
        return nn.utils.clip_grad_norm_(self.masters, max_norm, norm_type, *args, foreach=True, **kwargs)

    def step(self, *args: Any, **kwargs: Any) -> None:
        self._grads_to_masters()
        self.optim.step(*args, **kwargs)
        with torch.no_grad():
            torch._foreach_copy_([w.data for w in self.working], self.masters)

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        for p in self.working:
            p.grad = None
        self._grads_on_masters = False  # the masters' gradient buffers are overwritten next step

    def get_working_to_master_map(self) -> dict[int, torch.Tensor]:
        return {id(w): m for w, m in zip(self.working, self.masters, strict=True)}
