"""README.md's quick start, as written: its Snakefile rule, its site profile and its commands (the code blocks after
the `<!-- quickstart:NAME -->` markers) run on the local cluster with a plain torchrun script of the user's kind
(torch.distributed, gloo on CPU: all-reduce, write the result). A change to the README that breaks them fails here."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
import torch

from tests.helpers import REPO

pytestmark = pytest.mark.cluster

BLOCK = re.compile(r"<!-- quickstart:(\S+) -->\n```[a-z]*\n(.*?)```", re.S)

TRAIN = """\
import argparse, os, torch, torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--data")
p.add_argument("--out")
args = p.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
if rank == 0:
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    torch.save({"world": world, "sum": total.item(), "data": open(args.data).read()}, args.out)
dist.destroy_process_group()
"""


def quickstart() -> dict[str, str]:
    blocks = dict(BLOCK.findall((REPO / "README.md").read_text()))
    assert {"Snakefile", "profile", "commands"} <= set(blocks), sorted(blocks)
    return blocks


def test_the_quick_start_blocks_are_there_and_ask_for_two_nodes_of_two_gpus():
    blocks = quickstart()
    assert "nodes=2" in blocks["Snakefile"] and "gpus=2" in blocks["Snakefile"]
    assert "multinode torchrun train.py" in blocks["Snakefile"]
    assert "executor: multinode" in blocks["profile"]


def test_the_readme_quick_start_runs_as_written(slurm_cluster, tmp_path):
    blocks = quickstart()
    profile_path = re.search(r"^# (\S+/config\.yaml)", blocks["profile"], re.M)
    assert profile_path, "the profile block's first line names its file: # profiles/NAME/config.yaml"
    (tmp_path / "Snakefile").write_text(blocks["Snakefile"])
    (tmp_path / profile_path[1]).parent.mkdir(parents=True)
    (tmp_path / profile_path[1]).write_text(blocks["profile"])
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.txt").write_text("some tokens\n")
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", blocks["commands"]],
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "multinode check: OK" in proc.stdout + proc.stderr
    outputs = re.findall(r'output: "([^"]+)"', blocks["Snakefile"])
    result = torch.load(tmp_path / outputs[0])
    assert result == {"world": 4, "sum": 1.0 + 2 + 3 + 4, "data": "some tokens\n"}  # 2 nodes x 2 ranks
