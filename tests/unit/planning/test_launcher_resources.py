"""The launcher's resources (stall_timeout, on_stall, max_restarts, the straggler settings, spare_nodes,
own_launcher): read from the rule or its environment profile, refused naming rule, key and what is allowed, and
told to `multinode torchrun` as the job script's variables."""

from __future__ import annotations

import pytest

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.planning import launcher_resources
from snakemake_executor_multinode.planning.environment import PROFILE_KEYS
from snakemake_executor_multinode.planning.request import KNOWN_RESOURCES, RequestError, build_request
from snakemake_executor_multinode.planning.settings import PlanningSettings
from tests.helpers import refusal_of as refused
from tests.helpers import request_for as req


def straggler(r):
    return r.launcher.on_straggler, r.launcher.straggler_factor, r.launcher.straggler_window_s


def test_the_launchers_resources_are_known_and_its_profile_keys_are_a_profiles_keys():
    assert launcher_resources.NAMES <= KNOWN_RESOURCES
    assert set(launcher_resources.PROFILE_RESOURCES) <= launcher_resources.NAMES
    assert set(launcher_resources.PROFILE_RESOURCES) <= PROFILE_KEYS


def test_a_multinode_job_gets_the_adaptive_stall_timeout_and_a_plain_job_none():
    """Unset (rule and profile) is not a value: a multi-node job gets the adaptive timeout (`auto` in its script), a
    user's duration wins, and 'off' is off."""
    req = build_request("train", {"nodes": 2})
    assert req.launcher.stall_timeout_s is None
    assert req.launcher_variables()[protocol.STALL_TIMEOUT_VAR] == protocol.STALL_AUTO == "auto"
    assert build_request("prep", {}).launcher.stall_timeout_s == 0
    r = build_request("train", {"nodes": 2, "stall_timeout": "90s", "on_stall": "requeue"})
    assert (r.launcher.stall_timeout_s, r.launcher.on_stall) == (90, "requeue")
    assert build_request("train", {"nodes": 2, "stall_timeout": "off"}).launcher.stall_timeout_s == 0
    assert build_request("one", {}, profile={"stall_timeout": "20m"}).launcher.stall_timeout_s == 1200  # a profile key


@pytest.mark.parametrize(
    "resources, field",
    [
        ({"stall_timeout": "-5m"}, "stall_timeout"),
        ({"stall_timeout": 20}, "stall_timeout"),  # minutes or seconds? refused: write the unit
        ({"stall_timeout": "20"}, "stall_timeout"),
        ({"stall_timeout": "soon"}, "stall_timeout"),
        ({"on_stall": "retry"}, "on_stall"),
    ],
)
def test_a_bad_stall_setting_is_refused_naming_rule_key_and_what_is_allowed(resources, field):
    with pytest.raises(RequestError) as err:
        build_request("train", {"nodes": 2, **resources})
    assert err.value.field == field and "train" in str(err.value)
    assert ("'20m'" in str(err.value)) if field == "stall_timeout" else ("'fail' or 'requeue'" in str(err.value))


def test_in_job_restarts_default_to_three_and_come_from_the_rule_or_the_profile():
    req = build_request("train", {"nodes": 2})
    assert req.launcher.max_restarts == 3
    told = req.launcher_variables()
    assert (told[protocol.MAX_RESTARTS_VAR], told[protocol.CRASH_LOOP_RUNS_VAR]) == ("3", "3")
    assert build_request("train", {"nodes": 2, "max_restarts": 0}).launcher.max_restarts == 0
    assert build_request("train", {"nodes": 2, "max_restarts": "5"}).launcher.max_restarts == 5  # --set-resources: text
    assert build_request("train", {"nodes": 2}, profile={"max_restarts": 1}).launcher.max_restarts == 1
    assert (
        build_request("train", {"nodes": 2, "max_restarts": 2}, profile={"max_restarts": 1}).launcher.max_restarts == 2
    )
    crash = build_request("train", {"nodes": 2}, defaults=PlanningSettings(crash_loop_runs=5))
    assert crash.launcher_variables()[protocol.CRASH_LOOP_RUNS_VAR] == "5"  # the job script's own crash-loop bound


@pytest.mark.parametrize("value", [-1, "many", 1.5, True])
def test_a_bad_max_restarts_is_refused_naming_rule_key_and_what_is_allowed(value):
    with pytest.raises(RequestError) as err:
        build_request("train", {"nodes": 2, "max_restarts": value})
    assert str(err.value).startswith(
        f"rule 'train': resource max_restarts={value!r} is invalid: an integer >= 0: how many times `multinode "
        "torchrun` starts a crashed or stalled training again on the same nodes in one run of the job (0: never)"
    )
    with pytest.raises(RequestError) as err:
        build_request("train", {"nodes": 2}, profile={"max_restarts": "x"})
    assert err.value.field == "env_profile max_restarts"


def test_max_restarts_for_a_command_that_starts_its_own_ranks_is_said_to_have_no_effect():
    for kw in ({"site_launcher": True}, {}):
        resources = {"nodes": 2, "max_restarts": 5} | ({} if kw else {"own_launcher": True})
        req = build_request("train", resources, **kw)
        assert any("max_restarts has no effect" in w for w in req.warnings), req.warnings
    assert not [w for w in build_request("train", {"nodes": 2, "own_launcher": True}).warnings if "max_restarts" in w]


def test_the_straggler_settings_default_and_come_from_the_rule_or_the_profile():
    r = build_request("train", {"nodes": 2})
    assert straggler(r) == ("warn", 1.5, 120)
    r = build_request(
        "train", {"nodes": 2, "on_straggler": "replace", "straggler_factor": "2.5", "straggler_window": "30s"}
    )
    assert straggler(r) == ("replace", 2.5, 30)
    profile = {"on_straggler": "replace", "straggler_factor": 3, "straggler_window": "5m"}
    r = build_request("train", {"nodes": 2, "straggler_factor": 1.2}, profile=profile)  # the rule's own wins
    assert straggler(r) == (
        "replace",
        1.2,
        300,
    )
    told = {k: v for k, v in r.launcher_variables().items() if "STRAGGLER" in k}
    assert told == {
        "MULTINODE_ON_STRAGGLER": "replace",
        "MULTINODE_STRAGGLER_FACTOR": "1.2",
        "MULTINODE_STRAGGLER_WINDOW": "300",
    }


@pytest.mark.parametrize(
    "resources, field, allowed",
    [
        ({"on_straggler": "kill"}, "on_straggler", "'warn' (name the slow node in the log and status) or 'replace'"),
        ({"on_straggler": True}, "on_straggler", "'warn'"),
        ({"straggler_factor": 1}, "straggler_factor", "a number above 1"),
        ({"straggler_factor": "fast"}, "straggler_factor", "a number above 1"),
        ({"straggler_factor": "nan"}, "straggler_factor", "a number above 1"),
        ({"straggler_factor": True}, "straggler_factor", "a number above 1"),
        ({"straggler_window": 60}, "straggler_window", "a duration with its unit"),  # minutes or seconds?
        ({"straggler_window": "-1m"}, "straggler_window", "a duration with its unit"),
    ],
)
def test_a_bad_straggler_setting_is_refused_naming_rule_key_and_what_is_allowed(resources, field, allowed):
    with pytest.raises(RequestError) as err:
        build_request("train", {"nodes": 2, **resources})
    assert err.value.field == field and "rule 'train'" in str(err.value) and allowed in str(err.value), err.value


def test_a_bad_straggler_setting_in_the_profile_is_named_as_the_profiles():
    with pytest.raises(RequestError) as err:
        build_request("train", {"nodes": 2}, profile={"on_straggler": "evict"})
    assert err.value.field == "env_profile on_straggler" and "'evict'" in str(err.value)


# --- spare_nodes: nodes + k allocated, k kept to replace a failed node ----------------------------------------------


def test_spare_nodes_default_to_none_and_are_read_as_an_integer():
    assert req(nodes=2, gpus=1).spare_nodes == 0
    assert req(nodes=2, gpus=1, spare_nodes=1).spare_nodes == 1
    assert req(nodes=4, gpus=1, spare_nodes="2").spare_nodes == 2
    assert req(nodes=1, spare_nodes=0).spare_nodes == 0  # no spare: nothing to refuse on one node


def test_spares_add_to_the_allocation_and_tell_the_launcher_the_training_nodes():
    r = req(nodes=2, gpus=1, spare_nodes=1)
    assert r.nodes == 2 and r.allocated_nodes == 3
    assert r.launcher_variables()["MULTINODE_TRAIN_NODES"] == "2"
    assert "MULTINODE_TRAIN_NODES" not in req(nodes=2, gpus=1).launcher_variables()


@pytest.mark.parametrize("value", [-1, "-2", 1.5, "one", True])
def test_spare_nodes_that_are_not_a_non_negative_integer_are_refused(value):
    message = refused({"nodes": 2, "gpus": 1, "spare_nodes": value})
    assert "resource spare_nodes=" in message and "is invalid: a non-negative integer" in message


def test_spares_on_a_one_node_job_are_refused_saying_why():
    message = refused({"nodes": 1, "gpus": 1, "spare_nodes": 1})
    assert "rule 'train': resource spare_nodes=1 is invalid: needs nodes >= 2 (this rule has nodes=1)" in message
    assert "requeue or retry" in message


@pytest.mark.parametrize(
    ("resources", "named_first"),
    [
        ({"stall_timeout": "soon", "gpu_flag": "bad"}, "stall_timeout"),
        ({"max_restarts": -1, "slurm_account": "a;b"}, "max_restarts"),
        ({"on_stall": "retry", "slurm_extra": "--bogus"}, "slurm_extra"),
        ({"spare_nodes": -1, "master_port": 80}, "master_port"),
    ],
)
def test_a_rule_with_several_bad_values_hears_of_the_same_one_first_as_before_the_launchers_resources_moved(
    resources, named_first
):
    """own_launcher, stall_timeout and max_restarts are read before SLURM's resources, the others after them: the
    order a rule's refusals always came in."""
    with pytest.raises(RequestError) as err:
        build_request("train", {"nodes": 2, **resources})
    assert err.value.field == named_first
