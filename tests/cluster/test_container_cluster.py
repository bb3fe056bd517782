"""Containers for real: a 2-node job whose ranks run inside a podman image, on the local SLURM cluster.

The image is built offline (tests/containers/build_image.sh: `podman import` of a root filesystem with a shell, the
libraries python and torch load and a marker; cached by name). Python and torch come from a read-only mount of the
host's interpreter prefix (the profile's `mounts`). Podman's own settings for this host live in files of the test's
(CONTAINERS_CONF, CONTAINERS_STORAGE_CONF, exported by the profile's `env`): vfs storage, cgroupfs, runc (crun
refuses this host's hybrid cgroup layout), file events and ulimits this host lets root set.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from snakemake_executor_multinode.launching import proctree
from tests.helpers import DEFAULT_SLURM, REPO, TEST_SLURM, job_logs, slurm, snakemake, wait_for

pytestmark = pytest.mark.cluster
IMAGE = "localhost/multinode-probe:1"
# One storage per SLURM release: the 24.11 sandbox's jobs (and `podman` on its PATH) run podman 5, which rewrites the
# database podman 4 (Debian 12's) reads.
PODMAN_DIR = Path(
    os.environ.get(
        "MULTINODE_PODMAN_DIR", "/var/tmp/multinode-podman" + ("" if TEST_SLURM == DEFAULT_SLURM else f"-{TEST_SLURM}")
    )
)
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
"""
STORAGE_CONF = """\
[storage]
driver = "vfs"
graphroot = "{dir}/graph"
runroot = "{dir}/run"
"""


@pytest.fixture(scope="session")
def podman_image() -> dict[str, str]:
    """The probe image (built when absent) and the variables that point podman at the test's configuration."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (scripts/bootstrap.sh installs it)")
    PODMAN_DIR.mkdir(parents=True, exist_ok=True)
    (PODMAN_DIR / "containers.conf").write_text(CONTAINERS_CONF)
    (PODMAN_DIR / "storage.conf").write_text(STORAGE_CONF.format(dir=PODMAN_DIR))
    env = {
        "CONTAINERS_CONF": str(PODMAN_DIR / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(PODMAN_DIR / "storage.conf"),
    }
    start = time.monotonic()
    build = subprocess.run(
        ["bash", str(REPO / "tests" / "containers" / "build_image.sh"), IMAGE, sys.executable],
        env=os.environ | env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    print(f"\n{build.stdout.strip()} ({time.monotonic() - start:.1f} s with the library scan)")
    return env


def write_workflow(workdir: Path, env: dict[str, str], *, container: bool, wait_usr2: bool = False) -> None:
    prefix = sys.base_prefix
    box = {
        "runtime": "podman",
        "image": IMAGE,
        "mounts": [f"{prefix}:{prefix}:ro"],
        "python": os.path.realpath(sys.executable),
        "gpus": "none",  # the sandbox's GPUs are fake: no CDI spec, no driver
    }
    profile = {"env": env} | ({"container": box} if container else {})
    (workdir / "profiles.yaml").write_text(json.dumps({"profiles": {"probe": profile}}))  # JSON is YAML
    shutil.copy(REPO / "tests" / "containers" / "probe.py", workdir / "probe.py")
    flag = " --wait-usr2" if wait_usr2 else ""
    (workdir / "Snakefile").write_text(
        "rule probe:\n"
        '    output: "results/probe.json"\n'
        '    resources: nodes=2, gpus=0, cpus_per_task=2, runtime=10, env_profile="probe"\n'
        f'    shell: "multinode torchrun --nproc_per_node=2 probe.py {{output}}{flag}"\n'
    )


def reports(workdir: Path) -> list[dict]:
    return sorted(json.loads((workdir / "results" / "probe.json").read_text()), key=lambda r: r["rank"])


def test_two_node_job_runs_every_rank_inside_the_podman_image_and_usr2_reaches_them(
    slurm_cluster, podman_image, tmp_path
):
    """Through Snakemake and the env_profile: 2 nodes x 2 ranks, each rank inside the image (its marker, the
    container's PID 1 relay), a gloo all-reduce across the nodes, and SLURM's USR2 (as before the time limit)
    reaching every worker in the containers while torchrun's agent survives it (the job succeeds)."""
    write_workflow(tmp_path, podman_image, container=True, wait_usr2=True)
    cmd = [sys.executable, "-m", "snakemake", "--executor", "multinode", "--jobs", "1", "--latency-wait", "5"]
    proc = subprocess.Popen(
        [*cmd, "--multinode-profile-file", "profiles.yaml"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    jobid = None
    try:

        def waiting() -> Path | None:
            logs = job_logs(tmp_path, "probe")
            text = logs[0].read_text() if logs else ""
            return logs[0] if text.count("WAITING rank") == 4 else None

        log = wait_for(waiting, "4 ranks waiting for USR2", 240, proc)
        jobid = log.name.split(".")[0]
        slurm(slurm_cluster, "scancel", "--signal=USR2", jobid)  # every step's processes, as --signal=USR2@T
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            if jobid:  # a failed wait leaves no job running on the shared cluster
                slurm_cluster.run("scancel", jobid, check=False)
    assert proc.returncode == 0, out
    got = reports(tmp_path)
    assert [r["rank"] for r in got] == [0, 1, 2, 3] and {r["world"] for r in got} == {4}
    head, other = got[0]["node"], got[2]["node"]  # the job's two nodes (whichever were free)
    assert [r["node"] for r in got] == [head, head, other, other] and head != other, got
    assert all(r["image"] == "multinode-probe" and r["marker"] for r in got)  # inside the image
    assert {r["pid1"] for r in got} == {"sh"}  # the container's relay, not the node's init
    assert {r["sum"] for r in got} == {10.0}  # 1+2+3+4 across both nodes
    assert all(r["usr2"] for r in got)  # the checkpoint signal reached every worker in the containers
    text = log.read_text()
    assert "each node's torchrun runs in podman image localhost/multinode-probe:1" in text
    script = log.with_suffix(".sh").read_text()
    assert "export MULTINODE_CONTAINER_RUNTIME=podman" in script


def test_container_launch_overhead_against_bare_metal(slurm_cluster, podman_image, tmp_path):
    """The same 2-node probe with and without the container: both succeed, the ranks report from where they ran,
    and the difference in job time is printed (a figure, not a verdict: the machine is shared)."""
    times = {}
    for container in (False, True):
        workdir = tmp_path / ("podman" if container else "bare")
        workdir.mkdir()
        write_workflow(workdir, podman_image, container=container)
        start = time.monotonic()
        snakemake(workdir, "--multinode-profile-file", "profiles.yaml", timeout=300)
        times[container] = time.monotonic() - start
        images = {r["image"] for r in reports(workdir)}
        assert images == ({"multinode-probe"} if container else {"debian"}), images
    print(
        f"\n2-node x 2-rank probe through Snakemake: bare {times[False]:.1f} s, podman {times[True]:.1f} s "
        f"(+{times[True] - times[False]:.1f} s)"
    )


def test_a_container_directive_on_a_multi_node_rule_is_refused_before_anything_is_submitted(slurm_cluster, tmp_path):
    """Snakemake's own `container:` (with apptainer deployment) would run the rule in the image on the head node,
    where srun does not exist: `multinode check` (and a run, which plans the same way) refuses it, pointing to the
    profile key. Without apptainer deployment Snakemake ignores the directive, and so does the plan."""
    (tmp_path / "Snakefile").write_text(
        "rule train:\n"
        '    output: "out.txt"\n'
        '    container: "docker://pytorch/pytorch:2.3.0"\n'
        "    resources: nodes=2, gpus=0, runtime=5\n"
        '    shell: "multinode torchrun train.py {output}"\n'
    )
    fake = tmp_path / "bin" / "apptainer"  # Snakemake asks for the command's version; nothing is pulled or run
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "apptainer version 1.2.5"\n')
    fake.chmod(0o755)
    env = slurm_cluster.env | {"PATH": f"{fake.parent}:{os.environ['PATH']}"}
    check = [sys.executable, "-m", "snakemake_executor_multinode.cli", "check"]
    refused = subprocess.run([*check, "--sdm", "apptainer"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "rule 'train': the container: directive ('docker://pytorch/pytorch:2.3.0') cannot run a multi-node job" in (
        refused.stderr
    )
    assert "container: {runtime: apptainer, image: docker://pytorch/pytorch:2.3.0}" in refused.stderr
    plain = subprocess.run(check, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "train: 2 nodes, no GPU" in plain.stdout


def test_a_stalled_job_in_podman_is_ended_with_every_ranks_stack(slurm_cluster, podman_image, tmp_path):
    """The stall of tests/workflows/stall (rank 3 sleeps, ranks 0-2 wait in a barrier) with every rank inside the
    image: the watchdog on each node finds the workers below podman's client (conmon detaches from it) and py-spy,
    run on the node, reads their stacks through /proc (the image needs no py-spy)."""
    write_workflow(tmp_path, podman_image, container=True)
    shutil.copy(REPO / "tests" / "workflows" / "stall" / "stall.py", tmp_path / "stall.py")
    (tmp_path / "Snakefile").write_text(
        "rule train:\n"
        '    output: "done.txt"\n'
        '    resources: nodes=2, gpus=0, cpus_per_task=2, runtime=30, env_profile="probe", stall_timeout="20s",\n'
        "        max_restarts=0\n"  # the stall's verdict at once (the in-job restart: test_restart_cluster.py)
        '    shell: "multinode torchrun --nproc_per_node=2 stall.py && touch {output}"\n'
    )
    proc = snakemake(tmp_path, "--multinode-profile-file", "profiles.yaml", timeout=600, check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said
    assert "stalled: no progress for 20s on any rank; stacks in" in said, said
    (log,) = job_logs(tmp_path, "train")
    text = log.read_text()
    stacks = {int(m[1]) for m in re.finditer(r"^\[node\d rank(\d)\] stack\| ", text, re.M)}
    assert stacks == {0, 1, 2, 3}, text
    assert re.search(r"^\[node\d rank3\] stack\| .*<module> \(stall\.py:\d+\)", text, re.M), text
    assert re.search(r"^\[node\d rank0\] stack\| .*barrier \(.*distributed_c10d\.py:\d+\)", text, re.M), text
    assert re.search(r"rank 3 differs: <module> \(stall\.py:\d+\)", said), said
    # nothing of the job is left on any node (the sandbox's nodes share this kernel's /proc)
    job = log.name.split(".")[0].encode()

    def of_the_job(pid: int) -> bool:
        try:
            return proctree.environ(pid).get(b"SLURM_JOB_ID") == job
        except OSError:
            return False

    wait_for(lambda: not [p for kids in proctree.children().values() for p in kids if of_the_job(p)], "no process", 60)
