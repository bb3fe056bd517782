"""Train a small Llama-style LM with a ColossalAI 0.5.0 Booster; run under torchrun (one or many nodes).

    torchrun --nproc_per_node=P [--nnodes N --node_rank R --rdzv... ] workflows/scripts/train.py \\
        --data-dir DATA --out FINAL.pt --ckpt-dir CKPTS --metrics METRICS.jsonl --config-json '{"steps": 100}'
    python workflows/scripts/train.py --print-default-config     # the defaults as YAML

Without torchrun's environment it runs as a single process (rank 0 of 1).

Config keys (--config-json, a JSON object; omitted keys take the defaults printed by --print-default-config):
    plugin        torch_ddp | low_level_zero | gemini | hybrid. low_level_zero and gemini need CUDA: on a CPU
                  machine the run exits with code 2 before any process group is created.
    tp, pp, sp    hybrid only: tensor-parallel, pipeline and sequence-parallel sizes (default 1)
    sp_mode       hybrid: all_to_all (own axis) | split_gather | ring (these two share the tp group: sp == tp)
    zero_stage    hybrid: 0/1/2; low_level_zero: 1/2 (0 means 2)
    precision     fp32 | bf16 | bf16_master. bf16: torch_ddp runs torch.autocast(bf16) over fp32 weights; the other
                  plugins their own bf16 mixed precision (bf16 weights, fp32 masters kept by the optimizer).
                  bf16_master (torch_ddp): that mixed precision for torch_ddp, no autocast: bf16 weights, activations
                  and residual stream, fp32 masters in the optimizer (master_weights.py)
    model_impl    auto | native | hf. auto: the native module (SDPA is_causal, compiles well) except hybrid,
                  whose shardformer needs transformers' LlamaForCausalLM. Both share parameter names.
    n_layer, n_head, d_model, d_ff (null: 8/3*d_model rounded up to 64), seq_len, vocab (>= 257), rope_theta
    steps         total optimizer steps; fixes the lr schedule
    stop_after    stop after this step: checkpoint, exit 0, no final model (schedule unchanged; null: off)
    micro_batch   sequences per data-parallel rank per micro step
    grad_accum    micro steps per optimizer step (pipeline: the number of microbatches)
    lr, min_lr_ratio, warmup, schedule (cosine | constant)
    weight_decay, beta1, beta2, grad_clip (0: off), optimizer (adamw | hybrid_adam)
    ckpt_every    checkpoint every N steps (0: only on SIGUSR2 / stop_after / end); keep_ckpts: how many kept
    ckpt_async    true (default): a save stalls the training only for a host-memory copy of the checkpoint; the rest
                  of it runs beside the training (below); false: the whole save stalls it
    collective_timeout_s  seconds a collective waits for a missing rank before it fails (every process group; null:
                  torch's default, 30 min gloo / 10 min NCCL)
    seed          model init, data order, RNGs
    kernels       optional fused kernels for the native model on CUDA, from the liger-kernel package (a list of
                  liger_rms_norm, liger_swiglu, liger_rope, liger_fused_ce; default []: none, no package needed)
    fp8           null | tensorwise | rowwise | rowwise_with_gw_hp: FP8 matmuls in the decoder's linear layers
                  (torchao float8 training; fp8.py): torch_ddp, compute capability 8.9+, bf16 compute, compile
    compile       torch.compile the model (CUDA, torch_ddp / low_level_zero; ignored otherwise)
    deterministic deterministic CUDA kernels (use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG, no TF32): the
                  same loss lines in two runs of one config, slower; CPU runs are deterministic anyway
    log_every     metrics line + progress line every N steps

Checkpoints (--ckpt-dir/step_NNNNNNNN, see checkpoint.py): sharded through the Booster (model and optimizer with
shard=True, the lr scheduler with save_lr_scheduler; which rank writes what is the plugin's checkpoint IO), plus
per-rank RNG states and, where the plugin keeps them apart from the model (bf16 low_level_zero / hybrid), fp32
master weights. Written to a temp dir, fsynced with a manifest of sizes and sha256, then renamed (a temp dir that a
killed save left is removed at the next start, named); the last keep_ckpts verified ones kept. With ckpt_async (the
default) the training stands still only while each rank takes a host-memory copy of what it writes (the plugin's IO
runs with torch.save captured, background_save.py); writing, fsync, the manifest, the rename, the verification and
pruning then run on a thread while the training goes on. The next save waits for them first, and so does the exit:
the last save (the end, stop_after, SIGUSR2) is whole before the run leaves, so a preempt file always names a
complete, verified checkpoint. Their failure (a full disk) fails that next save, or the exit, on every rank together
with the message below; a run killed meanwhile leaves only the temp dir, and resumes from the checkpoint before.
A rerun resumes from the latest one that verifies (a damaged one is skipped, named) exactly on the same world size
(on any number of ranks: every run first settles DDP's gradient buckets, settle_ddp_buckets); on another world size
the plugin's IO reshards model and optimizer and the run logs what per-rank state could not follow. The data
position is the step (batches are a pure function of seed and step). The metrics file keeps its step lines up to the
resumed step; later ones (a run that died after its last checkpoint) become "superseded" events, the record of lost
work. What each plugin needs (device, precision, model kind, checkpoint IO, grad clipping, pipeline schedule) is one
table: plugins.PLUGIN_TABLE.

Preemption: SIGUSR2 sets a flag; at the next step boundary the ranks agree (max-reduce), checkpoint, rank 0
writes the step number to $MULTINODE_PREEMPT_FILE (when set), and every rank leaves with exit code 0.

A write that fails (a full disk above all; diskspace.py): a checkpoint save, a metrics line or event, the metrics
file's rewrite at start or the preempt file. Every rank leaves at once with exit 1 and the same line on stderr,
`train.py: cannot save checkpoint <dir>: no space left on device (rank R, writing <file>); N bytes needed (the size
of the previous checkpoint, step_...), M bytes free in <ckpt dir>; the partial save was removed; the previous
checkpoint <dir> is kept` (a metrics line: `cannot write the metrics file <path>: ...; N bytes needed (the line), M
bytes free in <folder>`, the file cut back to its whole lines). The ranks agree after rank 0's write (an all-reduce of
an ok flag, which also serves as the barrier), so none is left waiting in a collective.

Final model (--out, rank 0): torch.save({"model_config", "state_dict" (unsharded, LlamaForCausalLM names),
"train_config", "step"}), loadable on CPU in one process by lm.load_final_model.

Metrics (--metrics, rank 0, JSON lines): step, steps (the total), loss (mean over ranks and the steps since the
last line), lr, tokens, tokens_per_s, mfu (6*N*tokens/s over the GPUs' bf16 peak; null when unknown), elapsed
(training seconds so far), step_ms, ckpt_s (seconds spent saving checkpoints since the last line), time and wall
(Unix seconds). Events, also rank 0, with "event", "step" and "wall": checkpoint_begin and checkpoint_end around
every save's stall (checkpoint_end with fsync_s, manifest_s, verify_s: the seconds fsyncing, hashing the manifest and
verifying the new checkpoint took; with ckpt_async snapshot_s, the seconds the host-memory copy took, and those three
come with checkpoint_written), checkpoint_written (ckpt_async: the save of "step" is on disk and verified, said when
the next save or the exit has waited for it, inside that save's stall: write_s (writing the copies), fsync_s,
manifest_s, verify_s, background_s (the whole second half, beside the training) and waited_s, the seconds the
training stood still for it), resume (with restore_s, the seconds choosing and loading took, of which verify_s
verifying) after loading a checkpoint, signal (with "signal": "SIGUSR2" and "received", the Unix time rank 0 got it,
null where only another rank did) when the ranks act on a SIGUSR2, before its checkpoint. Throughput is wall clock
between synchronised points: each line's loss is an all-reduce read back to the host, which waits for every kernel
queued before it, and the interval since the previous line (minus ckpt_s) is what tokens_per_s, step_ms and mfu
divide by. So the logged intervals add up to the run's training time, and
tokens_per_s equals the tokens between two lines over their wall-clock gap less ckpt_s. Under the multinode
executor, $MULTINODE_METRICS_FILE (beside the job's log) is made a link to that file: `multinode status` and
Snakemake's progress lines read it there.

Curves (rank 0): each metrics line's loss, lr, tokens_per_s, mfu and step_ms also go to TensorBoard
($MULTINODE_TENSORBOARD_DIR, with the tensorboard package), W&B and MLflow where installed and configured, through
the plugin's training/tracking.py: every run of the job continues one run of each (docs/training-contract.md,
"Training curves"). A tracker's failure is warned of once and never fails the training.

Busy time (busy_s on every step line, rank 0 writing each node's figure): in synchronous data parallelism every rank
runs the same steps at the same rate, the fast ones waiting for the slowest in the gradient sync, so only the time a
rank spends computing tells a slow node (`multinode torchrun`'s straggler check, on_straggler). Each rank times
each step from its start (the batch) to just before the last micro step's backward, where torch_ddp starts syncing
gradients (the earlier micro steps' backwards run under no_sync): CUDA events on the GPU (no synchronisation; read
at the line's loss read-back, which waits for them), perf_counter on CPU. Plugins that gather or reduce inside the
forward (gemini, zero, tensor parallelism) have that wait in it: a coarser figure; pipeline runs report none. The
ranks' host names are gathered once, their per-step means at every line (one all_gather of one number, on the
gloo side group); busy_s is per node, the mean over its ranks.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkpoint  # noqa: E402
import diskspace  # noqa: E402
import lm  # noqa: E402
import plugins  # noqa: E402

# ColossalAI's import-time and per-save noise that says nothing about this run.
for _pattern in (".*tensornvme.*", ".*apex.*", ".*broadcast_buffers.*deprecated.*"):
    warnings.filterwarnings("ignore", message=_pattern)
_NOISE = ("unsharded checkpointing", "split to checkpoint shards")
logging.getLogger().addFilter(lambda r: not any(n in r.getMessage() for n in _NOISE))

# bf16 dense peak FLOP/s per GPU, by a substring of torch.cuda.get_device_name().
GPU_PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12}
EXIT_CONFIG = 2
EXIT_WRITE_FAILED = 1  # a checkpoint, metrics line or preempt file could not be written (diskspace.WriteFailed)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", help="preprocess.py output (train.bin, stats.json)")
    p.add_argument("--out", help="final model file (rank 0)")
    p.add_argument("--ckpt-dir", help="checkpoint directory (shared by all nodes)")
    p.add_argument("--metrics", help="metrics JSON lines (rank 0)")
    p.add_argument("--config-json", default="{}", help="train section as a JSON object")
    p.add_argument("--print-default-config", action="store_true", help="print the default config as YAML")
    args = p.parse_args(argv)
    if not args.print_default_config:
        missing = [
            f"--{k.replace('_', '-')}" for k in ("data_dir", "out", "ckpt_dir", "metrics") if getattr(args, k) is None
        ]
        if missing:
            p.error(f"missing {', '.join(missing)}")
    return args


def ensure_dist_env() -> None:
    """Let a plain `python train.py` run as a 1-process job (torchrun sets these)."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )


class Preemption:
    """SIGUSR2 -> flag; ranks agree at step boundaries so all of them checkpoint at the same step."""

    def __init__(self) -> None:
        self.flag = False
        self.at: float | None = None  # when this rank got the first SIGUSR2 (Unix seconds)
        self.group: Any = None
        signal.signal(signal.SIGUSR2, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.flag = True  # only a flag and its time: the handler may interrupt a collective
        if self.at is None:
            self.at = time.time()

    def setup_group(self) -> None:
        # A gloo side group keeps this per-step check off the GPU stream (no device sync under NCCL).
        self.group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None

    def requested(self) -> bool:
        t = torch.tensor([1 if self.flag else 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(t.item())


@dataclass
class Run:
    """Everything the training loop needs."""

    args: argparse.Namespace
    cfg: dict[str, Any]
    spec: plugins.PluginSpec
    cuda: bool
    rank: int
    world: int
    boosted: lm.Boosted
    ckpt: checkpoint.Checkpointer
    tokens: Any
    device: torch.device

    # Shorthands of the boosted objects.
    @property
    def booster(self) -> Any:
        return self.boosted.booster

    @property
    def model(self) -> Any:
        return self.boosted.model

    @property
    def optimizer(self) -> Any:
        return self.boosted.optimizer

    @property
    def scheduler(self) -> Any:
        return self.boosted.scheduler

    @property
    def dp_rank(self) -> int:
        return self.boosted.dp_rank

    @property
    def dp_size(self) -> int:
        return self.boosted.dp_size


def log0(run_rank: int, msg: str) -> None:
    if run_rank == 0:
        print(msg, flush=True)


def setup(args: argparse.Namespace, cfg: dict[str, Any], cuda: bool) -> Run:
    if cfg["deterministic"]:
        # before the first cuBLAS call (the workspace size is read when its handle is made); an op without a
        # deterministic kernel then raises, naming itself, instead of silently varying
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    lm.init_colossalai(cuda, cfg["seed"], cfg["collective_timeout_s"])
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    if cuda and not cfg["deterministic"]:  # TF32 matmuls: faster, and their results may vary between kernels
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    b = lm.boost(cfg, cuda, log=lambda msg: log0(rank, msg))
    ckpt = checkpoint.Checkpointer(b.booster, b.model, b.optimizer, b.scheduler, args.ckpt_dir, cfg, b.dp_size)
    tokens = lm.load_tokens(args.data_dir, "train")
    run = Run(args, cfg, plugins.spec_of(cfg), cuda, rank, world, b, ckpt, tokens, device)
    settle_ddp_buckets(run)  # before any checkpoint loads: a resume's first step sums as a straight run's does
    return run


def check_data(data_dir: str, cfg: dict[str, Any]) -> None:
    stats = json.loads((Path(data_dir) / "stats.json").read_text())
    if stats["vocab_size"] > cfg["vocab"]:
        raise lm.ConfigError(f"data vocab {stats['vocab_size']} > model vocab {cfg['vocab']}")


class BusyClock:
    """This rank's busy seconds: from each step's start to just before its first gradient sync (module docstring)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.cpu_s = 0.0
        self.t0 = 0.0
        self.opened: Any = None
        self.spans: list[tuple[Any, Any]] = []  # CUDA: (start, end) events, read at the next line
        self.steps = 0

    def start(self) -> None:
        if self.cuda:
            self.opened = torch.cuda.Event(enable_timing=True)
            self.opened.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.spans.append((self.opened, end))
        else:
            self.cpu_s += time.perf_counter() - self.t0
        self.steps += 1

    def take(self) -> float:
        """Busy seconds per step since the last take (0.0 without a step)."""
        if self.spans:
            self.spans[-1][1].synchronize()  # done already: the line's loss read-back waited for every kernel
        total = self.cpu_s + sum(a.elapsed_time(b) for a, b in self.spans) / 1000
        per_step = total / self.steps if self.steps else 0.0
        self.cpu_s, self.spans, self.steps = 0.0, [], 0
        return per_step


def train_step(run: Run, step: int, busy: BusyClock | None = None) -> torch.Tensor | None:
    """One optimizer step; returns this rank's loss (None on pipeline stages without one). `busy` times the step's
    compute up to its first gradient sync (not on the pipeline path, whose schedule interleaves both)."""
    cfg = run.cfg
    if busy is not None:
        busy.start()
    mb, ga = cfg["micro_batch"], cfg["grad_accum"]
    rows = mb * ga
    batch = lm.batch_for_step(
        run.tokens, step, cfg["seed"], cfg["seq_len"], run.dp_size * rows, run.dp_rank * rows, rows
    )
    if run.cuda:
        batch = batch.pin_memory().to(run.device, non_blocking=True)
    if plugins.uses_pipeline(cfg):
        out = run.booster.execute_pipeline(
            iter([lm.model_inputs(batch, cfg, labels=True)]),
            run.model,
            lambda o, _: o.loss,
            run.optimizer,
            return_loss=True,
        )
        loss = out["loss"]
    else:
        loss = torch.zeros((), device=run.device)
        for m in range(ga):
            ids = batch[m * mb : (m + 1) * mb]
            skip_sync = m < ga - 1 and run.boosted.plugin.support_no_sync()
            with run.booster.no_sync(run.model, run.optimizer) if skip_sync else contextlib.nullcontext():
                micro_loss = forward_loss(run, ids) / ga
                if busy is not None and m == ga - 1:
                    busy.stop()  # this backward syncs the gradients: fast ranks wait for the slowest here
                run.booster.backward(micro_loss, run.optimizer)
            loss += micro_loss.detach()
    if run.spec.grad_clip == "loop" and cfg["grad_clip"] > 0:
        run.optimizer.clip_grad_by_norm(cfg["grad_clip"])  # the others clip inside step (max_norm)
    run.optimizer.step()
    run.optimizer.zero_grad()
    run.scheduler.step()
    return loss


def forward_loss(run: Run, ids: torch.Tensor) -> torch.Tensor:
    """The boosted model's loss on one micro batch (not the pipeline path)."""
    with lm.autocast(run.cfg, run.device.type):
        return run.model(**lm.model_inputs(ids, run.cfg, labels=True)).loss


def settle_ddp_buckets(run: Run) -> None:
    """Before the first step of every run, fresh or resumed: one throwaway forward and backward (zeros in, the
    gradients dropped, the RNG states kept) where the model is wrapped in torch's DDP (torch_ddp; hybrid with ZeRO 0
    and no pipeline), so every step of every run all-reduces its gradients in the same bucket layout.

    Why: DDP lays its gradient buckets out in parameter order, and after the first backward that syncs lays them out
    again in the order the gradients became ready (Reducer::rebuild_buckets). Each bucket is all-reduced as one flat
    buffer, and gloo's all-reduce sums an element in a rank order that depends on where the element lies in
    that buffer. With 2 ranks a+b == b+a; with 3 or more the association differs and so do the last
    bits. A resumed run's first step would all-reduce in the constructor's layout where the interrupted run used
    the rebuilt one, and its model would drift from a straight run's. The buckets are rebuilt at the next forward,
    in the order this backward made them ready, which is the real steps' order (same graph, same shapes): the
    overlap of communication with the backward is what it was."""
    from torch.nn.parallel import DistributedDataParallel

    if not any(isinstance(m, DistributedDataParallel) for m in run.model.modules()):
        return
    rng = checkpoint.rng_state()
    ids = torch.zeros((run.cfg["micro_batch"], run.cfg["seq_len"]), dtype=torch.int64, device=run.device)
    run.model.train()
    run.booster.backward(forward_loss(run, ids), run.optimizer)
    run.optimizer.zero_grad()
    checkpoint.set_rng_state(rng)


def mean_loss(run: Run, loss_sum: torch.Tensor, count: int) -> float:
    """Mean loss over ranks holding one (all but early pipeline stages) and the logged steps."""
    t = torch.stack([loss_sum.float().to(run.device), torch.tensor(float(count), device=run.device)])
    dist.all_reduce(t)
    return (t[0] / t[1]).item() if t[1] > 0 else float("nan")


def mfu(run: Run, tokens_per_s: float) -> float | None:
    if not run.cuda or not plugins.bf16_compute(run.cfg):
        return None
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in GPU_PEAK_BF16.items() if k in name), None)
    return None if peak is None else 6 * run.boosted.n_matmul * tokens_per_s / (peak * run.world)


def prepare_metrics(path: str, resumed_step: int) -> str | None:
    """Keep step lines up to the resumed step, so a rerun appends without duplicate steps. Later step lines are the
    work a failure threw away: kept as "superseded" events (readers of step lines skip events), for the goodput
    ledger's lost work; events are history and stay. Written aside and renamed: a write that fails (said in the
    returned message; None: written) leaves the file as it was."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    records = lm.iter_metrics(p, events=True)
    text = "".join(
        json.dumps(m if "event" in m or m["step"] <= resumed_step else {**m, "event": "superseded"}) + "\n"
        for m in records
    )
    return diskspace.replace_file(p, text, "the metrics file", "the rewritten file")


def append_metrics(path: str, record: dict[str, Any]) -> str | None:
    """One JSON line at the end of the metrics file (rank 0). A write that fails is cut off again, so the file keeps
    whole lines only, and said in the returned message (the path, the line's bytes, the bytes free); None: written."""
    p = Path(path)
    line = json.dumps(record) + "\n"
    try:
        size = p.stat().st_size
    except OSError:
        size = 0
    try:
        with open(p, "a") as f:
            f.write(line)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.truncate(p, size)
        return diskspace.cannot_write(f"the metrics file {p}", err, len(line.encode()), "the line", p.parent)
    return None


def link_metrics_file(path: str) -> None:
    """Make $MULTINODE_METRICS_FILE a link to the metrics file: the executor's status and progress lines read the
    job's metrics there without knowing where this training keeps them (beside its checkpoints, for resumes)."""
    target = os.environ.get("MULTINODE_METRICS_FILE")
    if not target:
        return
    link = Path(target)
    tmp = link.with_name(link.name + ".tmp")
    try:
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(Path(path).resolve())
        os.replace(tmp, link)  # atomic: a requeued run replaces its earlier run's link
    except OSError as e:  # progress display only: never a reason to stop the training
        print(f"train.py: could not link {target}: {e}", file=sys.stderr, flush=True)


def write_preempt_file(step: int) -> None:
    """Rank 0, after the checkpoint: the job script requeues the job when it finds the file. One that cannot be
    written is an error naming it (WriteFailed; the other ranks have left): no requeue, the job fails."""
    target = os.environ.get("MULTINODE_PREEMPT_FILE")
    if not target:
        return
    message = diskspace.replace_file(Path(target), f"{step}\n", "the preempt file", "the step")
    if message is not None:
        raise diskspace.WriteFailed(f"{message}; checkpointed step {step}, but the job is not requeued")


def write_event(run: Run, event: str, step: int, wall: float, **extra: Any) -> None:
    """A metrics event (docs/training-contract.md), rank 0: where the goodput ledger cuts a run's time. Every rank
    calls it: a line that cannot be written fails the training on every rank at once (diskspace.agree)."""
    record = {"event": event, "step": step, "wall": round(wall, 6), **extra}
    failure = append_metrics(run.args.metrics, record) if run.rank == 0 else None
    diskspace.agree(run.ckpt.group, run.world, failure)


def save_final(run: Run, state: checkpoint.TrainState) -> None:
    """Unsharded state dict gathered by the plugin's checkpoint IO, re-saved with the model config."""
    out = Path(run.args.out)
    staging = out.with_name(f".{out.name}.booster.bin")
    if run.rank == 0:
        out.parent.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    run.booster.save_model(run.model, str(staging), shard=False)
    dist.barrier()
    if run.rank == 0:
        sd = lm.clean_state_dict(torch.load(staging, map_location="cpu", weights_only=True))
        blob = {
            "format": "llama-lm-v1",
            "model_config": dataclasses.asdict(lm.ModelConfig.from_train_config(run.cfg)),
            "state_dict": sd,
            "train_config": run.cfg,
            "step": state.step,
            "tokens": state.tokens,
        }
        tmp = out.with_name(f".{out.name}.tmp")
        torch.save(blob, tmp)
        os.replace(tmp, out)
        staging.unlink()
    dist.barrier()


class Logger:
    """Accumulates losses between log lines; rank 0 writes metrics and a progress line.

    Intervals are wall clock between synchronised points (the start of the loop, then every log line's loss read
    back to the host), so no queued GPU work escapes them. Checkpoint saves, bracketed by their own synchronised
    points, are taken out of the interval and reported beside it (ckpt_s)."""

    def __init__(self, run: Run, group: Any = None, trackers: Any = None) -> None:
        self.run = run
        self.trackers = NO_TRACKERS if trackers is None else trackers  # rank 0's TensorBoard, W&B, MLflow
        self.group = group  # the gloo side group (Preemption's); None: the default group is gloo
        # every rank's node, once: busy_s is per node
        self.hosts: list[Any] = [None] * run.world
        dist.all_gather_object(self.hosts, socket.gethostname().split(".")[0], group=group)
        self.busy = None if plugins.uses_pipeline(run.cfg) else BusyClock(run.cuda)
        self.loss_sum = torch.zeros((), device=run.device)
        self.count = 0
        self.steps = 0
        self.tokens = 0
        self.ckpt_s = 0.0
        self.mark = 0.0
        self.counted = 0.0  # of this interval's training time, already added to state.elapsed (by a checkpoint)

    def start(self) -> None:
        synchronize(self.run)
        self.mark = time.perf_counter()

    def add(self, loss: torch.Tensor | None, tokens: int) -> None:
        if loss is not None:
            self.loss_sum += loss.detach().float()
            self.count += 1
        self.steps += 1
        self.tokens += tokens

    def checkpoint(self, save: Any, state: checkpoint.TrainState, final: bool = False) -> None:
        """Save, and keep its time out of the training interval (the stall: checkpoint_begin to checkpoint_end).
        The checkpoint's elapsed counts up to the save. An asynchronous save's second half is waited for by the next
        save, inside its stall, or by this one where it is `final` (the training exits after it): the stall of a
        final save is the whole save."""
        synchronize(self.run)
        t0 = time.perf_counter()
        write_event(self.run, "checkpoint_begin", state.step, time.time())
        so_far = t0 - self.mark - self.ckpt_s
        state.elapsed += so_far - self.counted
        self.counted = so_far
        self.written()
        save(state)
        if final:
            self.written()
        synchronize(self.run)
        write_event(self.run, "checkpoint_end", state.step, time.time(), **self.run.ckpt.save_cost)
        self.ckpt_s += time.perf_counter() - t0

    def written(self) -> None:
        """Wait for the last asynchronous save's second half, if one is pending, and record it (checkpoint_written:
        its write_s, fsync_s, manifest_s, verify_s, background_s, and the waited_s this rank stood still for it).
        Its failure raises WriteFailed here, on every rank."""
        done = self.run.ckpt.wait()
        if done is not None:
            write_event(self.run, "checkpoint_written", done.step, time.time(), **done.cost)

    def emit(self, state: checkpoint.TrainState, lr: float) -> None:
        run = self.run
        loss = mean_loss(run, self.loss_sum, self.count)  # .item(): every kernel queued so far has finished
        now, wall = time.perf_counter(), time.time()
        train_s = max(now - self.mark - self.ckpt_s, 1e-9)
        state.elapsed += train_s - self.counted
        tps = self.tokens / train_s
        rec = {
            "step": state.step,
            "steps": run.cfg["steps"],
            "loss": round(loss, 6),
            "lr": lr,
            "tokens": state.tokens,
            "tokens_per_s": round(tps, 1),
            "mfu": mfu(run, tps),
            "elapsed": round(state.elapsed, 3),
            "step_ms": round(1000 * train_s / max(self.steps, 1), 3),
            "ckpt_s": round(self.ckpt_s, 6),
            "time": round(wall, 6),
            "wall": round(wall, 6),
        }
        if self.busy is not None:
            rec["busy_s"] = self.busy_by_node(self.busy.take())
        failure = append_metrics(run.args.metrics, rec) if run.rank == 0 else None
        diskspace.agree(run.ckpt.group, run.world, failure)  # a line not written fails every rank at once
        if run.rank == 0:
            curves = {"loss": loss, "lr": lr, "tokens_per_s": tps, "mfu": rec["mfu"], "step_ms": rec["step_ms"]}
            self.trackers.log(curves, state.step)
            m = "" if rec["mfu"] is None else f" mfu {100 * rec['mfu']:.1f}%"
            print(
                f"step {state.step}/{run.cfg['steps']} loss {loss:.4f} lr {lr:.3e} tok/s {tps:,.0f}{m} "
                f"elapsed {state.elapsed:.1f}s",
                flush=True,
            )
        self.loss_sum.zero_()
        self.count, self.steps, self.tokens, self.ckpt_s, self.counted = 0, 0, 0, 0.0, 0.0
        self.mark = now  # the line's own writing counts toward the next interval

    def busy_by_node(self, mine: float) -> dict[str, float]:
        """Every rank's busy seconds per step (one all_gather of one number), as each node's mean over its ranks."""
        every = [torch.zeros(1, dtype=torch.float64) for _ in range(self.run.world)]
        dist.all_gather(every, torch.tensor([mine], dtype=torch.float64), group=self.group)
        per_node: dict[str, list[float]] = {}
        for host, value in zip(self.hosts, every, strict=True):
            per_node.setdefault(str(host), []).append(value.item())
        return {host: round(sum(v) / len(v), 6) for host, v in per_node.items()}


def synchronize(run: Run) -> None:
    if run.cuda:
        torch.cuda.synchronize(run.device)


def train(run: Run, preempt: Preemption) -> int:
    cfg = run.cfg
    state = checkpoint.TrainState()
    t0 = time.time()
    latest, verify_s = run.ckpt.choose()  # the newest checkpoint that verifies (damaged ones skipped, logged)
    if latest is not None:
        state = run.ckpt.load(latest)
        loaded = time.time()
        log0(run.rank, f"resumed from {latest} at step {state.step}")
    failure = None
    if run.rank == 0:
        failure = prepare_metrics(run.args.metrics, state.step)
        link_metrics_file(run.args.metrics)
    diskspace.agree(run.ckpt.group, run.world, failure)
    if latest is not None:  # after prepare_metrics, which rewrites the file; the time is the load's end
        write_event(run, "resume", state.step, loaded, restore_s=round(loaded - t0, 6), verify_s=round(verify_s, 6))
    end = cfg["stop_after"] or cfg["steps"]
    tokens_per_step = run.dp_size * cfg["micro_batch"] * cfg["grad_accum"] * cfg["seq_len"]
    log0(
        run.rank,
        f"plugin {cfg['plugin']} world {run.world} dp {run.dp_size} device {run.device.type} "
        f"params {sum(p.numel() for p in run.model.parameters()):,} (this rank) "
        f"tokens/step {tokens_per_step} steps {state.step}->{end}",
    )
    logger = Logger(run, preempt.group, start_trackers(run, state.step))
    try:
        saved_at = state.step if latest is not None else -1
        return loop(run, preempt, logger, state, saved_at=saved_at, end=end, tokens_per_step=tokens_per_step)
    finally:
        logger.trackers.close()


def start_trackers(run: Run, step: int) -> Any:
    """Rank 0's trackers (docs/training-contract.md): TensorBoard in $MULTINODE_TENSORBOARD_DIR, W&B and MLflow where
    installed and configured, each continuing the job's one run across requeues; none elsewhere, or without the
    plugin's helper (a container image without the plugin). A tracker's failure is warned of once, never fatal."""
    if run.rank != 0:
        return NO_TRACKERS
    try:
        from snakemake_executor_multinode.training.tracking import Trackers
    except ImportError:
        return NO_TRACKERS
    return Trackers.open(first_step=step + 1, config=run.cfg)  # a metrics line names the steps done


class NoTrackers:
    def log(self, metrics: dict[str, Any], step: int) -> None:
        pass

    def close(self) -> None:
        pass


NO_TRACKERS = NoTrackers()


def loop(
    run: Run, preempt: Preemption, logger: Logger, state: checkpoint.TrainState, saved_at: int, end: int,
    tokens_per_step: int,
) -> int:  # fmt: skip
    """The training loop from `state` to `end`; 0 when it stopped as asked (done, stop_after, or checkpointed for
    a requeue)."""
    cfg = run.cfg
    run.model.train()
    logger.start()
    while state.step < end:
        lr = run.optimizer.param_groups[0]["lr"]
        loss = train_step(run, state.step, logger.busy)
        state.step += 1
        state.tokens += tokens_per_step
        logger.add(loss, tokens_per_step)
        if state.step % cfg["log_every"] == 0 or state.step == end:
            logger.emit(state, lr)
        if state.step < cfg["steps"] and preempt.requested():
            # when the signal came (rank 0's clock; null where only another rank got it): the time it left
            write_event(run, "signal", state.step, time.time(), signal="SIGUSR2", received=preempt.at)
            logger.checkpoint(run.ckpt.save, state, final=True)  # on disk and verified before the preempt file
            if run.rank == 0:
                write_preempt_file(state.step)
            log0(run.rank, f"SIGUSR2: checkpointed step {state.step}, exiting for requeue")
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # a second signal must not kill the exit
            return 0
        if cfg["ckpt_every"] and state.step % cfg["ckpt_every"] == 0:
            logger.checkpoint(run.ckpt.save, state, final=state.step == end)
            saved_at = state.step
    if saved_at != state.step:
        logger.checkpoint(run.ckpt.save, state, final=True)
    logger.written()  # none is pending here (the last save was final): said once more, so none is ever lost
    if state.step < cfg["steps"]:
        log0(run.rank, f"stop_after: stopped at step {state.step} of {cfg['steps']} (checkpointed)")
        return 0
    save_final(run, state)
    log0(run.rank, f"done: step {state.step}, final model {run.args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.print_default_config:
        print(lm.default_config_yaml(), end="")
        return 0
    preempt = Preemption()  # early: a USR2 during start-up is kept, not fatal
    cuda = torch.cuda.is_available()
    try:
        cfg = lm.merge_config(json.loads(args.config_json))
        ensure_dist_env()
        lm.validate_config(cfg, cuda, int(os.environ["WORLD_SIZE"]))
        check_data(args.data_dir, cfg)
    except (lm.ConfigError, json.JSONDecodeError, FileNotFoundError) as e:
        print(f"train.py: config error: {e}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    run = setup(args, cfg, cuda)
    preempt.setup_group()
    try:
        rc = train(run, preempt)
    except lm.ConfigError as e:  # e.g. resuming a checkpoint written with another model config or layout
        print(f"train.py: config error: {e}", file=sys.stderr, flush=True)
        rc = EXIT_CONFIG
    except diskspace.WriteFailed as e:  # a full disk above all: every rank says the same, and all leave at once
        print(f"train.py: {e}", file=sys.stderr, flush=True)
        if not e.agreed:  # the others may be inside a collective: leave now, torchrun ends them
            fast_exit(EXIT_WRITE_FAILED)
        rc = EXIT_WRITE_FAILED
    dist.destroy_process_group()
    if not cfg["compile"]:
        fast_exit(rc)
    return rc


def fast_exit(rc: int) -> None:
    """Leave without interpreter teardown: freeing torch/transformers/ColossalAI modules takes ~2 s per
    process on small CPUs, and a requeued job should release its nodes promptly. Everything is written and
    the process group is destroyed by now. (Not with torch.compile: its worker pool cleans up at exit.)"""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    sys.exit(main())
