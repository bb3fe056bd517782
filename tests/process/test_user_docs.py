"""The user documentation cannot rot: docs/troubleshooting.md quotes the resource errors exactly as `multinode
preview` (the run's own planner) prints them, and docs/training-contract.md's script is the file the training test
runs (workflows/examples/minimal_train.py)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.helpers import REPO

CASES = [
    "nodes=2 gpus=8 cpus_per_task=4 -- multinode torchrun t.py",
    "gpus_per_node=8 -- multinode torchrun t.py",
    "nodes=2 gpu=3 -- multinode torchrun t.py",
    "tasks_per_node=8 gpus=8 -- multinode torchrun t.py",
    "nodes=2 gpus=2 slurm_extra=--nodes=3 -- multinode torchrun t.py",
    "gres=gpu:a100:4,shard:2 -- multinode torchrun t.py",
    "runtime=0 -- echo",
    "mem=8XB -- echo",
    "env_profile=infiniban -- echo",
    "nodes=2 gpus=2 -- python t.py",
]


@pytest.mark.parametrize("args", CASES)
def test_troubleshooting_quotes_the_error_as_printed(args, tmp_path):
    proc = subprocess.run(["multinode", "preview", *args.split()], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode != 0
    message = proc.stderr.strip().splitlines()[-1].removeprefix("multinode preview: ")
    message = message.replace("rule 'rule'", "rule 'train'").replace("rule rule:", "rule train:")
    message = message.split(" (known: ")[0]  # the list of every known key is abbreviated on the page
    assert message in (REPO / "docs" / "troubleshooting.md").read_text(), message


def test_the_training_contract_shows_the_script_the_test_runs():
    page = (REPO / "docs" / "training-contract.md").read_text()
    block = re.search(r"<!-- include:(\S+) -->\n```python\n(.*?)```", page, re.S)
    assert block, "docs/training-contract.md: no <!-- include:FILE --> code block"
    assert block[1] == "workflows/examples/minimal_train.py"
    assert block[2] == (REPO / block[1]).read_text()


# Pages for contributors or for the record, not for a user on the way to a job: no size bound.
NOT_USER_PAGES = {"evidence.md", "design.md"}
USER_PAGES = sorted(p.name for p in (REPO / "docs").glob("*.md") if p.name not in NOT_USER_PAGES)


@pytest.mark.parametrize("page", USER_PAGES)
def test_each_user_page_is_under_20_kb(page):
    """A user page says what to do; the tests and timings behind it go to docs/evidence.md."""
    size = len((REPO / "docs" / page).read_bytes())
    assert size < 20_000, f"docs/{page} is {size} bytes: move tests and timings to docs/evidence.md"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", [*USER_PAGES, *sorted(NOT_USER_PAGES)])
def test_every_relative_link_of_a_page_reaches_a_file_and_its_heading(page):
    path = REPO / "docs" / page
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", dest.read_text(), flags=re.S), re.M)
            if anchor not in {_anchor(h) for h in headings}:
                broken.append(target)
    assert broken == [], f"docs/{page}: links to nothing: {broken}"
