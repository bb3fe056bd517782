"""The SLURM releases are named once (contract/releases.py): sbatch's option tables, the sandbox, `multinode cluster
up --slurm` and scripts/test.sh all read that list."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

import pytest

from snakemake_executor_multinode.cli.main import _cluster_parser
from snakemake_executor_multinode.contract import releases
from snakemake_executor_multinode.sandbox import releases as sandbox
from snakemake_executor_multinode.slurm import sbatch_flags
from tests.helpers import REPO


def test_the_default_is_a_release_and_names_are_what_sbatch_version_begins_with():
    assert releases.DEFAULT in releases.NAMES and releases.NAMES == tuple(releases.RELEASES)
    for name, release in releases.RELEASES.items():
        assert release.name == name and sbatch_flags.table_for(f"{name}.5").name == f"sbatch {name}.5"


def test_every_release_has_an_sbatch_option_table_and_no_table_is_of_another_release():
    assert tuple(sbatch_flags.TABLES) == releases.NAMES
    assert set(sbatch_flags.LONG_OPTIONS) == set(releases.NAMES)
    assert sbatch_flags.ANY_RELEASE.name == "sbatch " + " or ".join(releases.NAMES)


def test_every_release_has_a_way_to_run_in_the_sandbox_and_nothing_else_does():
    assert tuple(sandbox.RELEASES) == releases.NAMES and set(sandbox.SOURCES) == set(releases.NAMES)
    assert sandbox.release(releases.DEFAULT).rootfs is None  # the default is this machine's own packages


def _slurm_option() -> argparse.Action:
    parser = argparse.ArgumentParser()
    _cluster_parser(parser.add_subparsers(dest="command"))
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    actions = next(a for a in sub.choices["cluster"]._actions if isinstance(a, argparse._SubParsersAction))
    return next(a for a in actions.choices["up"]._actions if "--slurm" in a.option_strings)


def test_the_cli_help_names_exactly_the_registrys_releases_with_their_descriptions():
    option = _slurm_option()
    assert option.default == releases.DEFAULT
    assert option.help == "SLURM release: " + " or ".join(sandbox.describe(name) for name in releases.NAMES)
    for name, release in releases.RELEASES.items():
        assert f"{name} ({release.description}" in (option.help or "")
    # what it said before the registry, word for word
    assert option.help == (
        "SLURM release: 22.05 (this machine's Debian 12 packages, the default) or 24.11 (a Debian 13 root file "
        f"system, built once and cached under {sandbox.CACHE})"
    )


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
