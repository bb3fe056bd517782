"""One plan: the script the executor submits is exactly what `plan_job` and `multinode preview` render."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import StateFolders
from snakemake_executor_multinode.planning.plan import Planner, RuleJob, direct_command, plan_job
from snakemake_executor_multinode.session import Settings
from tests.helpers import ANY_FIRST_SCRIPT, snakemake

pytestmark = [pytest.mark.cluster, pytest.mark.one_release]

RESOURCES = {
    "nodes": 2, "gpus": 1, "cpus_per_task": 2, "mem_mb": 800, "runtime": 30, "env_profile": "ethernet",
    "own_launcher": True,
}  # fmt: skip
SNAKEFILE = """
rule train:
    output: "out/{sample}.txt"
    log: "logs/{sample}.log"
    resources: nodes=2, gpus=1, cpus_per_task=2, mem_mb=800, runtime=30, env_profile="ethernet", own_launcher=True
    shell: "echo {wildcards.sample} > {output}"
"""


def test_the_kept_script_is_exactly_what_plan_job_and_preview_render_for_the_rule(slurm_cluster, tmp_path):
    wd = tmp_path / "same"
    wd.mkdir()
    (wd / "Snakefile").write_text(SNAKEFILE)
    proc = snakemake(wd, "out/a.txt", jobs=1, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [kept] = (StateFolders(wd).logs / "rule_train/sample=a").glob(ANY_FIRST_SCRIPT)
    script = kept.read_text()
    [(run_id, key)] = re.findall(r"^#SBATCH --job-name=mn-(\w+)-train-(\S+)$", script, re.M)

    command = direct_command("echo a > out/a.txt", ["out/a.txt"], ["logs/a.log"])
    job = RuleJob("train", RESOURCES, command, wildcards={"sample": "a"}, key=key, outputs=("out/a.txt",))
    plan = plan_job(job, Planner(Settings(), wd, run_id))
    assert script == plan.script
    assert kept == plan.script_path(kept.name.split(".")[0])

    items = [f"{k}={v}" for k, v in RESOURCES.items()]
    preview = subprocess.run(
        [
            "multinode",
            "preview",
            "--rule",
            "train",
            "--wildcards",
            "sample=a",
            "--workdir",
            str(wd),
            *items,
            "--",
            command,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # the preview is a run of its own: its experiment id (MULTINODE_RUN_ID) is its own, the rest is the same script
    ids = [re.search(r"MULTINODE_RUN_ID=([0-9a-f]+)", text)[1] for text in (preview, script)]
    assert preview.replace(ids[0], "RUNID") == script.replace(f"mn-{run_id}-train-{key}", "mn-preview-train").replace(
        ids[1], "RUNID"
    )
    assert Path(wd / "out/a.txt").read_text() == "a\n"
