"""Shell quoting for values written into the job script: one word, on one line, that bash reads back literally."""

from __future__ import annotations

import re
import shlex

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def shell_quote(text: str) -> str:
    """shlex.quote, except that a value holding control characters becomes bash's $'...' form with escapes: a raw
    newline inside quotes is inert too, but it would put the rest of the value at the start of a script line, where
    a reader (or a naive #SBATCH scanner) could take it for something else. NUL cannot live in a bash string."""
    if "\x00" in text:
        raise ValueError("a NUL character cannot be passed through the shell")
    if not _CONTROL.search(text):
        return shlex.quote(text)
    escaped = text.replace("\\", "\\\\").replace("'", "\\'")
    return "$'" + _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", escaped) + "'"
