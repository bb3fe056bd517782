"""README.md's "Defaults that act on your job" is what scripts/render_defaults.py renders: its --check, run as CI runs
it (the renderer itself: tests/unit/test_defaults_table.py)."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO


def test_the_readme_table_is_rendered_from_the_code():
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts/render_defaults.py"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
