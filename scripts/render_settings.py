"""Render docs/settings.md's table of plugin settings from the adapter's ExecutorSettings (what Snakemake reads).

    python scripts/render_settings.py           # rewrite the table between the markers in docs/settings.md
    python scripts/render_settings.py --check   # exit 1 when the table differs from ExecutorSettings

The table sits between `<!-- settings-table -->` and `<!-- /settings-table -->` on lines of their own;
tests/unit/adapter/test_settings_table.py fails while it differs from what this script renders.
"""

from __future__ import annotations

import re
import sys
from dataclasses import MISSING, fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # marked_block.py beside it, also when a test imports this
import marked_block  # noqa: E402
from marked_block import cell  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "settings.md"
BEGIN, END = "<!-- settings-table -->", "<!-- /settings-table -->"


def _meaning(help_text: str) -> str:
    """The help without the `(default: ...)` that `snakemake --help` shows: the table has a column for it."""
    return re.sub(r"\s*\(default: [^()]*\)\s*$", "", help_text)


def table() -> str:
    """One row per ExecutorSettings field: the option, its default, its help."""
    from snakemake_executor_plugin_multinode import ExecutorSettings

    rows = ["| option | default | meaning |", "|---|---|---|"]
    for f in fields(ExecutorSettings):
        if "help" not in f.metadata:
            continue  # the interface's own fields, if any
        default = "none" if f.default in (None, MISSING) else f"`{f.default}`"
        option = f"`--multinode-{f.name.replace('_', '-')}`"
        rows.append(f"| {option} | {cell(default)} | {cell(_meaning(f.metadata['help']))} |")
    return "\n".join(rows) + "\n"


def render(text: str) -> str:
    """`text` with the block between the markers replaced by the table; an error when the markers are missing."""
    return marked_block.render(text, DOC, BEGIN, END, table)


def main(argv: list[str] | None = None) -> int:
    return marked_block.main(argv, __doc__.split("\n")[0], DOC, render, "scripts/render_settings.py")


if __name__ == "__main__":
    sys.exit(main())
