"""Which SLURM the sandbox runs: 22.05 from this machine's packages, 24.11 from a cached Debian 13 root file system
whose commands a wrapper runs with this machine's data folders in view.
The tests that start processes: tests/process/sandbox/test_releases.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.releases import DEFAULT
from snakemake_executor_multinode.sandbox import releases
from snakemake_executor_multinode.sandbox.cluster import env_lines, slurm_env
from snakemake_executor_multinode.sandbox.spec import ClusterError, ClusterSpec


def test_the_default_is_this_machines_slurm_and_an_unknown_release_is_refused_naming_the_known_ones():
    assert ClusterSpec(dir=Path("/x")).slurm == "22.05" == DEFAULT
    with pytest.raises(ClusterError, match=r"--slurm must be one of 22\.05, 24\.11, got '23\.02'"):
        ClusterSpec(dir=Path("/x"), slurm="23.02")


def test_a_cluster_folder_written_before_releases_existed_loads_as_22_05(tmp_path):
    ClusterSpec(dir=tmp_path).save()
    saved = (tmp_path / "cluster.json").read_text().replace('"slurm": "22.05",', "")
    (tmp_path / "cluster.json").write_text(saved)
    assert ClusterSpec.load(tmp_path).slurm == "22.05"


def test_24_11_puts_its_wrappers_first_on_path_and_22_05_leaves_path_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    old, new = ClusterSpec(dir=tmp_path / "a"), ClusterSpec(dir=tmp_path / "b", slurm="24.11")
    assert slurm_env(old)["PATH"] == "/usr/bin:/bin" and "PATH" not in env_lines(old)
    assert slurm_env(new)["PATH"] == f"{tmp_path / 'b' / 'bin'}:/usr/bin:/bin"
    assert f'export PATH="{tmp_path / "b" / "bin"}:$PATH"' in env_lines(new)
    # eval'd twice (a second `eval "$(multinode cluster env)"`): once on PATH
    assert releases.path_env(new.dir, new.slurm, slurm_env(new)["PATH"]).count(str(new.dir / "bin")) == 1
