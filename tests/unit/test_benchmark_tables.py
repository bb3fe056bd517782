"""The READMEs' benchmark tables and figures are what benchmarks/render.py renders from the committed result files;
a result line a table needs and cannot find is an error naming the file and the key, never an empty row."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers import REPO, load_script

render = load_script(REPO / "benchmarks/render.py", "benchmark_render")


def test_the_readmes_are_rendered_from_the_result_files():
    diffs = render.check()
    assert not diffs, "run `python benchmarks/render.py` (or fix the result file):\n" + "".join(diffs)


@pytest.fixture
def copy_root(tmp_path, monkeypatch):
    """A copy of the READMEs and every result file under tmp_path, which render.py then reads instead."""
    for rel in [*render.FILES, *(str(p.relative_to(REPO)) for p in (REPO / "benchmarks").rglob("results-*"))]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    monkeypatch.setattr(render, "ROOT", tmp_path)
    render._load.cache_clear()
    yield tmp_path
    render._load.cache_clear()


def test_a_missing_result_line_is_an_error_naming_the_file_and_the_key():
    with pytest.raises(render.MissingResult) as e:
        render.line(render.H200, variant="no-such-variant")
    assert str(e.value) == "benchmarks/gpu/results-h200.jsonl: no result line with variant='no-such-variant'"
    with pytest.raises(render.MissingResult, match=r"results-fanout.json: no \['no_such_run'\]"):
        render.line(render.FANOUT, "no_such_run", "rows", variant="multinode (one job array)")


def test_a_table_whose_line_is_gone_fails_and_names_it(copy_root):
    path = copy_root / render.H200
    rows = [json.loads(row) for row in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows if r["variant"] != "gemini"))
    with pytest.raises(render.MissingResult, match=r"results-h200.jsonl: no result line with variant='gemini'"):
        render.RENDERERS["h200-plugins"]()
    assert render.main(["--check"]) == 2  # an error, not a diff and not an empty row


def test_two_lines_for_one_selection_is_an_error_not_a_guess():
    with pytest.raises(render.MissingResult, match=r"2 result lines with variant='torch_ddp\+compile'"):
        render.line(render.I14, variant="torch_ddp+compile")  # runs A and B: the run must be named
    assert render.line(render.I14, run=render.Prefix("B:"), variant="torch_ddp+compile")["tokens_per_s"] == 186506


def test_a_ratio_across_two_runs_is_refused():
    a = render.line(render.I26, call="A", variant="torch_ddp+compile")
    b = render.line(render.I26, call="B", variant="torch_ddp+compile+bf16m")
    with pytest.raises(render.MissingResult, match="no ratio across runs"):
        render.ratio(b, a, "tokens_per_s", run="call")


def test_check_shows_a_hand_edited_figure_and_rendering_puts_it_back(copy_root, capsys):
    readme = copy_root / "benchmarks/README.md"
    rendered = readme.read_text()
    readme.write_text(rendered.replace("| 228.3 | 68,061 | 14.7% |", "| 228.3 | 68,061 | 15.0% |"))
    assert render.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "-| train.py, GeminiPlugin (HybridAdam) | 228.3 | 68,061 | 15.0% |" in out
    assert "+| train.py, GeminiPlugin (HybridAdam) | 228.3 | 68,061 | 14.7% |" in out
    assert render.main([]) == 0 and readme.read_text() == rendered
    assert render.main(["--check"]) == 0


def test_markers_render_blocks_on_their_own_lines_and_figures_inline():
    text = (
        "Intro.\n\n<!-- render:det-throughput -->\nstale\n<!-- /render:det-throughput -->\n\n"
        "It costs <!-- render:det-cost -->old<!-- /render:det-cost -->.\n"
    )
    out = render.render_text(text)
    assert out.startswith("Intro.\n\n<!-- render:det-throughput -->\n\n| variant | step ms |")
    assert "|\n\n<!-- /render:det-throughput -->\n\nIt costs <!-- render:det-cost -->**9.1% of MFU**" in out
    assert render.render_text(out) == out


@pytest.mark.parametrize(
    "text, error",
    [
        ("<!-- render:no-such-table --><!-- /render:no-such-table -->", "no renderer named 'no-such-table'"),
        ("<!-- render:det-cost -->\n", "unclosed render marker"),
        ("x\n<!-- render:det-cost --><!-- /render:det-cost -->\n", "begins a line"),
        ("- <!-- render:det-cost --><!-- /render:det-cost -->\n", "begins a line"),
        ("a <!-- render:det-throughput --><!-- /render:det-throughput -->\n", "lines of their own"),
    ],
)
def test_a_bad_marker_is_an_error(text, error):
    with pytest.raises(render.MarkerError, match=error):
        render.render_text(text)
