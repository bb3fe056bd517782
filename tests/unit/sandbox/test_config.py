"""The sandbox's config files and argument checks (no cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from snakemake_executor_multinode.cli import main
from snakemake_executor_multinode.sandbox import cgroups
from snakemake_executor_multinode.sandbox.cluster import use_command
from snakemake_executor_multinode.sandbox.spec import DEFAULT_DIR, ClusterError, ClusterSpec, render_configs
from tests.helpers import TEST_CLUSTER_DIR


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
        "::ffff:172.31.77.11 node1-v4mapped",
        "::ffff:172.31.77.12 node2-v4mapped",
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


def test_processes_are_tracked_with_cgroups_and_linuxproc_is_only_the_fallback():
    spec = ClusterSpec(dir=Path("/x"))
    on = render_configs(spec, 1, "c")
    assert "ProctrackType=proctrack/cgroup" in on["slurm.conf"] and "TaskPlugin=task/cgroup" in on["slurm.conf"]
    conf = on["cgroup.conf"].splitlines()
    # each slurmd's mount is made by the sandbox, in the node's namespaces: SLURM mounts nothing (the default; 24.11
    # calls the option defunct, an error line in every step's log)
    assert not any(line.startswith("CgroupAutomount") for line in conf)
    assert {"ConstrainCores=no", "ConstrainRAMSpace=no", "ConstrainDevices=no"} <= set(conf)  # fictitious resources
    off = render_configs(spec, 1, "c", cgroups=False)
    assert "ProctrackType=proctrack/linuxproc" in off["slurm.conf"] and "TaskPlugin=task/none" in off["slurm.conf"]
    assert "cgroup.conf" not in off


def test_cgroup_tracking_needs_a_cgroup_v1_freezer_and_says_why_not():
    v1 = "cgroup /sys/fs/cgroup/freezer cgroup rw,relatime,freezer 0 0\n"
    assert cgroups.unavailable_reason(v1) is None
    reason = cgroups.unavailable_reason("cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n")
    assert reason == "no cgroup v1 freezer hierarchy is mounted at /sys/fs/cgroup/freezer (this host has cgroup2)"
    # a freezer mounted elsewhere, or another controller at that place, is not what SLURM looks for
    assert cgroups.unavailable_reason("cgroup /sys/fs/cgroup/freezer cgroup rw,cpu 0 0\n") is not None


def test_each_node_starts_in_its_own_slot_named_cgroup_and_mounts_the_tree_rooted_there():
    user, suite = ClusterSpec(dir=DEFAULT_DIR), ClusterSpec(dir=TEST_CLUSTER_DIR)
    dirs = {cgroups.node_dir(s, i, "freezer") for s in (user, suite) for i in (1, 2, 3)}
    assert len(dirs) == 6  # no two nodes of two clusters share a cgroup
    assert cgroups.node_dir(user, 2, "freezer") == Path(f"/sys/fs/cgroup/freezer/mn{user.slot}-node2")
    prefix = cgroups.join_and_exec(user, 2)
    assert prefix[:2] == ["sh", "-c"] and prefix[-1] == "sh"
    assert f"echo $$ > /sys/fs/cgroup/freezer/mn{user.slot}-node2/cgroup.procs" in prefix[2]
    assert prefix[2].endswith('exec "$@"')
    mount = cgroups.remount_inside()
    assert mount == "umount /sys/fs/cgroup/freezer && mount -t cgroup -o freezer cgroup /sys/fs/cgroup/freezer"


def test_process_tracking_is_cgroup_unless_linuxproc_is_asked_for():
    assert ClusterSpec(dir=Path("/x")).proctrack == "cgroup"
    assert ClusterSpec(dir=Path("/x"), proctrack="linuxproc").proctrack == "linuxproc"
    with pytest.raises(ClusterError, match="proctrack must be 'cgroup' or 'linuxproc', got 'pgid'"):
        ClusterSpec(dir=Path("/x"), proctrack="pgid")


def test_the_ready_line_names_a_cluster_outside_the_default_folder_so_env_cannot_point_at_another_one():
    assert use_command(ClusterSpec(dir=DEFAULT_DIR)) == 'eval "$(multinode cluster env)"'
    assert use_command(ClusterSpec(dir=Path("/var/tmp/my lab"))) == (
        "eval \"$(multinode cluster env --dir '/var/tmp/my lab')\""
    )


def test_without_preemption_the_cluster_has_one_partition_and_no_preemption():
    conf = render_configs(ClusterSpec(dir=Path("/x"), nodes=2), 1, "c")["slurm.conf"]
    assert [line for line in conf.splitlines() if line.startswith("PartitionName=")] == [
        "PartitionName=gpu Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP"
    ]
    assert "Preempt" not in conf and "GraceTime" not in conf


def test_preemption_adds_the_partition_urgent_over_the_same_nodes_that_preempts_the_default_one():
    """The exact names checks outside the team read: partition urgent, a higher PriorityTier, preempt/partition_prio,
    PreemptMode=REQUEUE, the default partition's GraceTime (60 s unless given)."""
    conf = render_configs(ClusterSpec(dir=Path("/x"), nodes=2, preemption=True), 1, "c")["slurm.conf"]
    lines = conf.splitlines()
    assert "PreemptType=preempt/partition_prio" in lines and "PreemptMode=REQUEUE" in lines
    assert (
        "PartitionName=gpu Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=60" in lines
    )
    assert "PartitionName=urgent Nodes=node[1-2] MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF" in lines
    other = render_configs(ClusterSpec(dir=Path("/x"), preemption=True, grace_time=300, preempt_mode="cancel"), 1, "c")
    assert "PreemptMode=CANCEL" in other["slurm.conf"].splitlines() and "GraceTime=300" in other["slurm.conf"]


@pytest.mark.parametrize("value", ["-5", "1.5", "soon", "", "60s"])
def test_a_grace_time_that_is_no_whole_number_of_seconds_is_refused_before_anything_starts(capsys, value):
    assert main(["cluster", "up", "--preemption", "--grace-time", value, "--dir", "/nonexistent/x"]) == 1
    assert f"--grace-time must be a whole number of seconds, 0 or more, got {value!r}" in capsys.readouterr().err
    with pytest.raises(ClusterError, match="--grace-time must be a whole number"):
        ClusterSpec(preemption=True, grace_time=-1)


@pytest.mark.parametrize("flags", [["--grace-time", "30"], ["--preempt-mode", "cancel"]])
def test_how_the_cluster_preempts_needs_preemption(capsys, flags):
    assert main(["cluster", "up", *flags, "--dir", "/nonexistent/x"]) == 1
    assert f"{flags[0]} sets how the cluster preempts: it needs --preemption" in capsys.readouterr().err


def test_a_running_cluster_with_other_preemption_settings_is_another_shape(tmp_path):
    spec = ClusterSpec(dir=tmp_path, preemption=True)
    spec.save()
    loaded = ClusterSpec.load(tmp_path)
    assert loaded == spec and loaded is not None and loaded.same_shape(spec)
    assert not spec.same_shape(ClusterSpec(dir=tmp_path)) and not spec.same_shape(
        ClusterSpec(dir=tmp_path, preemption=True, grace_time=5)
    )
