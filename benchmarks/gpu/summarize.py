"""One JSON line for a train.py run: median tokens/s and MFU over the logged intervals after the first."""

import json
import statistics
import sys

variant, path = sys.argv[1], sys.argv[2]
try:
    rows = [json.loads(line) for line in open(path)]
except OSError:
    print(json.dumps({"variant": variant, "error": "no metrics (see its log)"}))
    sys.exit(0)
steady = rows[1:] or rows
print(
    json.dumps(
        {
            "variant": variant,
            "step_ms": round(statistics.median(r["step_ms"] for r in steady), 1),
            "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in steady)),
            "mfu": round(statistics.median(r["mfu"] for r in steady), 4) if steady[0].get("mfu") is not None else None,
            "loss": rows[-1]["loss"],
            "steps": rows[-1]["step"],
        }
    )
)
