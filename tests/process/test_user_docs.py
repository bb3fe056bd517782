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
