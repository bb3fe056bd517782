"""Files the plugin writes for a later reader (a status cycle, another run, a job): whole or not at all, and
readable by the owner only (job scripts carry profile values such as tokens; records name hosts and commands)."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """Write under a temporary name of this writer's own (two runs may write one file), then rename: a reader sees
    the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
