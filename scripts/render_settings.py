"""Render docs/settings.md's table of plugin settings from the adapter's ExecutorSettings (what Snakemake reads).

    python scripts/render_settings.py           # rewrite the table between the markers in docs/settings.md
    python scripts/render_settings.py --check   # exit 1 when the table differs from ExecutorSettings

The table sits between `<!-- settings-table -->` and `<!-- /settings-table -->` on lines of their own;
tests/unit/adapter/test_settings_table.py fails while it differs from what this script renders.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import MISSING, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "settings.md"
BEGIN, END = "<!-- settings-table -->", "<!-- /settings-table -->"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


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
        rows.append(f"| {option} | {_cell(default)} | {_cell(_meaning(f.metadata['help']))} |")
    return "\n".join(rows) + "\n"


def render(text: str) -> str:
    """`text` with the block between the markers replaced by the table; an error when the markers are missing."""
    head, sep, rest = text.partition(BEGIN + "\n")
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"{DOC.relative_to(ROOT)}: markers {BEGIN} ... {END} not found on lines of their own")
    return f"{head}{BEGIN}\n\n{table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when the table is out of date")
    args = p.parse_args(argv)
    current = DOC.read_text()
    rendered = render(current)
    if args.check:
        if current != rendered:
            print(f"{DOC.relative_to(ROOT)} is out of date: run python scripts/render_settings.py", file=sys.stderr)
            return 1
        return 0
    if current != rendered:
        DOC.write_text(rendered)
        print(f"rendered {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
