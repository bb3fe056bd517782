"""README.md's "Defaults that act on your job" is what scripts/render_defaults.py renders from the code's settings
and constants: a default changed in the code and not in the README fails here (the script's --check, run as a
process: tests/process/test_defaults_table.py)."""

from __future__ import annotations

from tests.helpers import REPO, load_script

render = load_script(REPO / "scripts/render_defaults.py", "render_defaults")


def test_a_changed_default_changes_the_table(monkeypatch):
    from snakemake_executor_multinode.planning import launcher_resources

    before = render.table()
    monkeypatch.setattr(launcher_resources, "DEFAULT_MAX_RESTARTS", 5)
    after = render.table()
    assert "3 in-job restarts" in before and "5 in-job restarts" in after


def test_missing_markers_are_an_error_naming_the_file():
    try:
        render.render("no markers here\n")
    except ValueError as err:
        assert "README.md: markers <!-- defaults-table --> ... <!-- /defaults-table --> not found" in str(err)
    else:
        raise AssertionError("no error")
