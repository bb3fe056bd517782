"""The node check (node_check.py): the profile key and its exports, one node's check with a fake nvidia-smi and a site
command, the launcher's step and verdicts, and the launcher dropping a failing node before the training starts there
(the real run: tests/cluster/test_node_check_cluster.py).

Here the tests that start processes (the process tier); the others: tests/unit/launching/test_node_check.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.launching import node_check
from tests.helpers import REPO, exports

COMMAND = protocol.NODE_CHECK_COMMAND_VAR


def test_the_exported_command_reads_back_as_written_and_runs_nothing(tmp_path):
    written = "touch pwned; test \"$(hostname)\" != node2 && echo '`x`'"
    (line,) = [x for x in exports(tmp_path, json.dumps({"command": written})) if COMMAND in x]
    script = f'{line}\nprintf %s "${COMMAND}"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout == written and not (tmp_path / "pwned").exists()


# --- one node's check -----------------------------------------------------------------------------------------------
def fake_nvidia_smi(tmp_path: Path, gpus: int, code: int = 0) -> dict[str, str]:
    """A PATH whose nvidia-smi lists `gpus` GPUs (and exits with `code`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    lines = "".join(f"echo 'GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:04d})'\n" for i in range(gpus))
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/bash\n[ "$1" = -L ] || exit 9\n{lines}exit {code}\n')
    smi.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def run_node(tmp_path: Path, env: dict[str, str], gpus: int = 0) -> subprocess.CompletedProcess:
    """The node's side as the check step runs it: its own process, its lines on stdout."""
    return subprocess.run(
        [sys.executable, "-m", node_check.MODULE, f"--gpus={gpus}"],
        env=os.environ | {"PYTHONPATH": str(REPO), "SLURMD_NODENAME": "node2"} | env,
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip


def test_a_node_whose_nvidia_smi_lists_fewer_gpus_than_granted_fails_naming_both_counts(tmp_path):
    out = run_node(tmp_path, fake_nvidia_smi(tmp_path, 3) | {"SLURM_GPUS_ON_NODE": "4"})
    assert out.returncode == 1, out
    assert out.stdout.splitlines()[-1] == (
        f"{node_check.PREFIX} node2 FAILED: nvidia-smi -L lists 3 GPU(s), SLURM granted 4 on this node"
    )


def test_a_node_with_all_its_gpus_visible_passes_with_one_ok_line(tmp_path):
    out = run_node(tmp_path, fake_nvidia_smi(tmp_path, 8) | {"SLURM_GPUS_ON_NODE": "4"})
    assert out.returncode == 0, out
    (line,) = out.stdout.splitlines()
    assert node_check.OK.match(line) and line.endswith(", 8 GPU(s) visible)"), line


def test_a_failing_nvidia_smi_fails_the_node_with_its_own_words(tmp_path):
    env = fake_nvidia_smi(tmp_path, 0, code=9)
    smi = Path(env["PATH"].split(":")[0]) / "nvidia-smi"
    error = "Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error"
    smi.write_text(f"#!/bin/bash\necho '{error}'\nexit 15\n")
    out = run_node(tmp_path, env | {"SLURM_GPUS_ON_NODE": "1"})
    assert out.returncode == 1
    assert "node2 FAILED: nvidia-smi -L failed (exit 15): Unable to determine the device handle" in out.stdout


def test_without_nvidia_smi_or_granted_gpus_the_gpus_are_not_counted(tmp_path):
    none = {"PATH": "/usr/bin:/bin"}
    assert (
        node_check.check_this_node(none | {"SLURM_GPUS_ON_NODE": "2"}, 2, which=lambda name: None)
        == node_check.Outcome()
    )
    assert run_node(tmp_path, fake_nvidia_smi(tmp_path, 0) | {"SLURM_GPUS_ON_NODE": "0"}).returncode == 0


def test_the_sites_command_runs_after_the_gpus_and_its_output_is_kept_prefixed(tmp_path):
    env = fake_nvidia_smi(tmp_path, 2) | {"SLURM_GPUS_ON_NODE": "2", COMMAND: "echo Xid 79 on GPU 1 >&2; exit 3"}
    out = run_node(tmp_path, env)
    assert out.returncode == 1
    assert out.stdout.splitlines() == [
        f"{node_check.PREFIX} node2| Xid 79 on GPU 1",
        f"{node_check.PREFIX} node2 FAILED: its command exited with 3",
    ]
    passed = run_node(tmp_path, {COMMAND: "echo fine"})
    assert passed.returncode == 0 and passed.stdout.splitlines()[0] == f"{node_check.PREFIX} node2| fine"


def test_a_command_past_the_limit_is_killed_with_its_children_and_fails_the_node(tmp_path):
    # the child holds the output pipe: only the whole process group's end lets the check end at its limit
    env = {COMMAND: "sleep 300 & sleep 300", protocol.NODE_CHECK_TIMEOUT_VAR: "1"}
    out = run_node(tmp_path, env)
    assert out.returncode == 1
    assert out.stdout.splitlines()[-1] == f"{node_check.PREFIX} node2 FAILED: its command did not end within 1 s"


def fake_srun(tmp_path: Path, body: str) -> list[str]:
    srun = tmp_path / "srun"
    srun.write_text(f"#!/bin/bash\n{body}\n")
    srun.chmod(0o755)
    return [str(srun)]


def test_a_node_without_an_ok_line_is_bad_and_every_line_reaches_the_log(tmp_path):
    p = node_check.PREFIX
    argv = fake_srun(tmp_path, f"echo '{p} node1 ok (0.1 s)'; echo '{p} node2| Xid 79'\n"
                               f"echo '{p} node2 FAILED: its command exited with 1'\n"
                               "echo 'srun: error: node2: task 1: Exited with exit code 1' >&2; exit 1")  # fmt: skip
    seen: list[str] = []
    bad, code = node_check.run_step(argv, {}, ["node1", "node2", "node3"], 30, seen.append)
    assert bad == {"node2": "its command exited with 1", "node3": "no result: its check never reported"}
    assert code == 1 and len(seen) == 4 and seen[1] == f"{p} node2| Xid 79"


def test_a_step_past_its_limit_is_ended_and_its_silent_nodes_are_bad(tmp_path):
    argv = fake_srun(tmp_path, f"echo '{node_check.PREFIX} node1 ok (0.1 s)'; exec sleep 300")
    bad, _ = node_check.run_step(argv, {}, ["node1", "node2"], 1, lambda line: None)
    assert bad == {"node2": "no result within 1 s"}


def test_a_step_that_srun_could_not_start_blames_no_node(tmp_path):
    error = "srun: error: Unable to create step for job 77: Invalid generic resource specification"
    argv = fake_srun(tmp_path, f"echo '{error}' >&2; exit 1")
    assert node_check.run_step(argv, {}, ["node1", "node2"], 30, lambda line: None) == ({}, 1)
