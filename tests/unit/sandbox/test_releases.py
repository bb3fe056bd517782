"""Which SLURM the sandbox runs: 22.05 from this machine's packages, 24.11 from a cached Debian 13 root file system
whose commands a wrapper runs with this machine's data folders in view."""

from __future__ import annotations

import os
import subprocess
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


def test_every_slurm_command_is_a_link_to_the_one_wrapper_which_names_the_root_file_system(tmp_path):
    root = tmp_path / "rootfs"
    releases.install_wrappers(tmp_path, "24.11", root)
    bin_dir = tmp_path / "bin"
    for name in (*releases.CLIENTS, *releases.DAEMONS):
        assert os.readlink(bin_dir / name) == releases.WRAPPER
    text = (bin_dir / releases.WRAPPER).read_text()
    assert f"root={root}\n" in text and f"/{releases.STAMP} ]" in text
    assert subprocess.run(["sh", "-n", str(bin_dir / releases.WRAPPER)]).returncode == 0  # valid shell
    releases.remove_wrappers(tmp_path)
    assert not bin_dir.exists()


def test_inside_the_root_file_system_the_wrapper_runs_the_command_itself(tmp_path):
    """A job (or a daemon's child) already runs inside: no second namespace, the release's own binary. Shown with a
    stand-in for the stamp's folder: the wrapper's first test, with `/` replaced by a folder of the test's."""
    releases.install_wrappers(tmp_path, "24.11", tmp_path / "rootfs")
    fake = tmp_path / "inside"
    (fake / "etc").mkdir(parents=True)
    (fake / releases.STAMP).write_text("{}")
    (fake / "usr" / "bin").mkdir(parents=True)
    (fake / "usr" / "bin" / "sinfo").write_text('#!/bin/sh\necho "the release\'s sinfo $*"\n')
    (fake / "usr" / "bin" / "sinfo").chmod(0o755)
    text = (tmp_path / "bin" / releases.WRAPPER).read_text()
    text = text.replace(f"[ -e /{releases.STAMP} ]", f"[ -e {fake}/{releases.STAMP} ]")
    text = text.replace('"/usr/sbin/$name"', f'"{fake}/usr/sbin/$name"').replace(
        '"/usr/bin/$name"', f'"{fake}/usr/bin/$name"'
    )
    probe = tmp_path / "probe" / "sinfo"
    probe.parent.mkdir()
    probe.write_text(text)
    probe.chmod(0o755)
    out = subprocess.run([str(probe), "-N"], capture_output=True, text=True, check=True).stdout
    assert out == "the release's sinfo -N\n"
