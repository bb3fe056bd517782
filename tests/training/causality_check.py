"""Causality of the model as each plugin wraps it: run under torchrun, one process group, many boosters.

    torchrun --nproc_per_node=2 tests/training/causality_check.py OUT.json NAME=CONFIG_JSON ...

On a CUDA machine it runs on the GPUs (NCCL), else on CPU (gloo). For every configuration: build the
model, optimizer and plugin exactly as train.py does (lm.py), boost, run two batches that differ only in the
last token, and record on rank 0 the largest change of any earlier position's logits (must be 0) and of the
last position's (must be > 0, or the check proves nothing).
A config with "_control": "sdpa_no_mask" builds the known trap (hybrid sequence parallelism over transformers'
SDPA attention without a mask) to show the check catches a non-causal model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflows" / "scripts"))
import lm  # noqa: E402


def positions_held(logits: torch.Tensor, seq_len: int, plugin: Any) -> torch.Tensor:
    """Global sequence positions of this rank's logits (sequence parallelism may split them)."""
    local = logits.shape[1]
    if local == seq_len:
        return torch.arange(seq_len)
    sp_rank = dist.get_rank(plugin.sp_group)
    return torch.arange(sp_rank * local, (sp_rank + 1) * local)


def check(name: str, user_cfg: dict[str, Any], cuda: bool) -> dict[str, Any]:
    control = user_cfg.pop("_control", None)
    cfg = lm.merge_config(user_cfg)
    lm.validate_config(cfg, cuda=cuda, world_size=dist.get_world_size())
    model = None
    if control == "sdpa_no_mask":
        torch.manual_seed(cfg["seed"])
        model = lm.hf_llama(lm.ModelConfig.from_train_config(cfg), "sdpa")
    boosted = lm.boost(cfg, cuda, model=model)  # exactly as train.py builds, places and boosts it
    booster, model, plugin = boosted.booster, boosted.model, boosted.plugin
    model.eval()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    seq = cfg["seq_len"]
    gen = torch.Generator().manual_seed(7)
    a = torch.randint(0, lm.DATA_VOCAB, (2, seq), generator=gen).to(device)
    b = a.clone()
    b[:, -1] = (a[:, -1] + 1) % lm.DATA_VOCAB
    with torch.no_grad():
        if control == "sdpa_no_mask":  # no attention mask: the trap
            la, lb = model(input_ids=a).logits, model(input_ids=b).logits
        else:
            la, lb = lm.forward_logits(booster, model, a, cfg), lm.forward_logits(booster, model, b, cfg)
    diffs = torch.zeros(2)
    if la is not None:
        pos = positions_held(la, seq, plugin)
        d = (la.float() - lb.float()).abs().amax(dim=(0, 2)).cpu()
        earlier = d[pos < seq - 1]
        diffs[0] = earlier.max() if earlier.numel() else 0.0
        diffs[1] = d[pos == seq - 1].max() if (pos == seq - 1).any() else 0.0
    diffs = diffs.to(device)
    dist.all_reduce(diffs, op=dist.ReduceOp.MAX)
    diffs = diffs.cpu()
    return {
        "earlier_max_diff": diffs[0].item(),
        "last_max_diff": diffs[1].item(),
        "local_logits_shape": None if la is None else list(la.shape),
    }


def main() -> int:
    cuda = torch.cuda.is_available()
    lm.init_colossalai(cuda, seed=0)
    out, specs = Path(sys.argv[1]), sys.argv[2:]
    results = {}
    for spec in specs:
        name, _, cfg_json = spec.partition("=")
        results[name] = check(name, json.loads(cfg_json), cuda)
        if dist.get_rank() == 0:
            print(name, results[name], flush=True)
    if dist.get_rank() == 0:
        out.write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
