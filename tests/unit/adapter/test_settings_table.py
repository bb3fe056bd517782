"""docs/settings.md's settings table is what scripts/render_settings.py renders from the adapter's ExecutorSettings
(what Snakemake reads and `snakemake --help` shows): a setting added, renamed, or given another default or help
fails here until the page is rendered again."""

from __future__ import annotations

from dataclasses import fields

import pytest

from snakemake_executor_plugin_multinode import ExecutorSettings
from tests.helpers import REPO, load_script

render_settings = load_script(REPO / "scripts/render_settings.py", "render_settings")


def test_the_settings_table_in_docs_settings_is_rendered_from_executor_settings():
    current = render_settings.DOC.read_text()
    assert current == render_settings.render(current), "run `python scripts/render_settings.py`"
    assert render_settings.main(["--check"]) == 0


def test_every_setting_has_a_row_with_its_cli_name_and_default():
    rows = render_settings.table().splitlines()[2:]
    names = [f.name for f in fields(ExecutorSettings) if "help" in f.metadata]
    assert len(rows) == len(names) > 20
    for row, name in zip(rows, names, strict=True):
        assert row.startswith(f"| `--multinode-{name.replace('_', '-')}` |")
    assert "| `--multinode-signal` | `USR2@120` |" in render_settings.table()


def test_a_drifted_table_fails_the_check(tmp_path, monkeypatch):
    doc = tmp_path / "settings.md"
    doc.write_text(render_settings.DOC.read_text().replace("`USR2@120`", "`USR1@60`"))
    monkeypatch.setattr(render_settings, "DOC", doc)
    monkeypatch.setattr(render_settings, "ROOT", tmp_path)
    assert render_settings.main(["--check"]) == 1
    assert render_settings.main([]) == 0
    assert "`USR2@120`" in doc.read_text() and render_settings.main(["--check"]) == 0


def test_missing_markers_are_an_error_not_an_empty_table():
    with pytest.raises(ValueError, match="markers"):
        render_settings.render("# no table here\n")


def test_every_python_script_under_scripts_is_run_by_a_test():
    # render_settings.py: imported above; render_defaults.py: tests/unit/test_defaults_table.py; marked_block.py:
    # imported by both
    assert sorted(p.name for p in (REPO / "scripts").glob("*.py")) == [
        "marked_block.py",
        "render_defaults.py",
        "render_settings.py",
    ]
