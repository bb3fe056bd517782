"""The node check (node_check.py) on the real local SLURM cluster: a node whose check fails is never used, and named.

The profile's `node_check.command` fails on exactly one node: the one that runs the check as the step's second node
(SLURM_NODEID 1) names itself in a marker file on the shared filesystem on the first check, and from then on the
command fails wherever the marker names the node it runs on, printing why. With a spare (spare_nodes=1) the job holds
3 nodes: the launcher drops the bad node before the training starts, the spare takes its place, one SLURM job ends
with exit 0. Without spares the job fails before its training starts, the failed-node marker names the node, and
Snakemake's retry (--retries 1) runs on the other two nodes, excluding it.

The check step's cost per launch (`node check: ... in S s`) is printed as `[figures] ...` (pytest -s).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import JobFiles, StateFolders
from snakemake_executor_multinode.launching.node_check import PREFIX
from tests.helpers import FAILING_CHECK, figures, job_logs, records, sacct_jobs, snakemake

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.one_release]

# Every rank says where it trained: rank-<job>-<rank>.txt holds its host.
TRAIN = """
import os, pathlib, socket
rank, job = os.environ["RANK"], os.environ["SLURM_JOB_ID"]
pathlib.Path(f"rank-{job}-{rank}.txt").write_text(socket.gethostname().split(".")[0])
print("TRAINING rank", rank, "of", os.environ["WORLD_SIZE"], "on", socket.gethostname(), flush=True)
"""

CHECK_TIME = re.compile(r"node check: (\d+) of (\d+) node\(s\) ok in ([\d.]+) s")


def workflow(wd: Path, spare_nodes: int) -> Path:
    """The rule, and the profile whose check fails on one node; the marker's path (it names the bad node)."""
    wd.mkdir(parents=True)
    mark = wd / "bad-node.txt"
    (wd / "train.py").write_text(TRAIN)
    (wd / "profiles.yaml").write_text(
        "profiles:\n  checked:\n    node_check:\n"
        f"      command: {json.dumps(FAILING_CHECK.format(mark=mark))}\n      timeout: 60\n"
    )
    (wd / "Snakefile").write_text(
        'rule train:\n    output: "out.txt"\n'
        f'    resources: nodes=2, gpus=1, spare_nodes={spare_nodes}, env_profile="checked"\n'
        '    shell: "multinode torchrun train.py && touch {output}"\n'
    )
    return mark


def ranks(wd: Path, job: str) -> dict[int, str]:
    """rank -> the host it trained on, in the job `job`."""
    return {int(p.stem.split("-")[2]): p.read_text() for p in wd.glob(f"rank-{job}-*.txt")}


def test_a_node_failing_its_check_is_never_used_and_named_and_the_spare_trains(slurm_cluster, tmp_path):
    wd = tmp_path / "spare"
    mark = workflow(wd, spare_nodes=1)
    proc = snakemake(wd, "--multinode-profile-file", "profiles.yaml", jobs=1, timeout=600, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    bad = mark.read_text().strip()
    (log,) = job_logs(wd, "train")
    text = log.read_text()
    (rec,) = records(wd)  # one SLURM job: no retry, no resubmission
    job = rec["jobid"]
    trained = ranks(wd, job)
    assert sorted(trained) == [0, 1], trained
    assert bad not in trained.values(), (bad, trained)  # never used
    spare = trained[1]  # the job holds 3 of the cluster's nodes: the head, the bad node and the spare
    assert len({trained[0], spare, bad}) == 3, (trained, bad)
    # named: the node's own output and result line, the launcher's verdict
    assert f"{PREFIX} {bad}| marked bad: {bad}" in text, text
    assert f"{PREFIX} {bad} FAILED: its command exited with 1" in text, text
    assert f"node {bad} failed its node check: its command exited with 1; spare {spare} takes its place" in text, text
    assert len(re.findall(rf"^{re.escape(PREFIX)} \S+ ok \(", text, re.M)) == 2, text
    assert len(re.findall(r"TRAINING rank \d of 2", text)) == 2, text
    # on record, and `multinode status` shows it
    (line,) = [json.loads(x) for x in JobFiles.from_log(log).replacements.read_text().splitlines()]
    assert (line["event"], line["node"], line["spare"], line["relaunch"]) == ("check_failed", bad, spare, 0), line
    status = subprocess.run(
        [sys.executable, "-m", "snakemake_executor_multinode.cli", "status"],
        cwd=wd, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    said = f"{bad} -> {spare} (failed its node check: its command exited with 1)"
    assert said in status.stdout, status.stdout + status.stderr
    assert sacct_jobs(slurm_cluster, {rec["job_name"]}, {job}) == {job: ["COMPLETED"]}
    (cost,) = CHECK_TIME.findall(text)
    assert cost[:2] == ("2", "3"), cost
    figures("node check, 3 nodes", check_step_s=float(cost[2]), bad=bad, spare=spare)


def test_without_a_spare_the_failing_node_is_named_and_the_retry_runs_elsewhere(slurm_cluster, tmp_path):
    wd = tmp_path / "retry"
    mark = workflow(wd, spare_nodes=0)
    proc = snakemake(
        wd, "--multinode-profile-file", "profiles.yaml", "--retries", "1", jobs=1, timeout=600, check=False
    )
    out = proc.stdout + proc.stderr
    bad = mark.read_text().strip()
    assert f"failing node {bad}" in out, out[-4000:]  # Snakemake's error names the node
    assert proc.returncode == 0, out[-4000:]
    first, second = sorted(records(wd), key=lambda r: r["attempt"])
    scripts = {int(re.search(r"attempt(\d)", p.name).group(1)): p for p in StateFolders(wd).logs.rglob("*.sh")}
    assert f"#SBATCH --exclude={bad}" in scripts[2].read_text().splitlines()
    logs = {int(re.search(r"attempt(\d)", p.name).group(1)): p.read_text() for p in job_logs(wd, "train")}
    # the first attempt: the check failed on the node, the training never started
    assert f"node {bad} failed its node check: its command exited with 1; no spare left" in logs[1], logs[1]
    assert f"node {bad} is named for the retry to exclude" in logs[1], logs[1]
    assert ranks(wd, first["jobid"]) == {} and "TRAINING rank" not in logs[1], logs[1]
    # the retry: both of its nodes pass their check, neither rank on the bad node
    trained = ranks(wd, second["jobid"])
    assert sorted(trained) == [0, 1] and bad not in trained.values(), (bad, trained)
    assert len(set(trained.values())) == 2, trained
    assert len(re.findall(rf"^{re.escape(PREFIX)} \S+ ok \(", logs[2], re.M)) == 2, logs[2]
