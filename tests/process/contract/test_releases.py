"""The SLURM releases are named once (contract/releases.py): sbatch's option tables, the sandbox, `multinode cluster
up --slurm` and scripts/test.sh all read that list.

Here the tests that start processes (the process tier); the others: tests/unit/contract/test_releases.py."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from snakemake_executor_multinode.contract import releases
from tests.helpers import REPO


def test_the_module_prints_the_names_one_a_line_the_default_first():
    out = subprocess.run(
        [sys.executable, "-m", "snakemake_executor_multinode.contract.releases"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    names = out.split()
    assert names[0] == releases.DEFAULT and sorted(names) == sorted(releases.NAMES)


@pytest.fixture
def test_sh(tmp_path):
    """scripts/test.sh in a checkout whose registry names 9.9 (the default) and 8.8, and whose bootstrap fails at
    once: a value test.sh takes gets as far as the bootstrap (exit 1), one it refuses stops before (exit 2)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "test.sh", tmp_path / "scripts" / "test.sh")
    (tmp_path / "scripts" / "bootstrap.sh").write_text("exit 1\n")
    contract = tmp_path / "snakemake_executor_multinode" / "contract"
    contract.mkdir(parents=True)
    (contract.parent / "__init__.py").write_text("")
    (contract / "__init__.py").write_text("")
    (contract / "releases.py").write_text("print('9.9')\nprint('8.8')\n")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(tmp_path / "scripts" / "test.sh"), *args], capture_output=True, text=True)

    return run


def test_test_sh_takes_the_registrys_names_and_both(test_sh):
    for value in ("9.9", "8.8", "both"):
        assert test_sh("--slurm", value).returncode == 1  # past the check, into the (failing) bootstrap
    refused = test_sh("--slurm", "22.05")
    assert refused.returncode == 2 and "--slurm must be 9.9, 8.8 or both, got '22.05'" in refused.stdout
    assert "--slurm needs 9.9, 8.8 or both" in test_sh("--slurm").stdout


def test_test_sh_names_this_checkouts_releases():
    out = subprocess.run(["bash", str(REPO / "scripts" / "test.sh"), "--slurm", "x"], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stdout.strip() == f"--slurm must be {', '.join(releases.NAMES)} or both, got 'x'"
