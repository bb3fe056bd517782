"""The job script: one template, rendered per job; what `multinode preview` prints is what runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path, PurePath

from snakemake_executor_multinode.cli import main
from snakemake_executor_multinode.planning import environment, jobscript
from snakemake_executor_multinode.planning.request import build_request
from snakemake_executor_multinode.planning.settings import PlanningSettings
from tests.helpers import REPO

GOLDEN = REPO / "tests" / "golden"

# The seed recipe's cluster: 2 nodes x 8 A6000, 64 CPUs, 14 days, InfiniBand, conda in the job.
BLOG_PROFILES = """\
default: a6000
profiles:
  a6000:
    extends: infiniband
    nccl: {hca: mlx5_0, gid_index: 0, tc: 106, gdr_level: 2, launch_mode: GROUP, min_nrings: 4}  # the site's
    cuda: /path/to/cuda-11.8
    conda: {base: /path/to/anaconda3, env: my_env}
"""
BLOG_RESOURCES = dict(
    nodes=2,
    gpus=8,
    cpus_per_task=64,
    mem_mb=400000,
    runtime=20160,
    slurm_partition="gpu_A6000",
    slurm_account="your_account",
    nodelist="node110,node111",
)


def blog_script(tmp_path: Path) -> str:
    f = tmp_path / "env.yaml"
    f.write_text(BLOG_PROFILES)
    profiles = environment.load_profiles(f)
    req = build_request("train", BLOG_RESOURCES, threads=1, env_profile=profiles.default)
    ctx = jobscript.ScriptContext(
        command="multinode torchrun train.py --data results/data/train.bin --out results/model/final.pt",
        workdir=PurePath("/work/project"),
        log_dir=jobscript.log_dir_for(PurePath(".snakemake/multinode/logs"), req),
        state_dir=PurePath("/work/project/.snakemake/multinode/state"),
        job_name="mn-0123abcd-train",
    )
    return jobscript.render(req, ctx, environment.render_lines(environment.resolve(profiles, profiles.default)))


def test_blog_configuration_renders_the_golden_script(tmp_path):
    script = blog_script(tmp_path)
    golden = GOLDEN / "blog_train.sh"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(script)
    assert script == golden.read_text()


def test_rendered_script_is_valid_bash(tmp_path):
    path = tmp_path / "job.sh"
    path.write_text(blog_script(tmp_path))
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


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


def test_max_requeues_0_bounds_the_jobs_own_requeues_and_still_lets_slurm_requeue_it():
    """--multinode-max-requeues counts the job's own requeues only: an admin's `scontrol requeue` or a preemption
    must still requeue the job (SLURM refuses both for a --no-requeue job: found by the feature/fault matrix)."""
    ctx = jobscript.ScriptContext("true", PurePath("/w"), PurePath("logs"), PurePath("/w/s"), "n")
    for budget in (0, 3):
        req = build_request("t", {"nodes": 2}, defaults=PlanningSettings(max_requeues=budget))
        assert req.max_requeues == budget
        opts = jobscript.sbatch_options(req, ctx)
        assert "--requeue" in opts and "--no-requeue" not in opts, (budget, opts)


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


def test_preview_refuses_bad_input_with_the_same_message(capsys):
    assert main(["preview", "nodes=2", "gpus=8", "cpus_per_task=4"]) == 2
    assert "resource cpus_per_task=4 is invalid: must be at least gpus=8" in capsys.readouterr().err


def spare_script(tmp_path: Path, **resources: object) -> str:
    req = build_request("train", {"nodes": 2, "gpus": 1, **resources})
    ctx = jobscript.ScriptContext("true", tmp_path, PurePath("logs"), tmp_path / "state", "n")
    return jobscript.render(req, ctx, [])


def test_spare_nodes_ask_for_more_nodes_with_no_kill_and_the_launcher_trains_on_the_rules_nodes(tmp_path):
    script = spare_script(tmp_path, spare_nodes=1)
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --nodes=3" in header and "#SBATCH --no-kill" in header
    exports = next(line for line in script.splitlines() if "MULTINODE_TRAIN_NODES" in line)
    out = subprocess.run(["bash", "-c", f'{exports}\necho "$MULTINODE_TRAIN_NODES"'], capture_output=True, text=True)
    assert out.stdout.strip() == "2"
    assert "MULTINODE_NODES=2 " in script  # the training's nodes, not the allocation's


def test_without_spares_the_job_asks_for_its_nodes_and_a_node_failure_ends_it(tmp_path):
    script = spare_script(tmp_path)
    assert "#SBATCH --nodes=2" in script
    assert "--no-kill" not in script and "MULTINODE_TRAIN_NODES" not in script


def test_preview_shows_the_spares(tmp_path, capsys):
    argv = ["preview", "--rule", "train", "--workdir", str(tmp_path), "nodes=2", "gpus=1", "spare_nodes=1"]
    assert main([*argv, "--", "multinode", "torchrun", "train.py"]) == 0
    captured = capsys.readouterr()
    assert "#SBATCH --nodes=3" in captured.out and "#SBATCH --no-kill" in captured.out
    assert "1 spare node(s) beyond the 2 the step trains on" in captured.err
