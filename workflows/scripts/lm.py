"""Shared code of the training scripts: config, model, data, lr schedule and the Booster set-up (`boost`).

Imported by preprocess.py, train.py and evaluate.py (they sit in the same directory) and by the tests. What each
plugin needs is plugins.py's table; checkpoints are checkpoint.py; version patches compat.py; optional kernels
fused_kernels.py.
ColossalAI is imported lazily: it costs seconds, and config errors must be reported before it loads.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import fp8
import fused_kernels
import numpy as np
import plugins
import torch
import torch.nn.functional as F
from torch import nn

# ----------------------------------------------------------------------------------------------------------
# Tokens: raw bytes plus one end-of-document token.
# ----------------------------------------------------------------------------------------------------------
EOS_ID = 256
DATA_VOCAB = 257
TOKEN_DTYPE = np.uint16
DATA_FORMAT = "bytes-eos-v1"

# ----------------------------------------------------------------------------------------------------------
# Train config: (default, comment). The comment becomes the YAML comment of --print-default-config.
# ----------------------------------------------------------------------------------------------------------
CONFIG_SPEC: dict[str, tuple[Any, str]] = {
    "plugin": ("torch_ddp", "torch_ddp | low_level_zero | gemini | hybrid (the middle two: GPU only)"),
    "tp": (1, "hybrid: tensor-parallel size"),
    "pp": (1, "hybrid: pipeline stages (grad_accum is then the number of pipeline microbatches)"),
    "sp": (1, "hybrid: sequence-parallel size, > 1 enables SP (split_gather/ring: must equal tp)"),
    "sp_mode": ("all_to_all", "hybrid: all_to_all (own axis) | split_gather | ring (share the tp group)"),
    "zero_stage": (0, "hybrid: ZeRO stage 0/1/2; low_level_zero: 1/2 (0 means 2)"),
    "precision": (
        "fp32",
        "fp32 | bf16 | bf16_master. bf16: torch_ddp autocast over fp32 weights; the other plugins their bf16 AMP "
        "(bf16 weights, fp32 masters). bf16_master (torch_ddp): bf16 weights, activations and residual stream, fp32 "
        "masters in the optimizer; faster on GPUs (measured gain and loss parity: docs/training.md)",
    ),
    "model_impl": ("auto", "auto | native | hf (auto: native Llama module, hf LlamaForCausalLM for hybrid)"),
    "n_layer": (4, "transformer blocks"),
    "n_head": (4, "attention heads (head dim = d_model / n_head, even)"),
    "d_model": (128, "hidden size"),
    "d_ff": (None, "SwiGLU inner size; null: 8/3 * d_model rounded up to a multiple of 64"),
    "seq_len": (128, "tokens per training sequence"),
    "vocab": (320, "model vocabulary (>= 257, the byte data's vocabulary; a multiple of 64 is fastest)"),
    "rope_theta": (10000.0, "RoPE base"),
    "steps": (200, "total optimizer steps; defines the lr schedule"),
    "stop_after": (None, "stop after this step (checkpoint, exit 0, no final model); schedule unchanged"),
    "micro_batch": (8, "sequences per data-parallel rank per micro step"),
    "grad_accum": (1, "micro steps per optimizer step"),
    "lr": (1.0e-3, "peak learning rate"),
    "min_lr_ratio": (0.1, "final lr = lr * min_lr_ratio (cosine)"),
    "warmup": (20, "linear warm-up steps"),
    "schedule": ("cosine", "cosine | constant (after warm-up)"),
    "weight_decay": (0.1, "AdamW weight decay (matrices only, not norms)"),
    "beta1": (0.9, "AdamW beta1"),
    "beta2": (0.95, "AdamW beta2"),
    "grad_clip": (1.0, "max global grad norm; 0 disables"),
    "optimizer": ("adamw", "adamw (torch, fused on CUDA) | hybrid_adam (ColossalAI; gemini always uses it)"),
    "ckpt_every": (50, "checkpoint every N steps (0: only on SIGUSR2, stop_after and at the end)"),
    "keep_ckpts": (2, "complete checkpoints kept in --ckpt-dir"),
    "ckpt_async": (
        True,
        "true: a save stalls the training only for a host-memory copy of the checkpoint; writing, fsync, the "
        "manifest and the verification run beside the training, waited for by the next save and the exit. false: "
        "the whole save stalls it",
    ),
    "collective_timeout_s": (
        None,
        "seconds a collective waits for a missing rank before it fails, in every process group of the run (null: "
        "torch's default, 30 min under gloo, 10 min under NCCL): a hung or lost rank then ends the training with an "
        "error instead of holding every node",
    ),
    "seed": (1234, "seeds model init, data order and RNGs"),
    "kernels": (
        [],
        "optional fused kernels (CUDA, native model): any of liger_rms_norm, liger_swiglu, liger_rope, "
        "liger_fused_ce (package liger-kernel), flash_attn_hopper (flash-attn-4, Hopper GPU, bf16)",
    ),
    "fp8": (
        None,
        "FP8 matmuls (torchao float8 training): null (off) | tensorwise | rowwise | rowwise_with_gw_hp; torch_ddp, "
        "a GPU of compute capability 8.9+, bf16 or bf16_master, compile: true, package torchao",
    ),
    "compile": (False, "torch.compile the model (GPU; torch_ddp/low_level_zero only, ignored otherwise)"),
    "deterministic": (
        False,
        "deterministic kernels (CUDA: torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG, no TF32, cuDNN "
        "deterministic): the same loss lines in two runs of one config, at a cost in speed; CPU is deterministic",
    ),
    "log_every": (10, "metrics line + progress line every N steps"),
}
DEFAULT_CONFIG: dict[str, Any] = {key: spec[0] for key, spec in CONFIG_SPEC.items()}

# Keys that may differ between a checkpoint and the run resuming it; any other difference is refused.
# The data-parallel size may change (a different node count), the model/optimizer layout may not.
RESUME_MUTABLE_KEYS = {
    "stop_after",
    "ckpt_every",
    "keep_ckpts",
    "ckpt_async",
    "collective_timeout_s",
    "log_every",
    "compile",
    "kernels",
    "deterministic",
    "fp8",
}
MODEL_KEYS = ("n_layer", "n_head", "d_model", "d_ff", "seq_len", "vocab", "rope_theta")


class ConfigError(ValueError):
    """A config the run cannot use; train.py exits with code 2 before any process group exists."""


def default_config_yaml() -> str:
    """The default train section as commented YAML (for the pipeline's config.yaml)."""
    lines = ["# train section: keys of train.py --config-json"]
    for key, (value, comment) in CONFIG_SPEC.items():
        lines.append(f"{key}: {json.dumps(value)}  # {comment}")
    return "\n".join(lines) + "\n"


def merge_config(user: dict[str, Any]) -> dict[str, Any]:
    """Defaults overridden by the user's keys; unknown keys are an error (typos must not pass silently)."""
    unknown = sorted(set(user) - set(DEFAULT_CONFIG))
    if unknown:
        raise ConfigError(f"unknown train config keys {unknown}; known: {sorted(DEFAULT_CONFIG)}")
    cfg = {**DEFAULT_CONFIG, **user}
    if cfg["d_ff"] is None:
        cfg["d_ff"] = 64 * math.ceil(8 * cfg["d_model"] / 3 / 64)
    return cfg


def validate_config(cfg: dict[str, Any], cuda: bool, world_size: int) -> None:
    """Everything checkable before launch: GPU-only plugins on CPU, layout, model shape."""
    name = cfg["plugin"]
    if name not in plugins.PLUGIN_TABLE:
        raise ConfigError(f"plugin {name!r} unknown; choose one of {plugins.PLUGINS}")
    spec = plugins.PLUGIN_TABLE[name]
    if "cpu" not in spec.devices and not cuda:
        cpu_ok = [p.name for p in plugins.PLUGIN_TABLE.values() if "cpu" in p.devices]
        raise ConfigError(
            f"plugin {name!r} cannot run on this CPU-only machine: {spec.cpu_refusal}. "
            f"Use plugin {' or '.join(cpu_ok)} on CPU."
        )
    if cfg["precision"] not in plugins.PRECISIONS:
        raise ConfigError(f"precision {cfg['precision']!r} unknown; choose one of {' | '.join(plugins.PRECISIONS)}")
    if cfg["precision"] not in spec.precisions:
        raise ConfigError(f"plugin {name!r} supports precision {' | '.join(spec.precisions)}, not {cfg['precision']!r}")
    tp, pp, sp = cfg["tp"], cfg["pp"], cfg["sp"]
    if not spec.parallel_axes and (tp, pp, sp) != (1, 1, 1):
        with_axes = [p.name for p in plugins.PLUGIN_TABLE.values() if p.parallel_axes]
        raise ConfigError(
            f"tp/pp/sp > 1 need plugin {' or '.join(with_axes)} (plugin {name!r}, tp={tp} pp={pp} sp={sp})"
        )
    if cfg["sp_mode"] not in ("all_to_all", "split_gather", "ring"):
        raise ConfigError(f"sp_mode {cfg['sp_mode']!r} unknown")
    if cfg["model_impl"] not in ("auto", "native", "hf"):
        raise ConfigError(f"model_impl {cfg['model_impl']!r} unknown")
    if cfg["model_impl"] != "auto" and cfg["model_impl"] not in spec.model_kinds:
        raise ConfigError(
            f"plugin {name!r} needs model_impl {' | '.join(spec.model_kinds)} (shardformer only knows transformers "
            f"models), not {cfg['model_impl']!r}"
        )
    kernel_problem = fused_kernels.problem(cfg["kernels"], cuda, model_impl(cfg), plugins.bf16_compute(cfg))
    if kernel_problem:
        raise ConfigError(kernel_problem)
    if cfg["fp8"] is not None and not (spec.fp8 and model_impl(cfg) == "native"):
        with_fp8 = [p.name for p in plugins.PLUGIN_TABLE.values() if p.fp8]
        raise ConfigError(
            f"fp8 converts lm.NativeLlama's linear layers before the plugin wraps the model: it needs plugin "
            f"{' or '.join(with_fp8)} and model_impl native (plugin {name!r}, model_impl {model_impl(cfg)!r})"
        )
    fp8_problem = fp8.problem(cfg["fp8"], cuda, plugins.bf16_compute(cfg), cfg["compile"])
    if fp8_problem:
        raise ConfigError(fp8_problem)
    own_sp_axis = cfg["sp_mode"] == "all_to_all"
    if sp > 1 and not own_sp_axis and sp != tp:
        raise ConfigError(f"sp_mode {cfg['sp_mode']!r} shares the tp group: set sp equal to tp ({tp})")
    ranks_per_replica = tp * pp * (sp if own_sp_axis else 1)
    if world_size % ranks_per_replica:
        raise ConfigError(f"world size {world_size} is not divisible by tp*pp*sp = {ranks_per_replica}")
    if cfg["d_model"] % cfg["n_head"] or (cfg["d_model"] // cfg["n_head"]) % 2:
        raise ConfigError("d_model must be a multiple of n_head with an even head dim")
    head_split = tp * (sp if own_sp_axis else 1)
    if cfg["n_head"] % head_split:
        raise ConfigError(f"n_head {cfg['n_head']} must be divisible by tp*sp = {head_split}")
    if cfg["vocab"] % tp:
        raise ConfigError(f"vocab {cfg['vocab']} must be divisible by tp {tp}")
    if cfg["seq_len"] % sp:
        raise ConfigError(f"seq_len {cfg['seq_len']} must be divisible by sp {sp}")
    if pp > cfg["n_layer"]:
        raise ConfigError(f"pp {pp} > n_layer {cfg['n_layer']}")
    if cfg["vocab"] < DATA_VOCAB:
        raise ConfigError(f"vocab {cfg['vocab']} < {DATA_VOCAB} (bytes + end-of-document token)")
    if cfg["schedule"] not in ("cosine", "constant"):
        raise ConfigError(f"schedule {cfg['schedule']!r} unknown")
    if cfg["optimizer"] not in ("adamw", "hybrid_adam"):
        raise ConfigError(f"optimizer {cfg['optimizer']!r} unknown")
    timeout = cfg["collective_timeout_s"]
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ConfigError(f"collective_timeout_s must be a number of seconds > 0 or null, not {timeout!r}")
    if not isinstance(cfg["ckpt_async"], bool):
        raise ConfigError(f"ckpt_async must be true or false, not {cfg['ckpt_async']!r}")
    if cfg["steps"] < 1 or cfg["micro_batch"] < 1 or cfg["grad_accum"] < 1 or cfg["log_every"] < 1:
        raise ConfigError("steps, micro_batch, grad_accum and log_every must be >= 1")
    if cfg["stop_after"] is not None and not 0 < cfg["stop_after"] <= cfg["steps"]:
        raise ConfigError("stop_after must be in 1..steps (or null)")


def model_impl(cfg: dict[str, Any]) -> str:
    """native (lm.NativeLlama) or hf (transformers' LlamaForCausalLM); auto: the plugin's model kind."""
    return plugins.spec_of(cfg).model_kind if cfg["model_impl"] == "auto" else cfg["model_impl"]


# ----------------------------------------------------------------------------------------------------------
# Model: a Llama-style decoder. NativeLlama uses the parameter names of transformers' LlamaForCausalLM, so a
# state dict moves freely between the two (hybrid trains the HF one, evaluate.py loads NativeLlama).
# ----------------------------------------------------------------------------------------------------------
@dataclass
class ModelConfig:
    vocab: int
    n_layer: int
    n_head: int
    d_model: int
    d_ff: int
    seq_len: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    @classmethod
    def from_train_config(cls, cfg: dict[str, Any]) -> ModelConfig:
        return cls(**{key: cfg[key] for key in MODEL_KEYS})


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.kernel: Any = None  # fused_kernels.install: a fused replacement

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None:
            return self.kernel(x, self.weight, self.eps)
        # fp32 statistics, like LlamaRMSNorm, so both implementations agree.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.head_dim = cfg.d_model // cfg.n_head
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.o_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.kernel: Any = None  # fused_kernels.install: a fused RoPE
        self.attend: Any = None  # fused_kernels.install: causal attention, (b, h, s, d) in and out, like SDPA

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            proj(x).view(b, t, self.n_head, self.head_dim).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        if self.kernel is not None:
            q, k = self.kernel(q, k, cos, sin)
        else:
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        if self.attend is not None:
            y = self.attend(q, k, v)
        else:  # is_causal=True: SDPA picks flash/efficient kernels on GPU and never sees a dense mask.
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)
        self.kernel: Any = None  # fused_kernels.install: a fused silu(gate) * up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None:
            return self.down_proj(self.kernel(self.gate_proj(x), self.up_proj(x)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)


class Output:
    """Minimal stand-in for transformers' CausalLMOutput (attribute access, cheap under torch.compile)."""

    def __init__(self, logits: torch.Tensor | None, loss: torch.Tensor | None) -> None:
        self.logits = logits
        self.loss = loss


class NativeLlama(nn.Module):
    """Llama-style causal LM: RMSNorm, RoPE, SwiGLU, SDPA causal attention, untied head."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Decoder(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        cos, sin = rope_tables(cfg)
        # Non-persistent: the state dict holds only parameters, exactly like LlamaForCausalLM's.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.fused_ce: Any = None  # fused_kernels.install: loss from hidden states, lm_head weight, labels
        self.apply(init_weights)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **_: Any) -> Output:
        t = input_ids.shape[1]
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        for block in self.model.layers:
            x = block(x, cos, sin)
        h = self.model.norm(x)
        if self.fused_ce is not None and labels is not None:  # the logits are never materialized
            return Output(None, self.fused_ce(h, self.lm_head.weight, labels))
        logits = self.lm_head(h)
        loss = causal_lm_loss(logits, labels) if labels is not None else None
        return Output(logits, loss)


def rope_tables(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    head_dim = cfg.d_model // cfg.n_head
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.outer(torch.arange(cfg.seq_len, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def init_weights(module: nn.Module) -> None:
    # Same scheme as transformers' LlamaPreTrainedModel (normal, std 0.02).
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy: position i predicts labels[i + 1] (the transformers convention)."""
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))


def hf_llama(cfg: ModelConfig, attn_implementation: str) -> nn.Module:
    """transformers' LlamaForCausalLM from a config (no hub access)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_cfg = LlamaConfig(
        vocab_size=cfg.vocab,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_head,
        max_position_embeddings=cfg.seq_len,
        rope_theta=cfg.rope_theta,
        rms_norm_eps=cfg.norm_eps,
        tie_word_embeddings=False,
        use_cache=False,
        attn_implementation=attn_implementation,
    )
    return LlamaForCausalLM(hf_cfg)


def build_model(train_cfg: dict[str, Any], cuda: bool) -> nn.Module:
    """The model a run trains, seeded so every rank builds identical weights."""
    torch.manual_seed(train_cfg["seed"])
    mcfg = ModelConfig.from_train_config(train_cfg)
    if model_impl(train_cfg) == "native":
        model = NativeLlama(mcfg)
        fused_kernels.install(model, train_cfg["kernels"])
        if train_cfg["fp8"] is not None:
            fp8.convert(model, train_cfg["fp8"])
        return model
    # Without ColossalAI's flash attention (CPU), shardformer's attention takes the mask transformers builds;
    # with "sdpa" that mask is None (causality left to SDPA's is_causal) and the replaced attention ignores
    # causality. "eager" makes transformers build an explicit causal mask.
    shardformer = plugins.spec_of(train_cfg).shardformer
    attn = "sdpa" if not shardformer or plugins.flash_attention_ok(train_cfg, cuda) else "eager"
    return hf_llama(mcfg, attn)


def matmul_params(model: nn.Module) -> int:
    """Parameters taking part in matmuls (all but the input embedding): N of the 6*N*tokens FLOP estimate."""
    return sum(p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name)


def clean_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip wrapper prefixes (torch.compile, DDP) so keys match LlamaForCausalLM's."""
    out = {}
    for key, value in sd.items():
        while key.startswith(("_orig_mod.", "module.")):
            key = key.split(".", 1)[1]
        out[key] = value.detach().to("cpu", copy=True)
    return out


def load_final_model(path: str | Path) -> tuple[NativeLlama, dict[str, Any]]:
    """Load train.py's --out file into a NativeLlama on CPU, in fp32."""
    blob = torch.load(path, map_location="cpu", weights_only=False)
    model = NativeLlama(ModelConfig(**blob["model_config"]))
    state = {k: v.float() for k, v in blob["state_dict"].items()}
    model.load_state_dict(state, strict=True)
    return model.eval(), blob


# ----------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------
def load_tokens(data_dir: str | Path, split: str) -> np.ndarray:
    stats = json.loads((Path(data_dir) / "stats.json").read_text())
    if stats.get("format") != DATA_FORMAT:
        raise ValueError(f"{data_dir}: data format {stats.get('format')!r}, expected {DATA_FORMAT!r}")
    return np.memmap(Path(data_dir) / f"{split}.bin", dtype=np.dtype(stats["dtype"]), mode="r")


def batch_for_step(
    tokens: np.ndarray, step: int, seed: int, seq_len: int, global_rows: int, first_row: int, rows: int
) -> torch.Tensor:
    """Rows first_row..first_row+rows of the global batch of optimizer step `step`.

    Offsets are a pure function of (seed, step): the data position is the step, so a resume continues the
    stream exactly, and the global batch does not depend on how it is split across ranks.
    """
    if len(tokens) <= seq_len:
        raise ValueError(f"only {len(tokens)} training tokens for seq_len {seq_len}")
    rng = np.random.default_rng([seed, 0xDA7A, step])
    offsets = rng.integers(0, len(tokens) - seq_len, size=global_rows)[first_row : first_row + rows]
    batch = np.stack([tokens[o : o + seq_len] for o in offsets]).astype(np.int64)
    return torch.from_numpy(batch)


# ----------------------------------------------------------------------------------------------------------
# LR schedule
# ----------------------------------------------------------------------------------------------------------
class WarmupCosine:
    """lr multiplier: linear warm-up, then cosine (or constant) decay to min_lr_ratio at `total` steps.

    A class (not a lambda) so LambdaLR's state dict carries it.
    """

    def __init__(self, total: int, warmup: int, min_ratio: float, schedule: str) -> None:
        self.total, self.warmup, self.min_ratio, self.schedule = total, warmup, min_ratio, schedule

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if self.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


# ----------------------------------------------------------------------------------------------------------
# ColossalAI glue
# ----------------------------------------------------------------------------------------------------------
def init_colossalai(cuda: bool, seed: int, collective_timeout_s: float | None = None) -> None:
    """ColossalAI's distributed start (under torchrun), with compat.py's patches (on CPU: its CPU accelerator).
    `collective_timeout_s`: the timeout of every process group made from here on (None: torch's defaults)."""
    import colossalai
    import compat

    if collective_timeout_s is not None:
        # ColossalAI's launch takes no timeout, and every new_group (the plugin's, the checkpointer's) defaults to
        # these module-level values, read when a group is made.
        import torch.distributed.distributed_c10d as c10d

        c10d.default_pg_timeout = c10d.default_pg_nccl_timeout = timedelta(seconds=collective_timeout_s)
    if not cuda:
        colossalai.accelerator.set_accelerator("cpu")
    compat.apply_patches(cuda)
    colossalai.launch_from_torch(seed=seed)


@dataclass
class Boosted:
    """A model, optimizer and lr scheduler boosted by one plugin. Keep `plugin` referenced: its process groups
    die with it."""

    plugin: Any
    booster: Any
    model: Any
    optimizer: Any
    scheduler: Any
    n_matmul: int  # parameters in matmuls (the 6*N*tokens FLOP estimate), counted before any sharding
    dp_rank: int
    dp_size: int


def boost(cfg: dict[str, Any], cuda: bool, model: nn.Module | None = None, log: Any = print) -> Boosted:
    """Plugin, booster, model (built from cfg unless given), optimizer and schedule, as the plugin table says."""
    from colossalai.booster import Booster

    spec = plugins.spec_of(cfg)
    plugin = plugins.make_plugin(cfg, cuda)
    booster = Booster(plugin=plugin)
    model = build_model(cfg, cuda) if model is None else model
    n_matmul = matmul_params(model)
    if spec.place_before_boost:
        model = model.to(torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu"))
    if cfg["compile"]:
        if cuda and spec.compile_ok:
            model.compile()  # in place: parameter names (and checkpoints) stay unprefixed
        else:
            log(f"compile: ignored (needs CUDA and a plugin whose wrapper compiles; plugin {spec.name})")
    optimizer = plugins.make_optimizer(cfg, model, cuda)
    schedule = WarmupCosine(cfg["steps"], cfg["warmup"], cfg["min_lr_ratio"], cfg["schedule"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    if plugins.wraps_masters(cfg):  # after the scheduler: it takes a torch optimizer, and reads only lr
        import master_weights

        optimizer = master_weights.MasterWeightOptimizer(optimizer)
    fp32 = plugins.fp32_weights(cfg, model)  # the plugin's bf16 cast would be all its masters start from
    model, optimizer, _, _, scheduler = booster.boost(model, optimizer, lr_scheduler=scheduler)
    if fp32 is not None:
        plugins.reseed_zero_masters(optimizer, fp32)
    dp_rank, dp_size = data_parallel_layout(plugin)
    return Boosted(plugin, booster, model, optimizer, scheduler, n_matmul, dp_rank, dp_size)


def data_parallel_layout(plugin: Any) -> tuple[int, int]:
    """(dp rank, dp size): ranks sharing a dp index see the same data (tp/pp/sp peers)."""
    import torch.distributed as dist

    group = getattr(plugin, "dp_group", None)
    if group is None:
        return dist.get_rank(), dist.get_world_size()
    return dist.get_rank(group), dist.get_world_size(group)


def model_inputs(ids: torch.Tensor, cfg: dict[str, Any], labels: bool) -> dict[str, torch.Tensor]:
    """Keyword inputs of the model.

    Hybrid without flash attention gets an explicit all-ones attention mask: with it, transformers' eager
    path builds a (b, 1, s, s) causal mask, which shardformer's attention checks for exactly (without one
    the mask is (b, 1, s, s + 1) and sequence parallelism fails). With flash attention no mask is best:
    ColoAttention then runs plain causal attention instead of a padded varlen one.
    """
    inputs = {"input_ids": ids}
    if plugins.spec_of(cfg).shardformer and not plugins.flash_attention_ok(cfg, ids.is_cuda):
        inputs["attention_mask"] = torch.ones_like(ids)
    if labels:
        inputs["labels"] = ids
    return inputs


def autocast(cfg: dict[str, Any], device_type: str) -> contextlib.AbstractContextManager:
    """bf16 autocast where the plugin keeps fp32 weights (plugins.autocasts); the others cast the model."""
    if plugins.autocasts(cfg):
        return torch.autocast(device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def forward_logits(booster: Any, model: nn.Module, ids: torch.Tensor, cfg: dict[str, Any]) -> torch.Tensor | None:
    """Logits of the boosted model (this rank's shard under tp; None on non-last pipeline stages)."""
    if not plugins.uses_pipeline(cfg):
        with autocast(cfg, ids.device.type):
            return model(**model_inputs(ids, cfg, labels=False)).logits
    # The schedule calls the criterion on the last stage even when no loss is wanted.
    out = booster.execute_pipeline(
        iter([model_inputs(ids, cfg, labels=False)]),
        model,
        lambda o, _: o["logits"].float().mean(),
        None,
        return_loss=False,
        return_outputs=True,
    )
    outputs = out.get("outputs")
    return None if outputs is None else outputs["logits"] if isinstance(outputs, dict) else outputs.logits


def iter_metrics(path: str | Path, events: bool = False) -> Iterator[dict[str, Any]]:
    """The metrics file's step lines; with `events`, its event records too ("event": checkpoints, resumes)."""
    p = Path(path)
    if not p.exists():
        return
    for line in p.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            if events or "event" not in record:
                yield record
