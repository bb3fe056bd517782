"""Which SLURM the sandbox runs: 22.05 from this machine's packages, 24.11 from a cached Debian 13 root file system
whose commands a wrapper runs with this machine's data folders in view.

Here the tests that start processes (the process tier); the others: tests/unit/sandbox/test_releases.py."""

from __future__ import annotations

import os
import subprocess

from snakemake_executor_multinode.sandbox import releases


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
