"""The version lives in one place, `__version__` in snakemake_executor_multinode/__init__.py: pyproject.toml has it
read from there (hatchling's dynamic version), `multinode --version` and the provenance records import it, and
CHANGELOG.md has an entry for it. A second literal copy anywhere in the packages or pyproject.toml fails here.
The tests that start processes: tests/process/test_version.py."""

from __future__ import annotations

import re
import tomllib

from snakemake_executor_multinode import __version__
from tests.helpers import INIT, REPO, the_version

PACKAGES = ("snakemake_executor_multinode", "snakemake_executor_plugin_multinode")


def test_the_version_is_a_release_number_and_the_one_imported():
    version = the_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?", version), version
    assert __version__ == version


def test_pyproject_reads_the_version_from_init_and_holds_no_copy():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"], "pyproject.toml: the version is dynamic, read from __init__.py"
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["hatch"]["version"]["path"] == "snakemake_executor_multinode/__init__.py"
    assert the_version() not in (REPO / "pyproject.toml").read_text()


def test_no_second_copy_of_the_version_in_the_packages():
    version = the_version()
    copies = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*")):
            if path == INIT or not path.is_file() or "__pycache__" in path.parts:
                continue
            text = path.read_text(errors="replace")
            if version in text or re.search(r"__version__\s*=", text):
                copies.append(str(path.relative_to(REPO)))
    assert not copies, f"the version (or a __version__ of their own) in {copies}: import it from {INIT.name}"


def test_the_changelog_has_an_entry_for_the_version_and_an_unreleased_section():
    changelog = (REPO / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\]", changelog, re.M)
    assert headings[:2] == ["Unreleased", the_version()], headings
