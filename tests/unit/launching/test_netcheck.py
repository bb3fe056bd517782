"""The network preflight (netcheck.py): the profile key, the rendered line, the launcher's hook, the messages, and
(slow) real checks between processes on this machine's loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.launching import launcher, netcheck
from snakemake_executor_multinode.launching.launcher import Allocation
from snakemake_executor_multinode.planning import environment
from snakemake_executor_multinode.planning.environment import EnvProfileError, load_profiles, render_lines, resolve

ALLOC = Allocation(
    "4242", ("node110", "node111"), gpus_per_node=8, cpus_per_task=64, master_addr="10.0.0.110", master_port=24242
)
VAR = protocol.NETWORK_CHECK_VAR


def profile_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "profiles.yaml"
    path.write_text(f"profiles:\n  p:\n{body}")
    return path


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
def agent_line(monkeypatch, value: str | None) -> str:
    if value is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, value)
    argv = launcher.srun_command(ALLOC, [], ["train.py"], python="/py")
    return argv[argv.index("-c") + 1]


def test_with_the_variable_set_every_node_runs_the_check_before_torchrun(monkeypatch):
    line = agent_line(monkeypatch, "60")
    check, rest = line.split(" || exit $?; ", 1)
    port = int(check.split("--port=")[1].split()[0])
    assert check == (
        f'trap "" USR2; /py -m snakemake_executor_multinode.launching.netcheck --master-addr=10.0.0.110 --port={port} '
        "--nnodes=2 --nproc=8 --timeout=60 --nodes=node110,node111"
    )
    assert rest.startswith("exec ") and "torch.distributed.run" in rest
    assert port != ALLOC.master_port and port >= protocol.netcheck_port(ALLOC.master_port)


@pytest.mark.parametrize("value", [None, "", "0", "false"])
def test_without_the_variable_or_with_zero_no_check_runs(monkeypatch, value):
    assert "netcheck" not in agent_line(monkeypatch, value)


def test_a_bad_variable_stops_the_launcher_naming_it(monkeypatch):
    with pytest.raises(SystemExit, match=f"{VAR}='soon': must be the network check's limit in seconds"):
        agent_line(monkeypatch, "soon")


def test_in_a_container_the_check_is_skipped_and_says_so(capfd):
    assert netcheck.command(ALLOC, 8, "/py", contained=True, env={VAR: "60"}) == []
    assert "[multinode preflight] skipped" in capfd.readouterr().err


@pytest.mark.parametrize(("code", "ran"), [(0, True), (7, False)])
def test_torchrun_starts_only_when_the_check_passed(tmp_path, code, ran):
    check = tmp_path / "check"
    check.write_text(f"#!/bin/bash\necho CHECKED\nexit {code}\n")
    check.chmod(0o755)
    script = launcher.agent_script(["/bin/echo", "TORCHRUN"], [str(check)])
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert proc.returncode == code
    assert proc.stdout.split() == (["CHECKED", "TORCHRUN"] if ran else ["CHECKED"])


def test_the_preflight_port_is_its_own_and_differs_between_neighbouring_jobs():
    training = {protocol.master_port(job) for job in range(100, 110)}
    ports = {protocol.netcheck_port(p) for p in training}
    assert len(ports) == 10 and not ports & training
    assert all(
        protocol.NETCHECK_PORT_BASE <= p < protocol.NETCHECK_PORT_BASE + protocol.NETCHECK_PORT_SPAN for p in ports
    )
    assert protocol.netcheck_port(29500) < 65536 - 50  # a user's fixed port too, with room to move on


# --- the messages -------------------------------------------------------------------------------------------------
def test_the_failure_message_names_node_backend_interface_and_error_then_quotes_the_backends_lines():
    text = netcheck.failure_message(
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
    netcheck.log("a" * 5000 + "\nshort")
    err = capfd.readouterr().err.splitlines()
    assert [len(line) for line in err] == [netcheck.LINE_LIMIT, 5]


def test_nccl_lines_are_read_from_the_workers_debug_files(tmp_path):
    (tmp_path / "nccl.0.log").write_text("host:1:1 [0] NCCL INFO x\nunrelated\nhost:1:1 [0] NCCL WARN y\n")
    lines = netcheck.nccl_lines([tmp_path / "nccl.0.log", tmp_path / "absent.log"])
    assert lines == ["host:1:1 [0] NCCL INFO x", "host:1:1 [0] NCCL WARN y"]


def test_interfaces_and_routes_are_read_in_this_network_namespace():
    assert netcheck.iface_state("lo") == "up"
    assert netcheck.iface_state("mnpf-missing0") == "missing"
    route = netcheck.route_to("127.0.0.1", 9)
    assert (route.iface, route.src, route.error) == ("lo", "127.0.0.1", "")
    assert route.text() == "iface lo 127.0.0.1 -> MASTER_ADDR 127.0.0.1"
    env = {"GLOO_SOCKET_IFNAME": "lo,mnpf-missing0"}
    assert netcheck.interface_text("gloo", env, route).startswith(
        "GLOO_SOCKET_IFNAME=lo,mnpf-missing0 (lo up, mnpf-missing0 missing), iface lo"
    )
    assert netcheck.down_ifaces("gloo", env) == []  # missing: gloo says so itself, at once


# --- real checks on the loopback (slow: each node imports torch) ------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node(rank: int, port: int, nnodes: int, timeout: int = 60, **env: str) -> subprocess.Popen:
    args = ["--master-addr=127.0.0.1", f"--port={port}", f"--nnodes={nnodes}", "--nproc=2", f"--timeout={timeout}"]
    return subprocess.Popen(
        [sys.executable, "-m", netcheck.MODULE, *args, "--nodes=nodeA,nodeB"],
        env=os.environ | {"SLURM_NODEID": str(rank), "SLURMD_NODENAME": f"node{'AB'[rank]}", **env},
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_two_nodes_pass_and_each_says_so_in_one_line():
    port = free_port()
    procs = [node(0, port, 2), node(1, port, 2)]
    outs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for name, out in zip(("nodeA", "nodeB"), outs, strict=True):
        assert f"[multinode preflight] {name}: all-reduce over 4 ranks ok in " in out, out
        assert "(gloo, iface lo 127.0.0.1 -> MASTER_ADDR 127.0.0.1; " in out, out


@pytest.mark.slow
def test_a_node_told_to_use_a_missing_interface_fails_with_gloos_own_error_and_the_other_stops(tmp_path):
    port, failed = free_port(), tmp_path / "failed-node"
    head = node(0, port, 2, **{protocol.FAILED_NODE_FILE_VAR: str(failed)})
    bad = node(1, port, 2, GLOO_SOCKET_IFNAME="mnpf-missing0", **{protocol.FAILED_NODE_FILE_VAR: str(failed)})
    out = bad.communicate(timeout=120)[1]
    assert bad.returncode == netcheck.EXIT_FAILED
    assert (
        "[multinode preflight] FAILED on nodeB (node_rank 1): gloo, GLOO_SOCKET_IFNAME=mnpf-missing0 "
        "(mnpf-missing0 missing), iface lo 127.0.0.1 -> MASTER_ADDR 127.0.0.1: RuntimeError: " in out
    ), out
    assert "Unable to find address for: mnpf-missing0" in out
    assert failed.read_text() == "nodeB\n"
    # the head learns it from the store and waits for srun to stop it (here: this test)
    for line in iter(head.stderr.readline, ""):  # type: ignore[union-attr]
        if "stopping: nodeB failed the preflight" in line:
            break
    else:
        raise AssertionError("the head never said that nodeB failed")
    head.kill()
    head.wait()


@pytest.mark.slow
def test_the_head_names_the_node_that_never_came(tmp_path):
    failed = tmp_path / "failed-node"
    head = node(0, free_port(), 2, timeout=3, **{protocol.FAILED_NODE_FILE_VAR: str(failed)})
    out = head.communicate(timeout=120)[1]
    assert head.returncode == netcheck.EXIT_FAILED
    assert "nodeB (node_rank 1) never reached the preflight rendezvous at 127.0.0.1:" in out, out
    assert failed.read_text() == "nodeB\n"
