"""Shared fixtures: the real local SLURM cluster every integration test runs on."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from snakemake_executor_multinode.sandbox import cluster
from snakemake_executor_multinode.sandbox.spec import ClusterSpec
from tests.helpers import DEFAULT_SLURM, TEST_CLUSTER_DIR, TEST_NODES, TEST_SLURM, Cluster, cpu_saturated, node_index

# A suite started in the background (`cmd &`, nohup, some CI runners) inherits SIGINT ignored, and so would every
# Snakemake it starts: the Ctrl-C tests could not interrupt it. A handled SIGINT here resets to the default in the
# children at exec.
signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-load",
        action="store_true",
        help="run the suite with the CPU saturated (one busy loop per core plus one, for the whole session): "
        "a shared CI runner or login node. No verdict may depend on it.",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test under tests/cluster/ runs on the real local SLURM: marked `cluster` by its folder. On a release
    other than 22.05 the tests marked `one_release` (plugin logic that no SLURM release changes) are left out: CI
    runs both releases in under 40 minutes (docs/slurm-versions.md)."""
    for item in items:
        if CLUSTER_TESTS in item.path.parents:
            item.add_marker(pytest.mark.cluster)
    # The fast tier first: it fails in seconds, and its guard (tests/unit/conftest.py) then never watches the last
    # test's teardown, where pytest stops the session's fixtures of the other tiers (the cluster's `down`).
    items.sort(key=lambda item: UNIT_TESTS not in item.path.parents)
    if TEST_SLURM != DEFAULT_SLURM:
        left_out = [item for item in items if item.get_closest_marker("one_release")]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if not item.get_closest_marker("one_release")]


CLUSTER_TESTS = Path(__file__).resolve().parent / "cluster"
UNIT_TESTS = Path(__file__).resolve().parent / "unit"


@pytest.fixture(scope="session", autouse=True)
def cpu_load(request: pytest.FixtureRequest) -> Iterator[list[int]]:
    """The busy loops of --cpu-load (their pids), stopped by pid at the end of the session."""
    if not request.config.getoption("--cpu-load"):
        yield []
        return
    with cpu_saturated() as pids:
        yield pids


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Cluster]:
    """The suite's own cluster, in its own folder: its bridge, subnet, namespaces and ports derive from that folder,
    so it runs beside a user's sandbox (`multinode cluster up` in the default folder) without touching it. A test
    cluster that is already up (an earlier or parallel run) is reused and left up; one this session started is
    stopped at the end."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("the local SLURM cluster needs root and iproute2")
    # With preemption (`up --preemption`: a partition `urgent` whose jobs preempt the default one's): a tier nobody
    # else submits to changes nothing for the other tests; the preemption tests (test_preemption_cluster.py) set
    # the grace time and mode they need for their block (helpers.preemption).
    spec = ClusterSpec(dir=TEST_CLUSTER_DIR, slurm=TEST_SLURM, nodes=TEST_NODES, preemption=True)
    running = ClusterSpec.load(spec.dir)
    was_up = running is not None and running.same_shape(spec) and cluster.is_up(running)
    cluster.up(spec)
    handle = Cluster(spec)
    # Pytest and the executor's own sbatch calls need SLURM_CONF (and the release's commands first on PATH) in this
    # process too.
    os.environ.update({k: cluster.slurm_env(spec)[k] for k in ("SLURM_CONF", "PATH")})
    yield handle
    if not was_up:
        left = cluster.down(spec)
        assert not left, f"`multinode cluster down` left {left}"


@pytest.fixture
def restore_nodes(slurm_cluster: Cluster) -> Iterator[list[str]]:
    """The test puts the names of the nodes it kills here; each is brought back afterwards."""
    dead: list[str] = []
    yield dead
    for name in dead:
        cluster.restart_node(slurm_cluster.spec, node_index(slurm_cluster, name))
