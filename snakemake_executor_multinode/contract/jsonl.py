"""JSON lines files a job appends to while it runs (its runs file, the training's metrics), read without trusting
their last line: a line being written, or cut by a node's death, is left out and the others still count."""

from __future__ import annotations

import json
from pathlib import Path


def json_lines(path: Path) -> list[object]:
    """A JSON lines file's records; a line being written (or not JSON) is left out, a missing file is none."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []  # no metrics (a script that writes none), or a link to a file gone
    found = []
    for line in text.splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found
