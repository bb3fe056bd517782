"""The network preflight (network_check.py): the profile key, the rendered line, the launcher's hook, the messages, and
(slow) real checks between processes on this machine's loopback.

Here the tests that start processes (the process tier); the others: tests/unit/launching/test_network_check.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.launching import launcher, network_check
from tests.helpers import ALLOC, agent_line

VAR = protocol.NETWORK_CHECK_VAR


# --- the launcher's hook ------------------------------------------------------------------------------------------
def test_with_the_variable_set_every_node_runs_the_check_before_torchrun(monkeypatch):
    line = agent_line(monkeypatch, "60")
    check, rest = line.split(" || exit $?; ", 1)
    port = int(check.split("--port=")[1].split()[0])
    assert check == (
        'trap "" USR2; /py -m snakemake_executor_multinode.launching.network_check --master-addr=10.0.0.110 '
        f"--port={port} --nnodes=2 --nproc=8 --timeout=60 --nodes=node110,node111"
    )
    assert rest.startswith("exec ") and "torch.distributed.run" in rest
    assert port != ALLOC.master_port and port >= protocol.network_check_port(ALLOC.master_port)


@pytest.mark.parametrize(("code", "ran"), [(0, True), (7, False)])
def test_torchrun_starts_only_when_the_check_passed(tmp_path, code, ran):
    check = tmp_path / "check"
    check.write_text(f"#!/bin/bash\necho CHECKED\nexit {code}\n")
    check.chmod(0o755)
    script = launcher.agent_script(["/bin/echo", "TORCHRUN"], [str(check)])
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert proc.returncode == code
    assert proc.stdout.split() == (["CHECKED", "TORCHRUN"] if ran else ["CHECKED"])


# --- the messages -------------------------------------------------------------------------------------------------
def test_interfaces_and_routes_are_read_in_this_network_namespace():
    assert network_check.iface_state("lo") == "up"
    assert network_check.iface_state("mnpf-missing0") == "missing"
    route = network_check.route_to("127.0.0.1", 9)
    assert (route.iface, route.src, route.error) == ("lo", "127.0.0.1", "")
    assert route.text() == "iface lo 127.0.0.1 -> MASTER_ADDR 127.0.0.1"
    env = {"GLOO_SOCKET_IFNAME": "lo,mnpf-missing0"}
    assert network_check.interface_text("gloo", env, route).startswith(
        "GLOO_SOCKET_IFNAME=lo,mnpf-missing0 (lo up, mnpf-missing0 missing), iface lo"
    )
    assert network_check.down_ifaces("gloo", env) == []  # missing: gloo says so itself, at once


# --- real checks on the loopback (slow: each node imports torch) ------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node(rank: int, port: int, nnodes: int, timeout: int = 60, **env: str) -> subprocess.Popen:
    args = ["--master-addr=127.0.0.1", f"--port={port}", f"--nnodes={nnodes}", "--nproc=2", f"--timeout={timeout}"]
    return subprocess.Popen(
        [sys.executable, "-m", network_check.MODULE, *args, "--nodes=nodeA,nodeB"],
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
    assert bad.returncode == network_check.EXIT_FAILED
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
    assert head.returncode == network_check.EXIT_FAILED
    assert "nodeB (node_rank 1) never reached the preflight rendezvous at 127.0.0.1:" in out, out
    assert failed.read_text() == "nodeB\n"
