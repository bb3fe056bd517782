"""The SLURM releases are named once (contract/releases.py): sbatch's option tables, the sandbox, `multinode cluster
up --slurm` and scripts/test.sh all read that list.
The tests that start processes: tests/process/contract/test_releases.py."""

from __future__ import annotations

import argparse

from snakemake_executor_multinode.cli.main import _cluster_parser
from snakemake_executor_multinode.contract import releases
from snakemake_executor_multinode.sandbox import releases as sandbox
from snakemake_executor_multinode.slurm import sbatch_flags


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
