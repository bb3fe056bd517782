"""Rule resources -> JobRequest: every bad value is refused with rule, field, value and what is allowed; every key is
known, mapped or refused; durations and sizes mean what Snakemake makes of them; slurm_extra is read as sbatch
reads it.

Here the tests that start processes (the process tier); the others: tests/unit/planning/test_request.py."""

from __future__ import annotations

import os
import re
import shutil
import string
import subprocess

import pytest

from snakemake_executor_multinode.sandbox import releases
from snakemake_executor_multinode.slurm.sbatch_flags import (
    TABLES,
    parse_sbatch_flags,
)

# sbatch itself as the oracle: this machine's 22.05, and 24.11 from the sandbox's root file system (built if missing)


@pytest.fixture(scope="module", params=list(TABLES))
def sbatch(request, tmp_path_factory):
    release = request.param
    root = releases.release(release).rootfs
    if root is None:
        if shutil.which("sbatch") is None:
            pytest.skip("no sbatch here")
        prefix, conf = ["sbatch"], tmp_path_factory.mktemp("slurm") / "slurm.conf"
    else:
        if os.geteuid() != 0:
            pytest.skip(f"SLURM {release}'s sbatch runs in its root file system: chroot needs root")
        # Built here when missing (once, cached: the 24.11 cluster tier finds it), never left to whichever test
        # happened to bring a 24.11 cluster up first: on a clean machine none has, when the unit tests run.
        releases.ensure_rootfs(releases.release(release))
        (root / "tmp").mkdir(exist_ok=True)
        prefix, conf = ["/usr/sbin/chroot", str(root), "/usr/bin/sbatch"], root / "tmp" / "oracle-slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    env = os.environ | {"SLURM_CONF": "/tmp/oracle-slurm.conf" if root else str(conf)}

    def run(*args: str) -> str:
        proc = subprocess.run(
            [*prefix, *args], env=env, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        )
        return proc.stdout + proc.stderr

    version = run("--version")
    if release not in version:
        pytest.skip(f"this table is sbatch {release}'s; this is {version.strip()}")
    run.table = TABLES[release]  # type: ignore[attr-defined]
    return run


def test_the_option_table_is_sbatchs(sbatch):
    """Every long option getopt knows (it lists them when a prefix is ambiguous) and its argument kind."""
    table = sbatch.table
    names: set[str] = set()
    todo, seen = list(string.ascii_lowercase), set()
    while todo:
        prefix = todo.pop()
        if prefix in seen:
            continue
        seen.add(prefix)
        out = sbatch(f"--{prefix}")
        if "is ambiguous" in out:
            names.update(re.findall(r"'--([\w-]+)'", out.split("possibilities:", 1)[1].splitlines()[0]))
        elif m := re.search(r"option '--([\w-]+)' requires an argument", out):
            names.add(m.group(1))
        elif m := re.search(r"option '--([\w-]+)' doesn't allow an argument", sbatch(f"--{prefix}=x")):
            names.add(m.group(1))
        elif "unrecognized option" not in out:
            todo += [prefix + c for c in string.ascii_lowercase + "-"]
    assert names == set(table.long)
    for name, kind in table.long.items():
        if "requires an argument" in sbatch(f"--{name}"):
            assert kind == "required", name
        else:
            assert kind == ("none" if "doesn't allow an argument" in sbatch(f"--{name}=x") else "optional"), name
    for letter in string.ascii_letters + string.digits:
        out = sbatch(f"-{letter}")
        if "invalid option" in out:
            assert letter not in table.short
        else:
            assert letter in table.short, letter
            needs = "requires an argument" in out
            assert needs == (table.long[table.short[letter]] == "required"), letter


def test_prefixes_resolve_to_the_option_sbatch_picks(sbatch):
    """A required-argument option given without its argument makes sbatch name the option it resolved to."""
    table = sbatch.table
    for name, kind in table.long.items():
        if kind != "required":
            continue
        for end in range(len(name), 1, -1):
            prefix = name[:end]
            if prefix != name and prefix in table.long:  # --bb is itself an option, not a prefix of --bbf
                break
            out = sbatch(f"--{prefix}")
            if "is ambiguous" in out:
                break
            assert f"option '--{name}' requires an argument" in out, prefix
            assert parse_sbatch_flags(f"--{prefix}=1", table) == [(f"--{prefix}", name, "1")]


SYNTAX = [
    "--outp=x", "--cpus-per-tas=3", "-vN3", "--mem-per=1", "--ntasks-per=2", "--mail-t=END", "--exclusiv", "--nice",
    "--nice=5", "--xyz", "-N", "--parsable=x", "--gres", "-Hv", "-y", "--clust=x", "--cluster=x", "--mem=1",
    "--gpus-per=1", "-c4", "-c", "--mail-type END", "-L", "-Lx", "--hold=", "--exclusive=", "--e=1", "--ex=1",
    "--get=1", "-vvv", "-vQ", "-HJ", "--time-=1", "--no-k", "--no-r", "--no-", "--tmp=1", "--t=1", "--ti=1",
]  # fmt: skip


@pytest.mark.parametrize("flags", SYNTAX)
def test_slurm_extra_syntax_agrees_with_sbatch(sbatch, flags):
    out = sbatch(*flags.split())
    sbatch_refuses = any(
        s in out
        for s in ("unrecognized option", "is ambiguous", "requires an argument", "doesn't allow", "invalid option")
    )
    assert sbatch_refuses or "Batch script is empty" in out, out
    try:
        parse_sbatch_flags(flags)
        we_refuse = False
    except ValueError:
        we_refuse = True
    assert we_refuse == sbatch_refuses, out
