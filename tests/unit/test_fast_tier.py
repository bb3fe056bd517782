"""The fast tier stays fast: no test in tests/unit starts a process or opens a socket (those are in tests/process/, in
the file of the same name; CONTRIBUTING.md, "Tests and checks"). Held by what the tests do, never by timing them:
tests/unit/conftest.py runs every unit test under an audit hook that stops such a start and fails the test
(tests/helpers.py: watch), and the unit test files are read for calls that no audit event shows (gloo's sockets
are opened in C++). The guard end to end, through pytest, with a test that swallows the error: tests/process/
test_fast_tier.py."""

from __future__ import annotations

import ast
import multiprocessing
import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import REPO, ProcessStarted, process_event, unwatched, watch, watched

UNIT = REPO / "tests" / "unit"


def test_this_test_runs_watched_and_a_start_in_it_is_stopped_and_recorded():
    seen = watched()
    assert seen == []  # the conftest's watch of this very test
    with pytest.raises(ProcessStarted, match="belongs in tests/process/"):
        subprocess.run(["true"])
    assert seen and seen[0].startswith("subprocess.Popen 'true' ['true']")
    seen.clear()  # else the conftest fails this test, as it would any other


def forked() -> None:
    if os.fork() == 0:  # were it not stopped: the child leaves at once
        os._exit(0)


def bound() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))


def connected() -> None:
    with socket.socket() as s:
        s.connect(("127.0.0.1", 9))


STARTS: dict[str, tuple[Callable[[], object], str]] = {
    "subprocess": (lambda: subprocess.run(["true"]), "subprocess.Popen"),
    "os.system": (lambda: os.system("true"), "os.system"),
    "os.posix_spawn": (lambda: os.posix_spawn("/bin/true", ["true"], {}), "os.posix_spawn"),
    "os.fork": (forked, "os.fork"),
    "multiprocessing (fork)": (lambda: multiprocessing.get_context("fork").Process(target=print).start(), "os.fork"),
    "multiprocessing (spawn)": (
        lambda: multiprocessing.get_context("spawn").Process(target=print).start(), "_posixsubprocess.fork_exec"
    ),
    "socket.bind": (bound, "socket.bind"),
    "socket.connect": (connected, "socket.connect"),
    "a DNS lookup": (lambda: socket.getaddrinfo("example.org", 80), "socket.getaddrinfo"),
}  # fmt: skip


@pytest.mark.parametrize("how", list(STARTS))
def test_each_kind_of_start_is_stopped_before_it_happens_and_named(how):
    start, event = STARTS[how]
    with watch() as seen, pytest.raises(ProcessStarted):
        start()
    assert seen[0].split()[0] == event, seen


def test_an_exec_would_be_stopped_too():
    """os.exec* replaces this process if not stopped: the hook is asked directly, with the event's own arguments."""
    with watch() as seen, pytest.raises(ProcessStarted):
        process_event("os.exec", ("/bin/true", ["true"], None))
    assert seen == ["os.exec '/bin/true' ['true'] None"]


def test_outside_every_watch_the_hook_lets_everything_through():
    with unwatched():
        assert watched() is None
        process_event("subprocess.Popen", ("true", ["true"], None, None))  # nothing raised, nothing recorded
    assert watched() == []  # this test's own watch again, and nothing in it


# --- the files: calls that start processes or open sockets, found by name (no audit event for C++'s own) -------
FORBIDDEN = {
    "subprocess": {"Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "os": {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp"}
    | {f"exec{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}
    | {f"spawn{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")},
    "pty": {"fork", "spawn"},
    "socket": {"socket", "create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo"},
    "multiprocessing": {"Process", "Pool", "get_context"},
    "concurrent.futures": {"ProcessPoolExecutor"},
    "asyncio": {"create_subprocess_exec", "create_subprocess_shell", "open_connection", "start_server"},
    "torch.distributed": {"init_process_group", "TCPStore"},
    "torch.multiprocessing": {"spawn", "start_processes", "Process"},
    "torch.distributed.run": {"main", "run"},
    "torch.distributed.launcher.api": {"elastic_launch", "launch_agent"},
}
# This file starts each kind on purpose, under a watch of its own, to show that the hook stops it.
GUARD_TESTS = {Path(__file__).resolve()}


def forbidden_calls(source: str) -> list[str]:
    """Calls in `source` of FORBIDDEN's functions, through any import alias, as 'line: module.name'."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # a name in the file -> the module or module.function it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif (  # run = pytest.importorskip("torch.distributed.run"), importlib.import_module(...)
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr in ("importorskip", "import_module")
            and node.value.args
            and isinstance(node.value.args[0], ast.Constant)
        ):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    aliases[target.id] = str(node.value.args[0].value)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (name := _dotted(node.func)):
            head, _, rest = name.partition(".")
            full = ".".join(filter(None, [aliases.get(head, head), rest]))
            module, _, function = full.rpartition(".")
            if function in FORBIDDEN.get(module, ()):
                found.append(f"{node.lineno}: {full}")
    return found


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := _dotted(node.value)):
        return f"{base}.{node.attr}"
    return None


def test_no_unit_test_file_calls_what_starts_a_process_or_opens_a_socket():
    found = [
        f"{path.relative_to(REPO)}:{call}"
        for path in sorted(UNIT.rglob("*.py"))
        if path.resolve() not in GUARD_TESTS
        for call in forbidden_calls(path.read_text())
    ]
    assert not found, "these belong in tests/process/, in the file of the same name:\n" + "\n".join(found)


def test_the_reading_finds_each_call_through_its_aliases_and_nothing_else():
    source = """
import os, subprocess as sp
import torch.distributed as dist
from socket import create_connection
from torch.multiprocessing import spawn as mp_spawn
import pytest
run = pytest.importorskip("torch.distributed.run")

sp.check_output(["git", "status"])
os.execvp("bash", ["bash"])
dist.init_process_group("gloo")
create_connection(("h", 1))
mp_spawn(print)
run.main(["x.py"])
subprocess.CompletedProcess([], 0)  # a stand-in's answer: no process
monkeypatch.setattr(subprocess, "run", fake)
parser = run.get_args_parser()
"""
    assert forbidden_calls(source) == [
        "9: subprocess.check_output",
        "10: os.execvp",
        "11: torch.distributed.init_process_group",
        "12: socket.create_connection",
        "13: torch.multiprocessing.spawn",
        "14: torch.distributed.run.main",
    ]
