"""What each ColossalAI Booster plugin needs, in one table, and the plugin/optimizer it builds.

Every plugin-dependent decision of train.py, lm.py, checkpoint.py and the tests reads a `PluginSpec` field here;
nothing else compares plugin names. ColossalAI is imported only inside the `make` functions (it costs seconds,
and config errors must be reported before it loads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class PluginSpec:
    name: str
    # Device: the accelerators it runs on; why not on CPU (the error ColossalAI 0.5.0 raises there, measured).
    devices: tuple[str, ...]
    cpu_refusal: str
    # Precision: allowed values (of PRECISIONS); autocast=True: its bf16 is torch.autocast(bf16) over fp32 weights
    # (else the plugin's bf16 AMP: bf16 weights, fp32 masters in the optimizer).
    precisions: tuple[str, ...]
    autocast: bool
    # Model kind: the default model_impl and the allowed ones ("hf" = transformers' LlamaForCausalLM, needed by
    # shardformer); shardformer=True: the plugin rewrites the model (attention mask / flash attention rules).
    model_kind: str
    model_kinds: tuple[str, ...]
    shardformer: bool
    place_before_boost: bool  # the caller moves the model to the device; else boost places (or shards) it
    compile_ok: bool  # torch.compile before boost works with this wrapper (CUDA only)
    fp8: bool  # fp8.convert's Float8Linear layers train under this wrapper (measured: torch_ddp only)
    # Checkpoint IO (shard=True): who writes what. fp32_masters: the model checkpoint holds bf16 working weights
    # while the optimizer keeps fp32 masters, so the masters are saved per rank beside it (ColossalAI would
    # re-seed them from bf16 on load). resize_ok: the sharded model/optimizer load on another world size.
    checkpoint_io: str
    fp32_masters: bool
    # replicated: every rank holds the whole model and optimizer, so state kept beside them (bf16_master's fp32
    # masters) is written once, by rank 0, and every rank reads that copy, on any world size.
    replicated: bool
    resize_ok: bool
    # reseed_masters: the plugin casts the model to bf16 before its ZeRO optimizer copies the fp32 masters, so they
    # would start on the bf16 grid (ColossalAI 0.5.0); boost re-seeds them from the fp32 weights (reseed_zero_masters).
    reseed_masters: bool
    # Grad clipping: "loop" = train.py calls optimizer.clip_grad_by_norm; "plugin" = max_norm inside step().
    grad_clip: str
    # Pipeline schedule: None, or the schedule used when pp > 1 (grad_accum = the number of microbatches).
    pipeline: str | None
    parallel_axes: bool  # tp / pp / sp allowed
    optimizer: str | None  # an optimizer the plugin requires (else the config's)
    make: Callable[[dict[str, Any], bool], Any]


def _torch_ddp(cfg: dict[str, Any], cuda: bool) -> Any:
    from colossalai.booster.plugin import TorchDDPPlugin

    return TorchDDPPlugin(broadcast_buffers=False)


def _low_level_zero(cfg: dict[str, Any], cuda: bool) -> Any:
    from colossalai.booster.plugin import LowLevelZeroPlugin

    return LowLevelZeroPlugin(
        stage=cfg["zero_stage"] or 2, precision=cfg["precision"], max_norm=float(cfg["grad_clip"])
    )


def _gemini(cfg: dict[str, Any], cuda: bool) -> Any:
    from colossalai.booster.plugin import GeminiPlugin

    return GeminiPlugin(precision=cfg["precision"], placement_policy="static", max_norm=float(cfg["grad_clip"]))


def _hybrid(cfg: dict[str, Any], cuda: bool) -> Any:
    from colossalai.booster.plugin import HybridParallelPlugin

    sp_enabled = cfg["sp"] > 1
    return HybridParallelPlugin(
        tp_size=cfg["tp"],
        pp_size=cfg["pp"],
        sp_size=cfg["sp"] if sp_enabled else None,
        enable_sequence_parallelism=sp_enabled,
        sequence_parallelism_mode=cfg["sp_mode"] if sp_enabled else None,
        precision=cfg["precision"],
        zero_stage=cfg["zero_stage"],
        enable_flash_attention=flash_attention_ok(cfg, cuda),
        num_microbatches=cfg["grad_accum"] if cfg["pp"] > 1 else None,
        max_norm=float(cfg["grad_clip"]),
        broadcast_buffers=False,
        # No vocab padding (validate_config demands vocab % tp == 0): a padded vocab-parallel embedding changes
        # the checkpoint's shapes with tp.
        make_vocab_size_divisible_by=1,
    )


PLUGIN_TABLE: dict[str, PluginSpec] = {
    spec.name: spec
    for spec in (
        PluginSpec(
            name="torch_ddp",
            devices=("cpu", "cuda"),
            cpu_refusal="",
            precisions=("fp32", "bf16", "bf16_master"),
            autocast=True,
            model_kind="native",
            model_kinds=("native", "hf"),
            shardformer=False,
            place_before_boost=True,
            compile_ok=True,
            fp8=True,
            checkpoint_io="rank 0 writes the whole (replicated) model and optimizer, split into size-limited files",
            fp32_masters=False,
            replicated=True,
            resize_ok=True,
            reseed_masters=False,
            grad_clip="loop",
            pipeline=None,
            parallel_axes=False,
            optimizer=None,
            make=_torch_ddp,
        ),
        PluginSpec(
            name="low_level_zero",
            devices=("cuda",),
            cpu_refusal="its ZeRO optimizer keeps gradient/master buffers on an accelerator device "
            "(AssertionError 'device is required' at boost)",
            precisions=("fp32", "bf16"),
            autocast=False,
            model_kind="native",
            model_kinds=("native", "hf"),
            shardformer=False,
            place_before_boost=False,
            compile_ok=True,
            fp8=False,
            checkpoint_io="model: rank 0; optimizer: its ZeRO shards gathered to rank 0, which writes them "
            "(split on load by the new data-parallel size); fp32 master shards: every rank its own file",
            fp32_masters=True,
            replicated=False,
            resize_ok=True,
            reseed_masters=True,
            grad_clip="plugin",
            pipeline=None,
            parallel_axes=False,
            optimizer=None,
            make=_low_level_zero,
        ),
        PluginSpec(
            name="gemini",
            devices=("cuda",),
            cpu_refusal="it needs the CPUAdam/HybridAdam kernel, a CUDA-build extension "
            "(AssertionError 'No usable kernel found for CPUAdamLoader'), and places its chunks on CUDA",
            precisions=("bf16",),
            autocast=False,
            model_kind="native",
            model_kinds=("native", "hf"),
            shardformer=False,
            place_before_boost=False,
            compile_ok=False,
            fp8=False,
            checkpoint_io="model (its fp32 chunks) and optimizer: gathered chunk by chunk to rank 0, which writes "
            "them; every rank loads the parameters it holds",
            fp32_masters=False,  # Gemini's model checkpoint is written from its fp32 chunks
            replicated=False,
            resize_ok=True,
            reseed_masters=False,  # its masters start on the bf16 grid too; they live in chunks: not re-seeded
            grad_clip="plugin",
            pipeline=None,
            parallel_axes=False,
            optimizer="hybrid_adam",
            make=_gemini,
        ),
        PluginSpec(
            name="hybrid",
            devices=("cpu", "cuda"),
            cpu_refusal="",
            precisions=("fp32", "bf16"),
            autocast=False,
            model_kind="hf",
            model_kinds=("hf",),
            shardformer=True,
            place_before_boost=True,
            compile_ok=False,
            fp8=False,
            checkpoint_io="each pipeline stage writes its own files (tp shards gathered to the stage's first "
            "rank; ZeRO optimizer shards gathered over dp); fp32 masters: every rank its own file",
            fp32_masters=True,
            replicated=False,
            resize_ok=True,  # the data-parallel size may change; tp/pp/sp are fixed by the config check
            reseed_masters=False,  # its masters start on the bf16 grid too; tp shards them: not re-seeded
            grad_clip="plugin",
            pipeline="1F1B (OneForwardOneBackward) over grad_accum microbatches",
            parallel_axes=True,
            optimizer=None,
            make=_hybrid,
        ),
    )
}
PLUGINS = tuple(PLUGIN_TABLE)

# Precisions, and which of them compute in bf16. bf16_master is torch_ddp's bf16 without autocast: the model's
# weights, activations and residual stream are bf16 and master_weights.py keeps fp32 masters in the optimizer, what
# the other plugins' bf16 already does.
PRECISIONS = ("fp32", "bf16", "bf16_master")
BF16_COMPUTE = ("bf16", "bf16_master")


def bf16_compute(cfg: dict[str, Any]) -> bool:
    return cfg["precision"] in BF16_COMPUTE


def wraps_masters(cfg: dict[str, Any]) -> bool:
    """master_weights.MasterWeightOptimizer keeps the fp32 masters (bf16_master), not the plugin."""
    return cfg["precision"] == "bf16_master"


def masters_apart(cfg: dict[str, Any]) -> bool:
    """The optimizer keeps fp32 masters apart from the (bf16) model checkpoint: checkpoint.py saves them per rank."""
    return spec_of(cfg).fp32_masters or wraps_masters(cfg)


def autocasts(cfg: dict[str, Any]) -> bool:
    """bf16 through torch.autocast over fp32 weights (torch_ddp's bf16)."""
    return spec_of(cfg).autocast and cfg["precision"] == "bf16"


def spec_of(cfg: dict[str, Any]) -> PluginSpec:
    return PLUGIN_TABLE[cfg["plugin"]]


def flash_attention_ok(cfg: dict[str, Any], cuda: bool) -> bool:
    """ColossalAI's flash attention in shardformer: CUDA and bf16 only."""
    return spec_of(cfg).shardformer and cuda and cfg["precision"] == "bf16"


def uses_pipeline(cfg: dict[str, Any]) -> bool:
    return spec_of(cfg).pipeline is not None and cfg["pp"] > 1


def make_plugin(cfg: dict[str, Any], cuda: bool) -> Any:
    """The Booster plugin for cfg. The caller must keep a reference (its process groups die with it)."""
    return spec_of(cfg).make(cfg, cuda)


def make_optimizer(cfg: dict[str, Any], model: nn.Module, cuda: bool) -> torch.optim.Optimizer:
    """AdamW with decay on matrices only; ColossalAI's HybridAdam where the plugin or the config asks for it.
    Built over the model's fp32 parameters (bf16_master wraps it afterwards: master_weights.py)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    betas = (cfg["beta1"], cfg["beta2"])
    if (spec_of(cfg).optimizer or cfg["optimizer"]) == "hybrid_adam":
        from colossalai.nn.optimizer import HybridAdam

        return HybridAdam(groups, lr=cfg["lr"], betas=betas, weight_decay=cfg["weight_decay"], adamw_mode=True)
    return torch.optim.AdamW(groups, lr=cfg["lr"], betas=betas, fused=cuda)


def fp32_weights(cfg: dict[str, Any], model: nn.Module) -> dict[nn.Parameter, torch.Tensor] | None:
    """Before boost, where boost must re-seed the plugin's masters (PluginSpec.reseed_masters, bf16): the fp32 data
    of the model's trainable parameters, by parameter. References, not copies: the plugin's cast replaces each
    param.data, and these keep the fp32 values alive until reseed_zero_masters."""
    if not (spec_of(cfg).reseed_masters and cfg["precision"] == "bf16"):
        return None
    return {p: p.data for p in model.parameters() if p.requires_grad and p.dtype == torch.float32}


def reseed_zero_masters(optimizer: Any, fp32: dict[nn.Parameter, torch.Tensor]) -> int:
    """Copy the fp32 weights into ColossalAI's LowLevelZeroOptimizer masters (this rank's shard of each flattened,
    padded parameter); returns how many were re-seeded, and empties fp32.

    LowLevelZeroPlugin casts the model to bf16 (LowLevelZeroModel.__init__) before LowLevelZeroOptimizer clones the
    masters from those same parameters (_create_master_param_current_rank), so every master starts exactly on the
    bf16 grid. Round-to-nearest then hides any update smaller than half a bf16 ulp from the working weights: in a
    warm-up (lr 1e-5 against half an ulp of 6e-5 at |w| = 0.02) the model stands still for its first steps, where
    fp32 masters off the grid move the rounded weights by the update on average (docs/training.md, "ZeRO's fp32
    masters"). Each shard is checked against the master it replaces (bf16 of the fp32 value equals it exactly), so a
    layout this does not know raises instead of scrambling the weights."""
    import torch.distributed as dist
    import torch.nn.functional as F

    working_to_master = optimizer.get_working_to_master_map()
    padding = optimizer.get_param_padding_map()
    done = 0
    with torch.no_grad():
        for param, value in fp32.items():
            master = working_to_master.get(id(param))
            if master is None:
                continue
            group = optimizer.param_to_pg[param]
            if isinstance(group, tuple):
                raise NotImplementedError("re-seeding ZeRO masters over an extra data-parallel group")
            size, rank = dist.get_world_size(group), dist.get_rank(group)
            flat = F.pad(value.reshape(-1), [0, padding[id(param)]])
            shard = flat.split(flat.numel() // size)[rank].to(master.device)
            if shard.shape != master.shape or not torch.equal(shard.to(param.dtype).to(master.dtype), master):
                raise RuntimeError(f"ZeRO master of a {tuple(value.shape)} parameter is not its shard {rank}/{size}")
            master.copy_(shard)
            done += 1
    fp32.clear()
    return done
