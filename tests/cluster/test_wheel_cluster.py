"""The release users install: the sdist and the wheel built from this checkout (`python -m build`: the sdist first,
the wheel from the unpacked sdist, so both are complete), the wheel installed into a fresh venv, and from that venv
`multinode --version`, `multinode preview` and a 2-node workflow on the local cluster (`python -m snakemake
--executor multinode`, a torch gloo script under `multinode torchrun`).

This machine has an editable install of the checkout in its system site-packages (a .pth that puts the checkout on
sys.path), so every step proves it ran the wheel's copy, not the checkout: the packages' `__file__`, the worker's
interpreter and the `multinode` it found on the job's PATH all lie in the venv."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PACKAGES = ("snakemake_executor_multinode", "snakemake_executor_plugin_multinode")
DIST_NAME = "snakemake_executor_plugin_multinode"  # the project name as wheel and sdist file names spell it

SNAKEFILE = """\
rule train:
    input: "data/train.txt"
    output: "model/final.pt"
    resources: nodes=2, gpus=2, cpus_per_task=2, mem_mb=1000, runtime=10
    shell: "multinode torchrun train.py --data {input} --out {output}"
"""

# Rank 0 records what the job ran with: the worker's interpreter (torchrun starts workers with its own, the
# interpreter of the `multinode` script it was started by), where the package is imported from there, and which
# `multinode` the job's PATH names.
TRAIN = """\
import argparse, os, shutil, sys, torch, torch.distributed as dist
import snakemake_executor_multinode

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
    torch.save({
        "world": world,
        "sum": total.item(),
        "data": open(args.data).read(),
        "python": sys.executable,
        "package": snakemake_executor_multinode.__file__,
        "multinode": shutil.which("multinode"),
    }, args.out)
dist.destroy_process_group()
"""


def the_version() -> str:
    """`__version__` in the core's __init__.py, the version's one place (pyproject.toml reads it from there)."""
    tree = ast.parse((REPO / "snakemake_executor_multinode" / "__init__.py").read_text())
    return next(
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__version__"]
    )


def tracked(*paths: str) -> list[str]:
    """The files git tracks under these paths (the checkout's, never what lies untracked in it)."""
    out = subprocess.run(["git", "ls-files", "-z", "--", *paths], cwd=REPO, capture_output=True, text=True, check=True)
    return [p for p in out.stdout.split("\0") if p and (REPO / p).is_file()]


@dataclass
class Release:
    wheel: Path
    sdist: Path
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def env(self) -> dict[str, str]:
        """The venv first on PATH (as after `activate`), and no PYTHONPATH that could name the checkout."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        return env | {
            "PATH": f"{self.venv / 'bin'}:{env['PATH']}",
            "VIRTUAL_ENV": str(self.venv),
            "PYTHONUNBUFFERED": "1",
        }

    def run(self, *cmd: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(c) for c in cmd], cwd=cwd, env=self.env(), capture_output=True, text=True, timeout=timeout
        )


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Release:
    """Build the sdist and the wheel into a temp folder, make a fresh venv and install the wheel into it."""
    for module in ("build", "hatchling"):
        probe = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
        assert probe.returncode == 0, f"{module} is missing: pip install build hatchling (both in the test extra)"
    tmp = tmp_path_factory.mktemp("release")
    dist = tmp / "dist"
    # No build isolation: the build backend (hatchling) is installed here, and the build needs nothing from the network
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    version = the_version()
    wheel = dist / f"{DIST_NAME}-{version}-py3-none-any.whl"
    sdist = dist / f"{DIST_NAME}-{version}.tar.gz"
    assert sorted(dist.iterdir()) == sorted([wheel, sdist]), sorted(p.name for p in dist.iterdir())
    venv = tmp / "venv"
    # --system-site-packages and --no-deps: the dependencies (torch, Snakemake, its executor interface, PyYAML) are
    # the system's, never downloaded again (a CUDA torch is several GB); the package itself comes only from the
    # wheel (--no-index: pip may not look anywhere else).
    made = subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)], capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    installed = subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
         "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return Release(wheel, sdist, venv)


def test_the_wheel_holds_both_packages_with_every_file_they_read_and_nothing_else(release):
    names = set(zipfile.ZipFile(release.wheel).namelist())
    shipped = set(tracked(*PACKAGES))
    # every tracked file of the packages, the templates and builtin.yaml (read through importlib.resources) included
    assert shipped - names == set(), sorted(shipped - names)
    for data in (
        "snakemake_executor_multinode/planning/templates/job.sh",
        "snakemake_executor_multinode/planning/templates/array.sh",
        "snakemake_executor_multinode/planning/profiles/builtin.yaml",
        "snakemake_executor_multinode/sandbox/templates/slurm.conf",
        "snakemake_executor_multinode/sandbox/templates/slurm-rootfs.sh",
    ):
        assert data in names, data
    info = f"{DIST_NAME}-{the_version()}.dist-info/"
    outside = {n for n in names if not n.startswith((*(p + "/" for p in PACKAGES), info))}
    assert outside == set(), sorted(outside)
    entry_points = zipfile.ZipFile(release.wheel).read(info + "entry_points.txt").decode()
    assert "multinode = snakemake_executor_multinode.cli:main" in entry_points
    assert "check = snakemake_executor_plugin_multinode.check:main" in entry_points
    metadata = zipfile.ZipFile(release.wheel).read(info + "METADATA").decode()
    assert f"\nVersion: {the_version()}\n" in metadata


def test_the_sdist_holds_the_project_and_nothing_untracked(release):
    with tarfile.open(release.sdist) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if m.isfile()}
    for needed in ("pyproject.toml", "README.md", "CHANGELOG.md", "LICENSE", *tracked(*PACKAGES)):
        assert needed in members, needed
    top = {m.split("/")[0] for m in members}
    # what pyproject names (its one list), the metadata, and .gitignore (hatchling always puts it in)
    named = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["sdist"]
    allowed = {*named["only-include"], "PKG-INFO", ".gitignore"}
    assert top <= allowed, sorted(top - allowed)
    assert release.sdist.stat().st_size < 5_000_000, release.sdist.stat().st_size


def test_the_venv_imports_the_packages_from_the_wheel_not_the_checkout(release, tmp_path):
    code = f"import {PACKAGES[0]} as a, {PACKAGES[1]} as b; print(a.__file__, b.__file__)"
    proc = release.run(release.python, "-c", code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    files = [Path(line) for line in proc.stdout.split()]
    assert len(files) == 2, proc.stdout
    for f in files:
        assert f.is_relative_to(release.venv), f"{f}: imported from outside the venv {release.venv}"
        assert not f.is_relative_to(REPO), f
    # the `multinode` script is the venv's, and runs the venv's interpreter
    script = release.venv / "bin" / "multinode"
    assert script.read_text().splitlines()[0] == f"#!{release.python}"


def test_multinode_version_from_the_venv(release, tmp_path):
    proc = release.run(release.venv / "bin" / "multinode", "--version", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"multinode {the_version()}"


def workflow(folder: Path) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "Snakefile").write_text(SNAKEFILE)
    (folder / "train.py").write_text(TRAIN)
    (folder / "data").mkdir(exist_ok=True)
    (folder / "data" / "train.txt").write_text("some tokens\n")
    return folder


def test_multinode_preview_from_the_venv_prints_the_two_node_job_script(release, tmp_path):
    wd = workflow(tmp_path / "wf")
    proc = release.run(release.venv / "bin" / "multinode", "preview", "--rule", "train", cwd=wd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    script = proc.stdout
    assert script.startswith("#!/bin/bash\n"), script[:200]
    assert re.search(r"^#SBATCH --nodes=2$", script, re.M), script
    assert "multinode torchrun train.py --data data/train.txt --out model/final.pt" in script
    assert not (wd / "model").exists()  # a preview submits nothing


def test_the_two_node_workflow_runs_with_the_venvs_package(release, slurm_cluster, tmp_path):
    wd = workflow(tmp_path / "wf")
    proc = release.run(
        release.python, "-m", "snakemake", "--executor", "multinode", "--jobs", "1", "--latency-wait", "5",
        cwd=wd,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = torch.load(wd / "model" / "final.pt")
    assert (result["world"], result["sum"], result["data"]) == (4, 1.0 + 2 + 3 + 4, "some tokens\n")  # 2 nodes x 2
    # on the nodes: the worker ran the venv's interpreter, imported the venv's package, and found the venv's
    # `multinode` on the job's PATH
    assert Path(result["python"]) == release.python, result
    assert Path(result["package"]).is_relative_to(release.venv), result
    assert result["multinode"] == str(release.venv / "bin" / "multinode"), result
    # the job's log: the launcher's own lines from both nodes, and the end of the job
    logs = list((wd / ".snakemake" / "multinode" / "logs" / "rule_train").rglob("*.log"))
    assert len(logs) == 1, logs
    log = logs[0].read_text()
    assert "2 node(s) x 2 process(es)" in log, log
    launched = set(re.findall(r"\[(\S+)\] \[multinode torchrun\] launching on ([^\s,]+)", log))
    assert len(launched) == 2 and all(a == b for a, b in launched), log  # each of the job's two nodes, by itself
    assert "[multinode] exit 0" in log, log
    # the run's start record holds the package version the job read on the node (importlib metadata)
    runs = [json.loads(line) for f in logs[0].parent.glob("*.runs.jsonl") for line in f.read_text().splitlines()]
    starts = [r for r in runs if r["event"] == "start"]
    assert [s["versions"]["snakemake-executor-plugin-multinode"] for s in starts] == [the_version()], runs
