"""--retries after a node failure: the next attempt runs without the node the failed one named."""

from __future__ import annotations

import re

import pytest

from snakemake_executor_multinode.contract.jobfiles import StateFolders
from tests.helpers import snakemake

pytestmark = pytest.mark.cluster

# The second node of the first attempt turns bad (a broken GPU, say) and stays bad, wherever SLURM places the job.
BAD_NODE = """
import os, pathlib, socket, sys
bad = pathlib.Path("bad_node.txt")
if not bad.exists() and os.environ["GROUP_RANK"] == "1":
    bad.write_text(socket.gethostname())
if bad.exists() and bad.read_text() == socket.gethostname():
    sys.exit(3)
"""


def test_a_retry_excludes_the_node_the_failed_attempt_named(slurm_cluster, tmp_path):
    (tmp_path / "work.py").write_text(BAD_NODE)
    (tmp_path / "Snakefile").write_text(
        'rule train:\n    output: "out.txt"\n    resources: nodes=2, gpus=1, max_restarts=0\n'
        '    shell: "multinode torchrun work.py && hostname > {output}"\n'
    )
    proc = snakemake(tmp_path, "--retries", "1", jobs=1, timeout=600, check=False)
    out = proc.stdout + proc.stderr
    scripts = {
        int(re.search(r"attempt(\d)", p.name).group(1)): p
        for p in (StateFolders(tmp_path).logs / "rule_train").rglob("*.sh")
    }
    bad = (tmp_path / "bad_node.txt").read_text()
    assert f"failing node {bad}" in out
    assert "--exclude" not in scripts[1].read_text()
    assert f"#SBATCH --exclude={bad}" in scripts[2].read_text().splitlines()
    assert proc.returncode == 0, out[-3000:]
    second = slurm_cluster.run("sacct", "-X", "-n", "-P", "-j", scripts[2].name.split(".")[0], "-o", "NodeList")
    assert bad not in slurm_cluster.run("scontrol", "show", "hostnames", second.stdout.strip()).stdout.split()
