"""The log-line label: what the labeller writes, every reader reads back, and no module but contract/logline.py spells
it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import snakemake_executor_multinode
from snakemake_executor_multinode.contract import logline
from snakemake_executor_multinode.contract.logline import Labelled, failing_rank_lines, label, parse

CORE = Path(snakemake_executor_multinode.__file__).parent
NODES = ["node1", "gpu-a100-07", "n3.cluster.example.org", "x", "r2d2-0.rack-3"]


@pytest.mark.parametrize("node", NODES)
@pytest.mark.parametrize("rank", [0, 7, 10, 4095])
@pytest.mark.parametrize("rest", ["step 1 loss 2.5", "", "[not a label] x", logline.STACK + "  sleep (w.py:3)"])
def test_what_the_labeller_writes_the_readers_read_back(node: str, rank: int, rest: str) -> None:
    assert parse(label(node, rank) + rest) == Labelled(node, rank, None, rest)
    assert parse(label(node, str(rank)) + rest) == Labelled(node, rank, None, rest)  # a worker's RANK, as read
    assert parse(label(node, local_rank=rank) + rest) == Labelled(node, None, rank, rest)
    assert parse(label(node) + rest) == Labelled(node, None, None, rest)  # torchrun's own line


def test_a_worker_line_reads_as_the_log_shows_it() -> None:
    assert label("node2", 3) == "[node2 rank3] "
    assert label("node2", local_rank=1) == "[node2 local_rank1] "
    assert label("node2") == "[node2] "


@pytest.mark.parametrize(
    "line",
    ["unlabelled", "plain [node1 rank1] inside a line", "[node1 rank1]no blank after", "[node 1] x", "[node1 rankx] x"],
)
def test_a_line_without_a_label_at_its_start_has_none(line: str) -> None:
    assert parse(line) is None


LOG = """\
[node2 rank3] loading shard 7
[node2 rank2] loading shard 6
[node2 rank3] RuntimeError: corrupt shard
[node2] Root Cause (first observed failure):
[node2] [0]:
[node2]   host      : node2
[node2]   rank      : 3 (local_rank: 1)
[node1 rank0] RuntimeError: Connection closed by peer
"""


def test_the_failing_rank_is_the_one_torchrun_names_as_root_cause() -> None:
    assert failing_rank_lines(LOG, "node2") == (
        "node2 rank3",
        ["[node2 rank3] loading shard 7", "[node2 rank3] RuntimeError: corrupt shard"],
    )
    who, lines = failing_rank_lines("[node1 rank0] killed mid-line\n", "node1")
    assert (who, lines) == ("node1", ["[node1 rank0] killed mid-line"])  # no summary: the node's ranks' lines
    assert failing_rank_lines("unlabelled\n", "node9") == ("node9", [])


# How code spells the label: an f-string's text with `{}` for each value ("[{}] ", "[{} rank{}] "), or a regular
# expression's ("\[...rank").
SPELLING = re.compile(r"\[\{\}(?: (?:local_)?rank\{\})?\] |rank\{\}|\\\[.*rank")


def spellings(source: str) -> list[str]:
    """The label as the module's code spells it (strings and f-strings; docstrings and comments are prose)."""
    tree = ast.parse(source)
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    texts: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            texts.append("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str | bytes) and id(node) not in prose:
            texts.append(node.value if isinstance(node.value, str) else node.value.decode(errors="replace"))
    return [t for t in texts if SPELLING.search(t)]


def test_the_check_sees_a_writer_and_a_parser_of_the_label() -> None:
    writer = 'n, r = "a", 1\nw = f"[{n} rank{r}] "\nt = f"[{n}] "\n'
    parser = 'p = r"^\\[(\\S+) rank(\\d+)\\] "\n'
    prose = '"""The label: [<node> rank<R>]."""\n'  # a docstring describes it, which is no second spelling
    assert len(spellings(writer + parser + prose)) == 3
    assert spellings((CORE / "contract" / "logline.py").read_text())  # the owner's own spelling is seen


def test_no_module_but_the_contracts_spells_the_label() -> None:
    found = {
        str(path.relative_to(CORE)): hits
        for path in sorted(CORE.rglob("*.py"))
        if path != CORE / "contract" / "logline.py" and (hits := spellings(path.read_text()))
    }
    assert found == {}, "the log-line label is contract/logline.py's: use logline.label and logline.parse"
