"""One JSON line for a train.py run: its throughput after the first logged interval (which holds the compile).

train.py's lines are wall clock between synchronised points, so the steady state is the tokens after the first
line over the sum of the later intervals (tokens / tokens_per_s each): the same as the tokens between the first
and the last line over their wall-clock gap, less the checkpoint time between them (`span_tokens_per_s`, the check).
"""

import json
import sys

variant, path = sys.argv[1], sys.argv[2]
try:
    rows = [r for r in map(json.loads, open(path)) if "event" not in r]  # step lines (events: checkpoints, resumes)
except OSError:
    print(json.dumps({"variant": variant, "error": "no metrics (see its log)"}))
    sys.exit(0)
first, steady = rows[0], rows[1:]
if not steady:
    print(json.dumps({"variant": variant, "error": "one logged interval: no steady state after the compile"}))
    sys.exit(0)
tokens = steady[-1]["tokens"] - first["tokens"]
seconds = sum((r["tokens"] - p["tokens"]) / r["tokens_per_s"] for p, r in zip(rows, steady, strict=False))
tps = tokens / seconds
gap = steady[-1]["time"] - first["time"] - sum(r.get("ckpt_s", 0.0) for r in steady)
mfu_per_tps = first["mfu"] / first["tokens_per_s"] if first.get("mfu") is not None else None
steps = steady[-1]["step"] - first["step"]
print(
    json.dumps(
        {
            "variant": variant,
            "step_ms": round(1000 * seconds / steps, 1),
            "tokens_per_s": round(tps),
            "mfu": None if mfu_per_tps is None else round(tps * mfu_per_tps, 4),
            "span_tokens_per_s": round(tokens / gap),
            "timed_steps": steps,
            "first_interval_s": round(first["tokens"] / first["tokens_per_s"], 1),
            "loss": rows[-1]["loss"],
            "steps": rows[-1]["step"],
        }
    )
)
