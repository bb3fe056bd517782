"""Fixtures of the training tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import SCRIPTS  # noqa: F401  (puts workflows/scripts on sys.path)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small generated corpus (about 190k tokens), built once per session."""
    import preprocess

    out = tmp_path_factory.mktemp("data")
    assert preprocess.main(["--out-dir", str(out), "--num-docs", "300", "--seed", "3"]) == 0
    return out
