"""A generated block between two markers of a document, kept up to date: the one routine that scripts/render_defaults.py
and scripts/render_settings.py share (render the block; `--check`: change nothing, exit 1 while it differs)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def shown(doc: Path) -> str:
    """`doc` as the messages name it: from the repository's root where it lies inside."""
    return str(doc.relative_to(ROOT)) if doc.is_relative_to(ROOT) else str(doc)


def cell(text: str) -> str:
    """One markdown table cell: one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def render(text: str, doc: Path, begin: str, end: str, block: Callable[[], str]) -> str:
    """`text` with what stands between the markers replaced by `block()`; an error naming `doc` when a marker is not
    on a line of its own."""
    head, sep, rest = text.partition(begin + "\n")
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        raise ValueError(f"{shown(doc)}: markers {begin} ... {end} not found on lines of their own")
    return f"{head}{begin}\n\n{block()}\n{end}{tail}"


def main(argv: Sequence[str] | None, description: str, doc: Path, rendered: Callable[[str], str], script: str) -> int:
    """The command line of a script that renders `doc` (`rendered`: the document's text, updated)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when the table is out of date")
    args = p.parse_args(argv)
    current = doc.read_text()
    new = rendered(current)
    if args.check:
        if current != new:
            print(f"{shown(doc)} is out of date: run python {script}", file=sys.stderr)
            return 1
        return 0
    if current != new:
        doc.write_text(new)
        print(f"rendered {shown(doc)}")
    return 0
