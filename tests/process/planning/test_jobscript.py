"""The job script: one template, rendered per job; what `multinode preview` prints is what runs.

Here the tests that start processes (the process tier); the others: tests/unit/planning/test_jobscript.py."""

from __future__ import annotations

import subprocess

from snakemake_executor_multinode.cli import main
from tests.helpers import BLOG_PROFILES, BLOG_RESOURCES, blog_script, spare_script


def test_rendered_script_is_valid_bash(tmp_path):
    path = tmp_path / "job.sh"
    path.write_text(blog_script(tmp_path))
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def test_preview_prints_the_same_script_the_executor_submits(tmp_path, capsys):
    f = tmp_path / "env.yaml"
    f.write_text(BLOG_PROFILES)
    items = [f"{k}={v}" for k, v in BLOG_RESOURCES.items()]
    assert (
        main(
            [
                "preview",
                "--rule",
                "train",
                "--profile-file",
                str(f),
                "--workdir",
                str(tmp_path),
                *items,
                "--",
                "multinode",
                "torchrun",
                "train.py",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("#!/bin/bash") and "#SBATCH --gres=gpu:8" in out
    assert "conda activate my_env" in out and "multinode torchrun train.py" in out


def test_spare_nodes_ask_for_more_nodes_with_no_kill_and_the_launcher_trains_on_the_rules_nodes(tmp_path):
    script = spare_script(tmp_path, spare_nodes=1)
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --nodes=3" in header and "#SBATCH --no-kill" in header
    exports = next(line for line in script.splitlines() if "MULTINODE_TRAIN_NODES" in line)
    out = subprocess.run(["bash", "-c", f'{exports}\necho "$MULTINODE_TRAIN_NODES"'], capture_output=True, text=True)
    assert out.stdout.strip() == "2"
    assert "MULTINODE_NODES=2 " in script  # the training's nodes, not the allocation's


def test_preview_shows_the_spares(tmp_path, capsys):
    argv = ["preview", "--rule", "train", "--workdir", str(tmp_path), "nodes=2", "gpus=1", "spare_nodes=1"]
    assert main([*argv, "--", "multinode", "torchrun", "train.py"]) == 0
    captured = capsys.readouterr()
    assert "#SBATCH --nodes=3" in captured.out and "#SBATCH --no-kill" in captured.out
    assert "1 spare node(s) beyond the 2 the step trains on" in captured.err
