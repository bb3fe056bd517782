"""Loss parity of training runs against a baseline run: the largest relative loss difference at any logged step.

    python benchmarks/loss_parity.py BASELINE.jsonl RUN.jsonl [RUN.jsonl ...] [--limit 0.01]

Reads train.py's metrics files (JSON lines with step and loss). Prints one JSON line per run: its name (the file's
parent folder), the steps compared, the largest |loss - baseline loss| / baseline loss, the step where it occurs,
and whether it is within the limit (steps 0 and max_rel_diff -1: not comparable, other logged steps or none).
Exit code 1 when a run is not within it. The CPU test (tests/training/test_precision.py) and gpu/run.sh's
PARITY=1 both use it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Parity:
    run: str
    steps: int  # logged steps compared
    max_rel_diff: float
    at_step: int
    within: bool


def losses(path: Path) -> dict[int, float]:
    """step -> loss; empty for a run that left no metrics (it failed: see its log)."""
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {row["step"]: row["loss"] for row in rows if "event" not in row}  # step lines (events have no loss)


def compare(baseline: dict[int, float], run: dict[int, float], limit: float, name: str = "run") -> Parity:
    if sorted(run) != sorted(baseline) or not baseline:
        return Parity(name, 0, -1.0, -1, False)  # not comparable: other logged steps, or none
    diffs = {step: abs(run[step] - loss) / abs(loss) for step, loss in baseline.items()}
    worst = max(diffs, key=lambda step: diffs[step])
    return Parity(name, len(diffs), round(diffs[worst], 6), worst, diffs[worst] <= limit)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("baseline", type=Path)
    p.add_argument("runs", type=Path, nargs="+")
    p.add_argument("--limit", type=float, default=0.01, help="largest relative difference allowed (default 1%%)")
    args = p.parse_args(argv)
    base = losses(args.baseline)
    results = [compare(base, losses(path), args.limit, path.parent.name) for path in args.runs]
    for result in results:
        print(json.dumps({"baseline": args.baseline.parent.name, **asdict(result)}))
    return 0 if all(r.within for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
