"""Rule resources -> JobRequest: every bad value is refused with rule, field, value and what is allowed."""

from __future__ import annotations

import pytest

from snakemake_executor_multinode.request import Defaults, RequestError, build_request, parse_runtime


def req(**resources):
    return build_request("train", resources, known_profiles={"infiniband", "debug"})


def test_gpus_are_per_node_and_each_node_runs_one_task():
    r = req(nodes=2, gpus=8, cpus_per_task=64)
    assert (r.nodes, r.gpus, r.cpus_per_task, r.omp_threads) == (2, 8, 64, 8)


def test_official_slurm_plugin_resource_names_carry_over():
    r = req(
        slurm_partition="gpu_A6000",
        slurm_account="acct",
        runtime="14d",
        mem_mb=400000,
        constraint="a100&ib",
        qos="high",
        slurm_extra="--mail-type=END",
    )
    assert (r.partition, r.account, r.runtime_min, r.mem_mb) == ("gpu_A6000", "acct", 20160, 400000)
    assert (r.constraint, r.qos, r.slurm_extra) == ("a100&ib", "high", ("--mail-type=END",))


def test_plugin_defaults_fill_what_the_rule_leaves_out():
    r = build_request("x", {"gpus": 1}, defaults=Defaults(account="a", partition="p", signal="USR2@300"))
    assert (r.account, r.partition, r.signal) == ("a", "p", "USR2@300")
    assert build_request("x", {"gpus": 1, "signal": "none"}).signal is None


def test_the_pre_time_limit_signal_goes_to_training_jobs_only():
    assert build_request("x", {"nodes": 2}).signal == "USR2@120"
    assert build_request("x", {"gpus": 1}).signal == "USR2@120"
    assert build_request("x", {}).signal is None  # USR2 would only end a plain command early
    assert build_request("x", {"signal": "USR1@60"}).signal == "USR1@60"


@pytest.mark.parametrize(
    "value,minutes",
    [
        (90, 90),
        ("90", 90),
        ("2h", 120),
        ("1.5h", 90),
        ("1d", 1440),
        ("30m", 30),
        ("45s", 1),
        ("1-12:00:00", 2160),
        ("12:00:00", 720),
        ("10:30", 11),
        (0.5, 1),
    ],
)
def test_runtime_accepts_minutes_and_durations(value, minutes):
    assert parse_runtime(value) == minutes


BAD = [
    ({"nodes": 0}, "nodes", "a positive integer"),
    ({"nodes": "two"}, "nodes", "a positive integer"),
    ({"nodes": 1.5}, "nodes", "a positive integer"),
    ({"gpus": -1}, "gpus", "a non-negative integer"),
    ({"gpus": "4x"}, "gpus", "a non-negative integer"),
    ({"gpus": 8, "cpus_per_task": 4}, "cpus_per_task", "must be at least gpus=8"),
    ({"runtime": "soon"}, "runtime", "minutes (int) or a duration"),
    ({"runtime": -5}, "runtime", "minutes (int) or a duration"),
    ({"env_profile": "fast-ib"}, "env_profile", "unknown profile; defined: debug, infiniband"),
    ({"slurm_extra": "--nodes=4"}, "slurm_extra", "--nodes is managed by the plugin; set it with nodes"),
    ({"slurm_extra": "--gres=gpu:2"}, "slurm_extra", "set it with gpus"),
    ({"slurm_extra": "-t 10"}, "slurm_extra", "set it with runtime"),
    ({"slurm_extra": "-N2"}, "slurm_extra", "set it with nodes"),
    ({"slurm_extra": "--output 'x"}, "slurm_extra", "must be shell-style flags"),
    ({"signal": "USR2; rm -rf /"}, "signal", "SLURM's --signal form"),
    ({"slurm_partition": "gpu; reboot"}, "slurm_partition", "a SLURM name"),
    ({"nodelist": "node1 $(id)"}, "nodelist", "a host list"),
    ({"master_port": 80}, "master_port", "1024..65535"),
    ({"gpu_flag": "gpus"}, "gpu_flag", "'gres' or 'gpus-per-node'"),
]


@pytest.mark.parametrize("resources,field,allowed", BAD, ids=[f"{b[1]}={list(b[0].values())[-1]}" for b in BAD])
def test_bad_input_names_rule_field_value_and_what_is_allowed(resources, field, allowed):
    with pytest.raises(RequestError) as err:
        req(**resources)
    message = str(err.value)
    assert message.startswith(f"rule 'train': resource {field}=")
    assert allowed in message
    assert repr(resources[field]) in message


def test_a_capped_nodes_resource_is_reported():
    r = build_request("train", {"nodes": 1}, declared_nodes=4)
    assert "asks for nodes=4 but gets 1" in r.warnings[0] and "--resources nodes" in r.warnings[0]


def test_a_signal_lead_as_long_as_the_runtime_is_reported():
    r = build_request("train", {"gpus": 1, "runtime": 2})
    assert "arrives within 30 s of every start" in r.warnings[0]
    assert build_request("train", {"gpus": 1, "runtime": 10}).warnings == ()
