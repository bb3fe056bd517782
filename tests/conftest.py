"""Shared fixtures: the real local SLURM cluster every integration test runs on."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from snakemake_executor_multinode.sandbox import cluster
from snakemake_executor_multinode.sandbox.spec import ClusterSpec

REPO = Path(__file__).resolve().parents[1]
TEST_CLUSTER_DIR = Path(os.environ.get("MULTINODE_TEST_CLUSTER_DIR", "/var/tmp/multinode-test-cluster"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The teardown check must come after every test that uses the cluster.
    items.sort(key=lambda item: item.get_closest_marker("teardown_last") is not None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "teardown_last: runs after all other tests")


class Cluster:
    """A running sandbox cluster and the environment that points SLURM's commands at it."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.env = os.environ | {"SLURM_CONF": str(spec.slurm_conf)}
        self.torn_down = False

    def run(self, *cmd: str, timeout: float = 60, check: bool = True, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(cmd), capture_output=True, text=True, env=self.env, timeout=timeout, check=check, **kw
        )


@pytest.fixture(scope="session")
def slurm_cluster() -> Cluster:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("the local SLURM cluster needs root and iproute2")
    spec = ClusterSpec(dir=TEST_CLUSTER_DIR)
    running = ClusterSpec.load(cluster.DEFAULT_DIR) if TEST_CLUSTER_DIR != cluster.DEFAULT_DIR else None
    if running is not None and cluster.is_up(running):
        pytest.fail(f"a sandbox cluster is running from {running.dir}: `multinode cluster down` it first")
    cluster.up(spec)
    handle = Cluster(spec)
    # Pytest and the executor's own sbatch calls need SLURM_CONF in this process too.
    os.environ["SLURM_CONF"] = str(spec.slurm_conf)
    yield handle
    if not handle.torn_down:
        cluster.down(spec)
