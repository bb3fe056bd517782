"""The job script: one template, rendered per job; what `multinode preview` prints is what runs.
The tests that start processes: tests/process/planning/test_jobscript.py."""

from __future__ import annotations

import os
from pathlib import PurePath

from snakemake_executor_multinode.cli import main
from snakemake_executor_multinode.planning import jobscript
from snakemake_executor_multinode.planning.request import build_request
from tests.helpers import REPO, blog_script, spare_script

GOLDEN = REPO / "tests" / "golden"


def test_blog_configuration_renders_the_golden_script(tmp_path):
    script = blog_script(tmp_path)
    golden = GOLDEN / "blog_train.sh"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(script)
    assert script == golden.read_text()


def test_sbatch_header_carries_every_resource(tmp_path):
    header = [line for line in blog_script(tmp_path).splitlines() if line.startswith("#SBATCH")]
    for flag in (
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=64",
        "--gres=gpu:8",
        "--partition=gpu_A6000",
        "--account=your_account",
        "--time=20160",
        "--mem=400000M",
        "--nodelist=node110,node111",
        "--open-mode=append",
        "--signal=USR2@120",
        "--requeue",
        "--export=ALL",
    ):
        assert f"#SBATCH {flag}" in header


def test_gpus_per_node_flag_and_gpu_type():
    req = build_request("t", {"gpus": 4, "gpu_type": "a100", "gpu_flag": "gpus-per-node"})
    ctx = jobscript.ScriptContext("true", PurePath("/w"), PurePath("logs"), PurePath("/w/s"), "n")
    assert "--gpus-per-node=a100:4" in jobscript.sbatch_options(req, ctx)
    req = build_request("t", {"gpus": 4, "gpu_type": "a100"})
    assert "--gres=gpu:a100:4" in jobscript.sbatch_options(req, ctx)


def test_wildcards_become_safe_names_and_distinct_values_stay_distinct():
    a = jobscript.safe_component("name=a b;$(x)")
    b = jobscript.safe_component("name=a_b;$(x)")
    assert a != b and all(c.isalnum() or c in "_.=+-" for c in a)
    assert jobscript.safe_component("sample=s1") == "sample=s1"


def test_the_command_reaches_bash_as_one_quoted_word(tmp_path):
    req = build_request("t", {})
    ctx = jobscript.ScriptContext("echo 'it''s' \"$HOME\"; exit 0", PurePath("/w"), PurePath("l"), PurePath("/s"), "n")
    script = jobscript.render(req, ctx, [])
    assert "bash -c 'echo '\"'\"'it'\"'\"''\"'\"'s'\"'\"' \"$HOME\"; exit 0' &" in script


def test_preview_refuses_bad_input_with_the_same_message(capsys):
    assert main(["preview", "nodes=2", "gpus=8", "cpus_per_task=4"]) == 2
    assert "resource cpus_per_task=4 is invalid: must be at least gpus=8" in capsys.readouterr().err


def test_without_spares_the_job_asks_for_its_nodes_and_a_node_failure_ends_it(tmp_path):
    script = spare_script(tmp_path)
    assert "#SBATCH --nodes=2" in script
    assert "--no-kill" not in script and "MULTINODE_TRAIN_NODES" not in script
