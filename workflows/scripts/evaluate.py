"""Evaluate a final model on the validation split (CPU, one process) and plot the training loss.

    python workflows/scripts/evaluate.py --model FINAL.pt --data-dir DATA --metrics-in METRICS.jsonl \\
        --out-json EVAL.json --plot LOSS.png [--max-tokens N] [--batch-size B]

Validation loss: mean next-token cross entropy over non-overlapping seq_len windows of val.bin (the first
--max-tokens tokens), each window scored like training (position i predicts token i + 1).
EVAL.json: val_loss, val_ppl, val_bits_per_token, tokens_scored, windows, model step, last train loss.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lm  # noqa: E402


@torch.no_grad()
def validation_loss(
    model: lm.NativeLlama, tokens: np.ndarray, seq_len: int, max_tokens: int, batch_size: int
) -> tuple[float, int, int]:
    """(mean loss, predicted tokens, windows) over non-overlapping windows of the first max_tokens tokens."""
    usable = min(len(tokens), max_tokens)
    n_windows = usable // seq_len
    if n_windows == 0:
        raise SystemExit(f"evaluate.py: {len(tokens)} validation tokens, fewer than seq_len {seq_len}")
    windows = np.asarray(tokens[: n_windows * seq_len], dtype=np.int64).reshape(n_windows, seq_len)
    total, count = 0.0, 0
    for i in range(0, n_windows, batch_size):
        ids = torch.from_numpy(windows[i : i + batch_size])
        logits = model(input_ids=ids).logits[:, :-1]
        target = ids[:, 1:]
        flat_logits = logits.reshape(-1, logits.shape[-1])
        total += F.cross_entropy(flat_logits, target.reshape(-1), reduction="sum").item()
        count += target.numel()
    return total / count, count, n_windows


def plot_loss(metrics: list[dict[str, Any]], val_loss: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    steps = [m["step"] for m in metrics]
    ax.plot(steps, [m["loss"] for m in metrics], label="train loss", color="tab:blue")
    if steps:
        ax.scatter([steps[-1]], [val_loss], color="tab:red", zorder=3, label=f"val loss {val_loss:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross entropy (nats/token)")
    ax.set_title("training loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="validation loss / perplexity + loss curve")
    p.add_argument("--model", required=True, type=Path, help="train.py --out file")
    p.add_argument("--data-dir", required=True, type=Path)
    p.add_argument("--metrics-in", required=True, type=Path, help="train.py --metrics file")
    p.add_argument("--out-json", required=True, type=Path)
    p.add_argument("--plot", required=True, type=Path)
    p.add_argument("--max-tokens", type=int, default=1 << 18, help="validation tokens scored at most")
    p.add_argument("--batch-size", type=int, default=8)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    model, blob = lm.load_final_model(args.model)
    tokens = lm.load_tokens(args.data_dir, "val")
    loss, scored, windows = validation_loss(model, tokens, model.config.seq_len, args.max_tokens, args.batch_size)
    metrics = list(lm.iter_metrics(args.metrics_in))
    result = {
        "val_loss": loss,
        "val_ppl": math.exp(loss),
        "val_bits_per_token": loss / math.log(2),
        "tokens_scored": scored,
        "windows": windows,
        "model_step": blob.get("step"),
        "train_loss_last": metrics[-1]["loss"] if metrics else None,
        "train_loss_first": metrics[0]["loss"] if metrics else None,
        "model": str(args.model),
        "data_dir": str(args.data_dir),
    }
    args.out_json.parent.mkdir(parents=True, exist_ok=True)
    args.out_json.write_text(json.dumps(result, indent=1) + "\n")
    plot_loss(metrics, loss, args.plot)
    print(f"val loss {loss:.4f} ppl {result['val_ppl']:.2f} over {scored:,} tokens -> {args.out_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
