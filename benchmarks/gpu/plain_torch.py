"""Plain PyTorch baseline for the training benchmark: the same Llama-style model and data as train.py, bf16
autocast (or the config's precision: bf16_master keeps bf16 weights with fp32 masters, master_weights.py; fp8 as in
train.py), fused AdamW, optionally torch.compile; no Booster. One process on one GPU.

    python benchmarks/gpu/plain_torch.py --data-dir DATA --config-json '{...}' [--compile] [--steps 30]
        [--model-impl native|hf] [--kernels K1,K2] [--inductor-tuning] [--profile]

--model-impl picks lm.py's NativeLlama or transformers' LlamaForCausalLM (same config, same init scheme).
--kernels: train.py's `kernels` config (workflows/scripts/fused_kernels.py: Liger's Triton kernels, FlashAttention for
Hopper; "liger" = Liger's four); needs their packages.
--inductor-tuning: Inductor's coordinate-descent tuning of its generated Triton kernels (longer first compile).
--profile adds a torch.profiler summary of 3 steps after the timed ones: CUDA time per kernel family.

Prints one JSON line. Throughput is measured as train.py measures it: wall clock between synchronised points.
After the warm-up steps, the timed steps run in intervals of --log-every steps; each interval ends by reading the
loss back to the host (train.py's logging step), which waits for every kernel queued before it, and nothing else
synchronises. tokens_per_s, step_ms and mfu (6 * N * tokens/s / 989e12, N = parameters in matmuls) are the timed
tokens over the sum of the intervals; step_ms_min_max the fastest and slowest interval per step; mfu_attn the same
counting attention's 12 * layers * d_model * seq FLOPs per token too (PaLM's definition); and the peak memory.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflows" / "scripts"))
import fp8  # noqa: E402
import fused_kernels  # noqa: E402
import lm  # noqa: E402
import plugins  # noqa: E402

PEAK = 989e12
# Kernel families of the profile summary, by a substring of the kernel name (first match wins).
FAMILIES = (
    ("attention (flash/cudnn/efficient)", ("flash", "fmha", "cudnn", "attention", "efficient")),
    ("matmul (cuBLAS/CUTLASS GEMM)", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas", "wgmma")),
    ("optimizer (fused AdamW)", ("adam", "multi_tensor", "foreach")),
    ("liger triton kernels", ("liger", "_rms_norm", "_swiglu", "_rope", "cross_entropy_kernel", "element_mul")),
    ("inductor fused triton kernels", ("triton_",)),
    ("copies / casts / fills", ("copy", "memcpy", "memset", "fill", "cast")),
    ("reductions / other elementwise", ("reduce", "elementwise", "vectorized")),
)


def family(name: str) -> str:
    low = name.lower()
    for fam, keys in FAMILIES:
        if any(k in low for k in keys):
            return fam
    return "other"


def profile_summary(run_step: Any, steps: int = 3) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            run_step()
        torch.cuda.synchronize()
    wall_us = (time.perf_counter() - t0) * 1e6
    kernels: dict[str, float] = {}
    for ev in prof.key_averages():
        dt = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if ev.device_type == torch.autograd.DeviceType.CUDA and dt:
            kernels[ev.key] = kernels.get(ev.key, 0.0) + dt
    busy = sum(kernels.values())
    fams: dict[str, float] = {}
    for name, us in kernels.items():
        fams[family(name)] = fams.get(family(name), 0.0) + us
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:12]
    return {
        "wall_ms_per_step": round(wall_us / steps / 1000, 2),
        "gpu_busy_ms_per_step": round(busy / steps / 1000, 2),
        "families_pct_of_busy": {k: round(100 * v / busy, 1) for k, v in sorted(fams.items(), key=lambda kv: -kv[1])},
        "top_kernels_ms_per_step": [(k[:90], round(v / steps / 1000, 2)) for k, v in top],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--config-json", default="{}")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--log-every", type=int, default=10, help="steps per timed interval (train.py's log_every)")
    ap.add_argument("--model-impl", choices=("native", "hf"), default="native")
    ap.add_argument("--kernels", default="", help="comma list of fused_kernels.KERNELS, or liger (its four)")
    ap.add_argument("--inductor-tuning", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of this script only")
    args = ap.parse_args()
    names = [k for k in args.kernels.split(",") if k]
    names = fused_kernels.LIGER_KERNELS if names == ["liger"] else names
    overrides = {"plugin": "torch_ddp", "model_impl": args.model_impl, "kernels": names}
    cfg = lm.merge_config(json.loads(args.config_json) | overrides)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    cuda = args.device == "cuda"
    bf16 = plugins.bf16_compute(cfg)
    problem = fused_kernels.problem(names, cuda, args.model_impl, bf16)
    problem = problem or fp8.problem(cfg["fp8"], cuda, bf16, args.compile)
    if problem:
        raise SystemExit(problem)
    model = lm.build_model(cfg, cuda=cuda).to(args.device)
    opt = plugins.make_optimizer(cfg, model, cuda=cuda)
    if plugins.wraps_masters(cfg):
        import master_weights

        opt = master_weights.MasterWeightOptimizer(opt)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    n_matmul = lm.matmul_params(model)
    if args.inductor_tuning:
        import torch._inductor.config as inductor_config

        inductor_config.coordinate_descent_tuning = True
    step_fn = torch.compile(model) if args.compile else model
    tokens = lm.load_tokens(args.data_dir, "train")
    rows, seq = cfg["micro_batch"], cfg["seq_len"]
    state = {"step": 0, "loss": None}

    def run_step() -> None:
        ids = lm.batch_for_step(tokens, state["step"], cfg["seed"], seq, rows, 0, rows).to(args.device)
        with lm.autocast(cfg, args.device):
            loss = step_fn(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["step"] += 1
        state["loss"] = loss

    t_first = time.perf_counter()
    first = 0.0
    for step in range(args.warmup):
        run_step()
        sync()
        if step == 0:
            first = time.perf_counter() - t_first
    intervals = []  # (steps, seconds), each ended by the loss read back to the host
    done = 0
    mark = time.perf_counter()
    while done < args.steps:
        n = min(args.log_every, args.steps - done)
        for _ in range(n):
            run_step()
        state["loss"].item()
        now = time.perf_counter()
        intervals.append((n, now - mark))
        mark, done = now, done + n
    seconds = sum(dt for _, dt in intervals)
    tps = rows * seq * args.steps / seconds
    per_step = [dt / n for n, dt in intervals]
    attn_flops = 12 * cfg["n_layer"] * cfg["d_model"] * seq
    peak_mem = round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda else None
    variant = "plain+compile" if args.compile else "plain"
    variant += "" if args.model_impl == "native" else "+hf"
    variant += "".join(f"+{k}" for k in names) + f"+mb{rows}"
    variant += "+cdt" if args.inductor_tuning else ""
    variant += "+hybrid_adam" if cfg["optimizer"] == "hybrid_adam" else ""
    variant += {"bf16": "", "bf16_master": "+bf16m", "fp32": "+fp32"}[cfg["precision"]]
    variant += {None: "", "tensorwise": "+fp8", "rowwise": "+fp8row"}.get(cfg["fp8"], f"+fp8_{cfg['fp8']}")
    rec: dict[str, Any] = {
        "variant": variant,
        "step_ms": round(1000 * seconds / args.steps, 1),
        "step_ms_min_max": [round(1000 * min(per_step), 1), round(1000 * max(per_step), 1)],
        "tokens_per_s": round(tps),
        "mfu": round(6 * n_matmul * tps / PEAK, 4),
        "mfu_attn": round((6 * n_matmul + attn_flops) * tps / PEAK, 4),
        "timed_steps": args.steps,
        "params_matmul": n_matmul,
        "first_step_s": round(first, 1),
        "loss": round(float(state["loss"].item()), 3),
        "peak_mem_gib": peak_mem,
    }
    if args.profile and cuda:
        rec["profile"] = profile_summary(run_step)
    print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
