"""The version lives in one place, `__version__` in snakemake_executor_multinode/__init__.py: pyproject.toml has it
read from there (hatchling's dynamic version), `multinode --version` and the provenance records import it, and
CHANGELOG.md has an entry for it. A second literal copy anywhere in the packages or pyproject.toml fails here.

Here the tests that start processes (the process tier); the others: tests/unit/test_version.py."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import the_version


def test_multinode_version_prints_it():
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake_executor_multinode.cli", "--version"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["multinode", the_version()], proc.stdout
