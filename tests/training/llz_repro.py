"""ColossalAI 0.5.0's LowLevelZeroPlugin (bf16) starts its fp32 master weights on the bf16 grid; on CPU, one process.

    python tests/training/llz_repro.py            # the report (about 4 minutes on 2 cores)
    python tests/training/llz_repro.py --check    # small and fast, asserts (tests/training/test_llz_masters.py)
    torchrun --standalone --nproc_per_node=3 tests/training/llz_repro.py --check-shards   # re-seeded ZeRO shards
    (or under torchrun --standalone --nproc_per_node=1; on a GPU it runs there, NCCL, no shim: --model and
    --num-docs set the GPU comparison's model and corpus, e.g. the 355M model at micro-batch 32)

LowLevelZeroModel.__init__ casts the model to bf16 in place (module.to(bf16): the Parameter objects the optimizer
holds become bf16), and only then LowLevelZeroOptimizer._create_master_param_current_rank clones its fp32 masters
from those parameters. The model's fp32 initial values are gone: every master starts exactly on a bf16 value, so
round-to-nearest keeps each working weight where it is until its master has moved half a bf16 ulp (6e-5 at
|w| = 0.02). In a warm-up starting at lr 1e-5 the model stands still for its first steps. fp32 masters off the grid
(torch_ddp bf16_master, master_weights.py; or LLZ once lm.boost re-seeds them, plugins.reseed_zero_masters) move
the rounded weights by the update on average, like fp32 weights.

Runs, same init, data and schedule (lr 3e-4, 30 warm-up steps, cosine over 300, AdamW, clip 1.0):
  ddp_bf16        torch_ddp, bf16 autocast over fp32 weights (the GPU comparison's baseline)
  bf16_master     torch_ddp bf16_master: bf16 weights, fp32 masters from the fp32 init (the reference)
  bf16m_rounded   the same, the init rounded to bf16 first (masters on the grid, as ColossalAI makes them)
  llz_stock       ColossalAI's own LowLevelZeroPlugin(stage=2, precision="bf16", max_norm=1.0), built directly
  llz_reseeded    lm.boost's low_level_zero: the same plugin, masters re-seeded from the fp32 init

llz_stock equals bf16m_rounded step for step, llz_reseeded equals bf16_master: the masters' start is the whole
difference between ColossalAI's ZeRO and our reference.

LowLevelZeroOptimizer refuses a CPU accelerator (assert name in cuda/npu) and makes CUDA streams for
overlap_communication; the shim below gives it ColossalAI's CPU accelerator under the name "cuda" with streams that
do nothing (CPU work is synchronous) and gloo. It changes no arithmetic.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflows" / "scripts"))

REPORT = {"vocab": 50304, "d_model": 512, "n_head": 8, "n_layer": 2, "seq_len": 64, "micro_batch": 8}
CHECK = {"vocab": 320, "d_model": 64, "n_head": 4, "n_layer": 2, "seq_len": 32, "micro_batch": 4}
SCHEDULE = {"lr": 3e-4, "warmup": 30, "steps": 300, "schedule": "cosine", "grad_clip": 1.0}
MATRIX = "matrix"  # the fraction of weights that moved is counted over the >= 2-D parameters


def cpu_as_cuda() -> None:
    """ColossalAI's CPU accelerator, named "cuda", with no-op streams; then a one-process gloo group."""
    from colossalai.accelerator import set_accelerator
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator

    class NoStream:
        def wait_stream(self, stream: Any) -> None:
            pass

    class CpuNamedCuda(CpuAccelerator):
        name = property(lambda self: "cuda")  # type: ignore[assignment]

        def Stream(self, *args: Any, **kwargs: Any) -> NoStream:  # noqa: N802 (ColossalAI's name)
            return NoStream()

        def current_stream(self, *args: Any, **kwargs: Any) -> NoStream:
            return NoStream()

        def stream(self, stream: Any) -> contextlib.AbstractContextManager:
            return contextlib.nullcontext()

        def synchronize(self, *args: Any, **kwargs: Any) -> None:
            pass

    set_accelerator(CpuNamedCuda())
    torch.Tensor.record_stream = lambda self, stream: None  # type: ignore[method-assign,assignment]
    dist.init_process_group("gloo")


def one_process_env(any_world: bool = False) -> None:
    """torchrun's variables for a plain `python` start (rank 0 of 1)."""
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
    if os.environ["WORLD_SIZE"] != "1" and not any_world:
        raise SystemExit("one process: every run here trains the whole batch")


def stock_llz(cfg: dict[str, Any], model: torch.nn.Module) -> tuple[Any, Any, Any, Any, Any]:
    """ColossalAI as its documentation shows it: an fp32 model and optimizer into LowLevelZeroPlugin's Booster."""
    import lm
    import plugins
    from colossalai.booster import Booster
    from colossalai.booster.plugin import LowLevelZeroPlugin

    plugin = LowLevelZeroPlugin(stage=2, precision="bf16", max_norm=cfg["grad_clip"])
    booster = Booster(plugin=plugin)
    optimizer = plugins.make_optimizer(cfg, model, cuda=torch.cuda.is_available())
    schedule = lm.WarmupCosine(cfg["steps"], cfg["warmup"], cfg["min_lr_ratio"], cfg["schedule"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model, optimizer, _, _, scheduler = booster.boost(model, optimizer, lr_scheduler=scheduler)
    return plugin, booster, model, optimizer, scheduler


def train(name: str, cfg: dict[str, Any], tokens: Any, steps: int, cuda: bool) -> dict[str, Any]:
    import lm
    import plugins

    plugin_name, precision = {
        "ddp_bf16": ("torch_ddp", "bf16"),
        "bf16_master": ("torch_ddp", "bf16_master"),
        "bf16m_rounded": ("torch_ddp", "bf16_master"),
        "llz_stock": ("low_level_zero", "bf16"),
        "llz_reseeded": ("low_level_zero", "bf16"),
    }[name]
    c = {**cfg, "plugin": plugin_name, "precision": precision}
    model = lm.build_model(c, cuda)
    if name == "bf16m_rounded":
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    if name == "llz_stock":
        _, booster, boosted, optimizer, scheduler = stock_llz(c, model)
    else:
        b = lm.boost(c, cuda, model=model, log=lambda msg: None)
        booster, boosted, optimizer, scheduler = b.booster, b.model, b.optimizer, b.scheduler
    named = dict(model.named_parameters())
    out: dict[str, Any] = {"run": name, "loss": [], "grad_norm": [], "lr": []}
    masters = optimizer.get_working_to_master_map() if hasattr(optimizer, "get_working_to_master_map") else {}
    if masters:  # where the masters start: on the bf16 grid, or the fp32 init
        flat = {n: masters[id(p)].detach().reshape(-1).float() for n, p in named.items() if id(p) in masters}
        total = sum(v.numel() for v in flat.values())
        same = (int((flat[n] == init[n].reshape(-1).to(flat[n].device)).sum()) for n in flat)  # init: where built
        out["masters_equal_fp32_init"] = sum(same) / total
        on_grid = sum(int((v == v.to(torch.bfloat16).float()).sum()) for v in flat.values())
        out["masters_on_bf16_grid"] = on_grid / total
    spec = plugins.spec_of(c)
    matrices = [n for n, p in named.items() if p.dim() >= 2]

    def snapshot() -> tuple[torch.Tensor, torch.Tensor]:
        """(masters, the weights the model computes with) of the matrices, flattened; fp32 weights are both."""
        working = [named[n].detach().to(torch.bfloat16).float().reshape(-1) for n in matrices]
        master = [masters[id(named[n])] if id(named[n]) in masters else named[n] for n in matrices]
        return torch.cat([m.detach().float().reshape(-1) for m in master]), torch.cat(working)

    master0, working0 = snapshot()
    for step in range(steps):
        ids = lm.batch_for_step(tokens, step, c["seed"], c["seq_len"], c["micro_batch"], 0, c["micro_batch"])
        ids = ids.to(torch.device("cuda", torch.cuda.current_device()) if cuda else "cpu")
        with lm.autocast(c, ids.device.type):
            loss = boosted(input_ids=ids, labels=ids).loss
        booster.backward(loss, optimizer)
        norm = None
        if spec.grad_clip == "loop" and c["grad_clip"] > 0:
            norm = float(optimizer.clip_grad_by_norm(c["grad_clip"]))
        out["lr"].append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        if norm is None:
            norm = optimizer._current_grad_norm  # LowLevelZeroOptimizer's norm of this step
        optimizer.zero_grad()
        scheduler.step()
        out["loss"].append(loss.item())
        out["grad_norm"].append(float(norm))
        if step == 0:  # the first update (lr 1e-5): how much of it reaches the weights the model computes with
            master1, working1 = snapshot()
            update, seen = master1 - master0, working1 - working0
            out["weights_moved"] = float((seen != 0).float().mean())
            out["update_realized"] = float((seen * update).sum() / (update * update).sum())
            if plugins.autocasts(c):  # autocast computes with bf16 copies of the fp32 weights
                out["weights_moved"] = out["update_realized"] = float("nan")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="small model, few steps, assert the findings")
    p.add_argument(
        "--check-shards", action="store_true", help="any world size: lm.boost's ZeRO masters are the fp32 init"
    )
    p.add_argument("--steps", type=int, default=None, help="training steps per run (default 30; --check 6)")
    p.add_argument("--json", type=Path, help="write the runs' numbers here")
    p.add_argument("--model", default="{}", help="JSON train-config keys over the default model (--check: ignored)")
    p.add_argument("--num-docs", type=int, default=None, help="generated documents (default 3000; --check 600)")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    import lm
    import preprocess

    one_process_env(any_world=args.check_shards)
    if cuda:
        lm.init_colossalai(True, 0)
    else:
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
        cpu_as_cuda()
    if args.check_shards:
        check_shards(lm.merge_config({**CHECK, "plugin": "low_level_zero", "precision": "bf16"}), cuda)
        dist.destroy_process_group()
        return 0
    model_keys = CHECK if args.check else {**REPORT, **json.loads(args.model)}
    cfg = lm.merge_config({**model_keys, **SCHEDULE, "log_every": 1, "ckpt_every": 0})
    steps = args.steps or (6 if args.check else 30)
    num_docs = args.num_docs or (600 if args.check else 3000)
    with tempfile.TemporaryDirectory() as tmp:
        assert preprocess.main(["--out-dir", tmp, "--num-docs", str(num_docs), "--seed", "3"]) == 0
        tokens = lm.load_tokens(tmp, "train")
        names = ["ddp_bf16", "bf16_master", "bf16m_rounded", "llz_stock", "llz_reseeded"]
        runs = {}
        for name in names:
            runs[name] = train(name, cfg, tokens, steps, cuda)
            gc.collect()  # the boosted objects hold hooks and process groups: free them before the next run
            if cuda:
                torch.cuda.empty_cache()
    dist.destroy_process_group()
    if args.json:
        args.json.write_text(json.dumps({"config": cfg, "runs": runs}, indent=1))
    ref = runs["bf16_master"]["loss"]
    where = torch.cuda.get_device_name() if cuda else "CPU"
    shape = json.dumps({k: cfg[k] for k in CHECK})
    print(f"{where}: model {shape}, lr {cfg['lr']} warm-up {cfg['warmup']}, {steps} steps")
    for name, r in runs.items():
        extra = ""
        if "masters_on_bf16_grid" in r:
            extra = (
                f", masters on the bf16 grid {r['masters_on_bf16_grid']:.1%}, "
                f"equal to the fp32 init {r['masters_equal_fp32_init']:.1%}"
            )
        if r["update_realized"] != r["update_realized"]:  # nan: autocast
            print(f"{name:14s} fp32 weights (autocast computes with their bf16 copies)")
            continue
        print(
            f"{name:14s} step 1's update realized in the bf16 weights: {r['update_realized']:.1%} "
            f"({r['weights_moved']:.1%} of them moved){extra}"
        )
    print("step  lr        " + "".join(f"{n:>14s}" for n in runs) + "   llz_stock vs bf16_master")
    for i in range(steps):
        row = "".join(f"{r['loss'][i]:14.5f}" for r in runs.values())
        rel = (runs["llz_stock"]["loss"][i] - ref[i]) / ref[i]
        print(f"{i + 1:4d}  {runs['bf16_master']['lr'][i]:.2e}{row}   {rel:+.2%}")
    first = min(10, steps)
    mean = {n: sum(r["loss"][:first]) / first for n, r in runs.items()}
    print(
        f"mean of steps 1-{first} (train.py's first logged loss): " + ", ".join(f"{n} {v:.4f}" for n, v in mean.items())
    )
    for base in ("bf16_master", "ddp_bf16"):
        print(f"  llz_stock vs {base} {(mean['llz_stock'] - mean[base]) / mean[base]:+.2%}")
    if args.check:
        check(runs)
        print("check: passed")
    return 0


def check_shards(cfg: dict[str, Any], cuda: bool) -> None:
    """Every rank's ZeRO master shards, after lm.boost, are its slices of the fp32 init (padded, flattened). On 3
    ranks most of CHECK's parameters do not divide evenly, so their last shard is padded."""
    import lm

    init = {n: p.detach().clone() for n, p in lm.build_model(cfg, cuda).named_parameters()}
    b = lm.boost(cfg, cuda, log=lambda msg: None)
    masters = b.optimizer.get_working_to_master_map()
    rank, size = dist.get_rank(), dist.get_world_size()
    for name, param in b.model.unwrap().named_parameters():
        flat = torch.nn.functional.pad(init[name].reshape(-1), [0, (size - init[name].numel() % size) % size])
        shard = flat.split(flat.numel() // size)[rank]
        assert torch.equal(masters[id(param)].cpu(), shard), name
    print(f"rank {rank}/{size}: {len(init)} master shards equal the fp32 init", flush=True)


def check(runs: dict[str, Any]) -> None:
    stock, reseeded = runs["llz_stock"], runs["llz_reseeded"]
    # ColossalAI's masters are the bf16 cast of the init; lm.boost's are the fp32 init itself.
    assert stock["masters_on_bf16_grid"] == 1.0 and stock["masters_equal_fp32_init"] < 0.01, stock
    assert reseeded["masters_equal_fp32_init"] == 1.0, reseeded
    # The first warm-up update (lr 1e-5) reaches the reference's bf16 weights on average (in expectation over where
    # each master sits in its bf16 interval), a fraction of it ColossalAI's.
    assert 0.8 < runs["bf16_master"]["update_realized"] < 1.2, runs["bf16_master"]
    assert stock["update_realized"] < 0.6, stock
    # The masters' start is the whole difference: each LLZ run is its reference, loss for loss, to rounding.
    for llz, ref in (("llz_stock", "bf16m_rounded"), ("llz_reseeded", "bf16_master")):
        for a, b in zip(runs[llz]["loss"], runs[ref]["loss"], strict=True):
            assert abs(a - b) <= 1e-4 * abs(b), (llz, ref, runs[llz]["loss"], runs[ref]["loss"])
    assert runs["llz_stock"]["loss"] != runs["bf16_master"]["loss"]


if __name__ == "__main__":
    sys.exit(main())
