"""The fast tier's guard end to end (tests/unit/conftest.py, in a pytest of its own): a test that starts a process
fails, also where it swallows the error, and so does one whose fixture starts it; a test that starts none passes.
The guard's parts, in the fast tier itself: tests/unit/test_fast_tier.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from tests.helpers import REPO, watched

UNDER_THE_GUARD = """
import subprocess

import pytest


def test_starts_a_process():
    subprocess.run(["true"], check=True)


def test_swallows_the_error():
    try:
        subprocess.run(["true"])
    except Exception:
        pass


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    subprocess.run(["git", "init", "-q", str(tmp_path_factory.mktemp("r"))], check=True)


def test_uses_a_fixture_that_starts_a_process(repository):
    pass


def test_starts_nothing():
    assert sum(range(4)) == 6
"""

FREE = """
import subprocess


def test_starts():
    subprocess.run(["true"], check=True)
"""


def test_a_test_that_starts_a_process_fails_whatever_catches_the_error_and_one_that_starts_none_passes(tmp_path):
    """The tier's conftest, copied into a folder of its own: it watches the tests of its folder, and not those of
    the folder beside it that run in the same session."""
    unit, beside = tmp_path / "unit", tmp_path / "process"
    unit.mkdir()
    beside.mkdir()
    shutil.copy(REPO / "tests" / "unit" / "conftest.py", unit / "conftest.py")
    (unit / "test_guarded.py").write_text(UNDER_THE_GUARD)
    (beside / "test_free.py").write_text(FREE)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "--rootdir", str(tmp_path),
         "unit", "process"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    summary = {line.split(" - ")[0] for line in proc.stdout.splitlines()}
    assert {
        "FAILED unit/test_guarded.py::test_starts_a_process",
        "FAILED unit/test_guarded.py::test_swallows_the_error",
        "ERROR unit/test_guarded.py::test_uses_a_fixture_that_starts_a_process",
        "PASSED unit/test_guarded.py::test_starts_nothing",
        "PASSED process/test_free.py::test_starts",
    } <= summary, proc.stdout + proc.stderr
    assert proc.returncode == 1
    said = "started a process or used a socket:\n  subprocess.Popen 'true' ['true']"
    assert proc.stdout.count(said) == 2, proc.stdout  # the swallowed one too
    assert "subprocess.Popen 'git' ['git', 'init'" in proc.stdout
    assert "belongs in tests/process/, in the file of the same name" in proc.stdout


def test_a_test_of_this_tier_is_not_watched():
    """Also in one session with tests/unit, whose conftest's protocol hook pytest calls for every test."""
    assert watched() is None
