"""The sandbox's config files and argument checks (no cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from snakemake_executor_multinode.cli import main
from snakemake_executor_multinode.sandbox.spec import DEFAULT_DIR, ClusterError, ClusterSpec, render_configs
from tests.conftest import TEST_CLUSTER_DIR


def test_slurm_conf_describes_every_node_with_its_gpus_and_address():
    spec = ClusterSpec(dir=Path("/x"), nodes=2, gpus=4, cpus=8, slot=250 - 200)
    conf = render_configs(spec, first_job_id=57, ctl_host="ctl")["slurm.conf"]
    assert "FirstJobId=57" in conf
    assert "SlurmctldHost=ctl(172.31.50.1)" in conf and "SlurmctldPort=17507" in conf
    assert "NodeName=node2 NodeAddr=172.31.50.12 CPUs=8" in conf and "Gres=gpu:4" in conf
    assert "PartitionName=gpu Nodes=node[1-2] Default=YES" in conf
    assert "EnforcePartLimits=ALL" in conf and "batch_sched_delay=0" in conf


def test_gres_conf_points_at_fake_gpu_devices():
    gres = render_configs(ClusterSpec(dir=Path("/x"), gpus=8), 1, "c")["gres.conf"]
    assert "NodeName=node[1-3] Name=gpu File=/x/fakedev/nvidia[0-7]" in gres


def test_accounting_toggles_slurmdbd():
    on = render_configs(ClusterSpec(dir=Path("/x")), 1, "c")
    off = render_configs(ClusterSpec(dir=Path("/x"), accounting=False), 1, "c")
    assert "accounting_storage/slurmdbd" in on["slurm.conf"] and "slurmdbd.conf" in on
    assert "accounting_storage/none" in off["slurm.conf"] and "slurmdbd.conf" not in off
    # gres TRES without slurmdbd is fatal to slurmctld
    assert "AccountingStorageTRES" not in off["slurm.conf"]


def test_hosts_file_names_controller_and_nodes():
    hosts = render_configs(ClusterSpec(dir=Path("/x"), nodes=2, slot=77), 1, "ctl")["hosts"]
    assert hosts.splitlines() == [
        "127.0.0.1 localhost",
        "172.31.77.1 ctl slurmctl",
        "172.31.77.11 node1",
        "172.31.77.12 node2",
    ]


def test_the_network_identity_derives_from_the_folder_so_clusters_coexist(tmp_path):
    user, suite = ClusterSpec(dir=DEFAULT_DIR), ClusterSpec(dir=TEST_CLUSTER_DIR)
    assert user.slot != suite.slot
    names = lambda s: {s.subnet, s.bridge, s.netns(1), s.host_link(1), s.ctld_port, s.dbd_port, s.db_port}  # noqa: E731
    assert names(user).isdisjoint(names(suite))
    assert ClusterSpec(dir=DEFAULT_DIR).slot == user.slot  # stable
    assert all(len(s.host_link(64)) <= 15 and len(s.bridge) <= 15 for s in (user, suite))  # IFNAMSIZ
    # a running cluster keeps the identity it started with
    spec = ClusterSpec(dir=tmp_path, nodes=2, slot=42)
    spec.save()
    assert ClusterSpec.load(tmp_path) == spec


@pytest.mark.parametrize("field,value", [("nodes", 0), ("nodes", 100), ("gpus", -1), ("cpus", 0)])
def test_bad_sizes_are_rejected_naming_the_option(field, value):
    with pytest.raises(ClusterError, match=f"--{field}"):
        ClusterSpec(**{field: value})


def test_cli_reports_bad_option_without_starting_anything(capsys):
    assert main(["cluster", "up", "--nodes", "0", "--dir", "/nonexistent/x"]) == 1
    assert "--nodes must be an integer" in capsys.readouterr().err


def test_up_as_non_root_is_refused_clearly(monkeypatch):
    from snakemake_executor_multinode.sandbox import cluster

    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(ClusterError, match="needs root"):
        cluster.up(ClusterSpec(dir=Path("/nonexistent/x")))
