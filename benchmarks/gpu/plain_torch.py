"""Plain PyTorch baseline for the training benchmark: the same native Llama-style model and data as train.py,
bf16 autocast, fused AdamW, optionally torch.compile; no ColossalAI. One process on one GPU.

    python benchmarks/gpu/plain_torch.py --data-dir DATA --config-json '{...}' [--compile] [--steps 30]

Prints one JSON line: tokens/s and MFU (6 * N * tokens/s / 989e12, N = parameters in matmuls) over the median
step time after warm-up, and the peak memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflows" / "scripts"))
import lm  # noqa: E402

PEAK = 989e12


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--config-json", default="{}")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of this script only")
    args = ap.parse_args()
    cfg = lm.merge_config(json.loads(args.config_json) | {"plugin": "torch_ddp", "model_impl": "native"})
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    cuda = args.device == "cuda"
    model = lm.build_model(cfg, cuda=cuda).to(args.device)
    opt = lm.make_optimizer(cfg, model, cuda=cuda)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    n_matmul = lm.matmul_params(model)
    step_fn = model
    if args.compile:
        step_fn = torch.compile(model)
    tokens = lm.load_tokens(args.data_dir, "train")
    rows, seq = cfg["micro_batch"], cfg["seq_len"]
    times = []
    t_first = time.perf_counter()
    for step in range(args.warmup + args.steps):
        ids = lm.batch_for_step(tokens, step, cfg["seed"], seq, rows, 0, rows).to(args.device, non_blocking=True)
        sync()
        t0 = time.perf_counter()
        with torch.autocast(args.device, dtype=torch.bfloat16):
            loss = step_fn(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if step == 0:
            first = time.perf_counter() - t_first
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    tps = rows * seq / med
    peak_mem = round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda else None
    print(
        json.dumps(
            {
                "variant": "plain+compile" if args.compile else "plain",
                "step_ms": round(1000 * med, 1),
                "tokens_per_s": round(tps),
                "mfu": round(6 * n_matmul * tps / PEAK, 4),
                "params_matmul": n_matmul,
                "first_step_s": round(first, 1),
                "loss": round(loss.item(), 3),
                "peak_mem_gib": peak_mem,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
