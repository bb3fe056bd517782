"""The network preflight (network_check.py): the profile key, the rendered line, the launcher's hook, the messages, and
(slow) real checks between processes on this machine's loopback.
The tests that start processes: tests/process/launching/test_network_check.py."""

from __future__ import annotations

import pytest

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.launching import network_check
from snakemake_executor_multinode.planning import environment
from snakemake_executor_multinode.planning.environment import EnvProfileError, load_profiles, render_lines, resolve
from tests.helpers import ALLOC, agent_line, profile_file

VAR = protocol.NETWORK_CHECK_VAR


# --- the profile key ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "rendered"),
    [("true", "60"), ("false", "0"), ("{timeout: 30}", "30"), ("{}", "60"), ("{timeout: 3600}", "3600")],
)
def test_network_check_renders_one_exported_variable(tmp_path, value, rendered):
    profiles = load_profiles(profile_file(tmp_path, f"    network_check: {value}\n"))
    lines = render_lines(resolve(profiles, "p"))
    assert [line for line in lines if VAR in line] == [f"export {VAR}={rendered}"]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("yes please", "profiles.p.network_check: 'yes please' is not valid"),
        ("1", "profiles.p.network_check: 1 is not valid"),
        ("", "profiles.p.network_check: None is not valid"),
        ("{timeout: 0}", "profiles.p.network_check.timeout: 0 is not valid"),
        ("{timeout: 3601}", "profiles.p.network_check.timeout: 3601 is not valid"),
        ("{timeout: '60'}", "profiles.p.network_check.timeout: '60' is not valid"),
        ("{timeout: 1.5}", "profiles.p.network_check.timeout: 1.5 is not valid"),
        ("{timeout: true}", "profiles.p.network_check.timeout: True is not valid"),
        ("{tiemout: 5}", "profiles.p.network_check: unknown key(s) ['tiemout']"),
    ],
)
def test_a_bad_network_check_is_refused_naming_the_field_and_what_is_allowed(tmp_path, value, error):
    with pytest.raises(EnvProfileError) as err:
        load_profiles(profile_file(tmp_path, f"    network_check: {value}\n"))
    assert error in str(err.value)
    assert "allowed: true, false or {timeout: SECONDS}" in str(err.value)


def test_the_check_is_on_in_the_builtin_infiniband_profile_only():
    builtin = load_profiles()
    assert f"export {VAR}=60" in render_lines(resolve(builtin, "infiniband"))
    for other in ("ethernet", "debug"):
        assert not any(VAR in line for line in render_lines(resolve(builtin, other)))


def test_a_later_profile_turns_the_check_off_or_changes_its_limit(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(
        "profiles:\n  quiet:\n    network_check: false\n  short:\n    extends: infiniband\n"
        "    network_check: {timeout: 20}\n"
    )
    profiles = load_profiles(path)
    assert f"export {VAR}=0" in render_lines(resolve(profiles, "infiniband,quiet"))
    assert f"export {VAR}=20" in render_lines(resolve(profiles, "short"))
    assert environment.network_check_seconds(True) == protocol.NETWORK_CHECK_DEFAULT_S


# --- the launcher's hook ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [None, "", "0", "false"])
def test_without_the_variable_or_with_zero_no_check_runs(monkeypatch, value):
    assert "network_check" not in agent_line(monkeypatch, value)


def test_a_bad_variable_stops_the_launcher_naming_it(monkeypatch):
    with pytest.raises(SystemExit, match=f"{VAR}='soon': must be the network check's limit in seconds"):
        agent_line(monkeypatch, "soon")


def test_in_a_container_the_check_is_skipped_and_says_so(capfd):
    assert network_check.command(ALLOC, 8, "/py", contained=True, env={VAR: "60"}) == []
    assert "[multinode preflight] skipped" in capfd.readouterr().err


def test_the_preflight_port_is_its_own_and_differs_between_neighbouring_jobs():
    training = {protocol.master_port(job) for job in range(100, 110)}
    ports = {protocol.network_check_port(p) for p in training}
    assert len(ports) == 10 and not ports & training
    assert all(
        protocol.NETCHECK_PORT_BASE <= p < protocol.NETCHECK_PORT_BASE + protocol.NETCHECK_PORT_SPAN for p in ports
    )
    assert protocol.network_check_port(29500) < 65536 - 50  # a user's fixed port too, with room to move on


# --- the messages -------------------------------------------------------------------------------------------------
def test_the_failure_message_names_node_backend_interface_and_error_then_quotes_the_backends_lines():
    text = network_check.failure_message(
        "node2",
        1,
        "nccl",
        "NCCL_SOCKET_IFNAME=ib9, iface eth0 10.0.0.2 -> MASTER_ADDR 10.0.0.1",
        "torch.distributed.DistBackendError: NCCL error in: init.cpp:1\nncclInternalError: no interface",
        [
            "node2:1:1 [0] NCCL INFO Bootstrap: using ib9",
            "node2:1:1 [0] NCCL WARN Bootstrap : no socket interface found",
        ],
    )
    lines = text.splitlines()
    assert lines[0] == (
        "[multinode preflight] FAILED on node2 (node_rank 1): nccl, NCCL_SOCKET_IFNAME=ib9, iface eth0 10.0.0.2 -> "
        "MASTER_ADDR 10.0.0.1: torch.distributed.DistBackendError: NCCL error in: init.cpp:1"
    )
    assert lines[1] == "[multinode preflight]   ncclInternalError: no interface"
    assert "[multinode preflight]   nccl's own lines:" in lines
    assert lines[-2] == "[multinode preflight]   node2:1:1 [0] NCCL WARN Bootstrap : no socket interface found"
    assert lines[-1].startswith("[multinode preflight] the training was not started on node2")


def test_each_logged_line_is_one_write_short_enough_for_srun(capfd):
    network_check.log("a" * 5000 + "\nshort")
    err = capfd.readouterr().err.splitlines()
    assert [len(line) for line in err] == [network_check.LINE_LIMIT, 5]


def test_nccl_lines_are_read_from_the_workers_debug_files(tmp_path):
    (tmp_path / "nccl.0.log").write_text("host:1:1 [0] NCCL INFO x\nunrelated\nhost:1:1 [0] NCCL WARN y\n")
    lines = network_check.nccl_lines([tmp_path / "nccl.0.log", tmp_path / "absent.log"])
    assert lines == ["host:1:1 [0] NCCL INFO x", "host:1:1 [0] NCCL WARN y"]
