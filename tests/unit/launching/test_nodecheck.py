"""The node check (nodecheck.py): the profile key and its exports, one node's check with a fake nvidia-smi and a site
command, the launcher's step and verdicts, and the launcher dropping a failing node before the training starts there
(the real run: tests/cluster/test_node_check_cluster.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.launching import launcher, nodecheck, spares
from snakemake_executor_multinode.launching.launcher import Allocation, StepEnd
from snakemake_executor_multinode.planning.environment import EnvProfileError, load_profiles, render_lines, resolve
from snakemake_executor_multinode.watching import status_view
from tests.helpers import REPO

ALLOC = Allocation("77", ("node1", "node2", "node3"), gpus_per_node=2, cpus_per_task=2, master_addr="10.0.0.1",
                   master_port=20308)  # fmt: skip
COMMAND = protocol.NODE_CHECK_COMMAND_VAR


def profile_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "profiles.yaml"
    path.write_text(f"profiles:\n  p:\n{body}")
    return path


def exports(tmp_path: Path, value: str) -> list[str]:
    profiles = load_profiles(profile_file(tmp_path, f"    node_check: {value}\n"))
    return [line for line in render_lines(resolve(profiles, "p")) if "MULTINODE_NODE_CHECK" in line]


# --- the profile key ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "on", "command", "timeout"),
    [
        ("true", "1", "''", "120"),
        ("false", "0", "''", "120"),
        ("{}", "1", "''", "120"),
        ("{timeout: 30}", "1", "''", "30"),
        ("{command: 'dcgmi diag -r 1', timeout: 600}", "1", "'dcgmi diag -r 1'", "600"),
        ("{command: \"! dmesg | grep -q 'Xid'\"}", "1", "'! dmesg | grep -q '\"'\"'Xid'\"'\"''", "120"),
    ],
)
def test_node_check_renders_its_three_exported_variables(tmp_path, value, on, command, timeout):
    assert exports(tmp_path, value) == [
        f"export {protocol.NODE_CHECK_VAR}={on}",
        f"export {COMMAND}={command}",
        f"export {protocol.NODE_CHECK_TIMEOUT_VAR}={timeout}",
    ]


def test_the_exported_command_reads_back_as_written_and_runs_nothing(tmp_path):
    written = "touch pwned; test \"$(hostname)\" != node2 && echo '`x`'"
    (line,) = [x for x in exports(tmp_path, json.dumps({"command": written})) if COMMAND in x]
    script = f'{line}\nprintf %s "${COMMAND}"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout == written and not (tmp_path / "pwned").exists()


def test_without_the_key_nothing_is_exported_and_the_launcher_checks_by_default(tmp_path):
    assert exports(tmp_path, "true") and not [
        line for line in render_lines(resolve(load_profiles(), "ethernet")) if "NODE_CHECK" in line
    ]
    assert nodecheck.settings({}) == nodecheck.Settings(on=True, command="", timeout=120)
    assert not nodecheck.settings({protocol.NODE_CHECK_VAR: "0"}).on


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("yes please", "profiles.p.node_check: 'yes please' is not valid"),
        ("1", "profiles.p.node_check: 1 is not valid"),
        ("", "profiles.p.node_check: None is not valid"),
        ("{timeout: 0}", "profiles.p.node_check.timeout: 0 is not valid"),
        ("{timeout: 3601}", "profiles.p.node_check.timeout: 3601 is not valid"),
        ("{timeout: '60'}", "profiles.p.node_check.timeout: '60' is not valid"),
        ("{timeout: true}", "profiles.p.node_check.timeout: True is not valid"),
        ("{command: ''}", "profiles.p.node_check.command: '' is not valid: must be a non-empty string"),
        ("{command: [dcgmi, diag]}", "profiles.p.node_check.command: ['dcgmi', 'diag'] is not valid"),
        ("{comand: true}", "profiles.p.node_check: unknown key(s) ['comand']"),
    ],
)
def test_a_bad_node_check_is_refused_naming_the_field_and_what_is_allowed(tmp_path, value, error):
    with pytest.raises(EnvProfileError) as err:
        load_profiles(profile_file(tmp_path, f"    node_check: {value}\n"))
    assert error in str(err.value)
    assert "allowed: true, false or {command: SHELL_COMMAND, timeout: SECONDS}" in str(err.value)


def test_a_bad_timeout_in_the_environment_stops_the_launcher_naming_the_variable():
    with pytest.raises(SystemExit, match=f"{protocol.NODE_CHECK_TIMEOUT_VAR}='soon'"):
        nodecheck.settings({protocol.NODE_CHECK_TIMEOUT_VAR: "soon"})


# --- one node's check -----------------------------------------------------------------------------------------------
def fake_nvidia_smi(tmp_path: Path, gpus: int, code: int = 0) -> dict[str, str]:
    """A PATH whose nvidia-smi lists `gpus` GPUs (and exits with `code`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    lines = "".join(f"echo 'GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:04d})'\n" for i in range(gpus))
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/bash\n[ "$1" = -L ] || exit 9\n{lines}exit {code}\n')
    smi.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def run_node(tmp_path: Path, env: dict[str, str], gpus: int = 0) -> subprocess.CompletedProcess:
    """The node's side as the check step runs it: its own process, its lines on stdout."""
    return subprocess.run(
        [sys.executable, "-m", nodecheck.MODULE, f"--gpus={gpus}"],
        env=os.environ | {"PYTHONPATH": str(REPO), "SLURMD_NODENAME": "node2"} | env,
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip


def test_a_node_whose_nvidia_smi_lists_fewer_gpus_than_granted_fails_naming_both_counts(tmp_path):
    out = run_node(tmp_path, fake_nvidia_smi(tmp_path, 3) | {"SLURM_GPUS_ON_NODE": "4"})
    assert out.returncode == 1, out
    assert out.stdout.splitlines()[-1] == (
        f"{nodecheck.PREFIX} node2 FAILED: nvidia-smi -L lists 3 GPU(s), SLURM granted 4 on this node"
    )


def test_a_node_with_all_its_gpus_visible_passes_with_one_ok_line(tmp_path):
    out = run_node(tmp_path, fake_nvidia_smi(tmp_path, 8) | {"SLURM_GPUS_ON_NODE": "4"})
    assert out.returncode == 0, out
    (line,) = out.stdout.splitlines()
    assert nodecheck.OK.match(line) and line.endswith(", 8 GPU(s) visible)"), line


def test_the_granted_count_falls_back_to_cuda_visible_devices_then_the_allocation():
    assert nodecheck.granted_gpus({"SLURM_GPUS_ON_NODE": "2", "CUDA_VISIBLE_DEVICES": "0,1,2"}, 8) == 2
    assert nodecheck.granted_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2"}, 8) == 3
    assert nodecheck.granted_gpus({}, 8) == 8


def test_a_failing_nvidia_smi_fails_the_node_with_its_own_words(tmp_path):
    env = fake_nvidia_smi(tmp_path, 0, code=9)
    smi = Path(env["PATH"].split(":")[0]) / "nvidia-smi"
    error = "Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error"
    smi.write_text(f"#!/bin/bash\necho '{error}'\nexit 15\n")
    out = run_node(tmp_path, env | {"SLURM_GPUS_ON_NODE": "1"})
    assert out.returncode == 1
    assert "node2 FAILED: nvidia-smi -L failed (exit 15): Unable to determine the device handle" in out.stdout


def test_without_nvidia_smi_or_granted_gpus_the_gpus_are_not_counted(tmp_path):
    none = {"PATH": "/usr/bin:/bin"}
    assert nodecheck.check(none | {"SLURM_GPUS_ON_NODE": "2"}, 2, which=lambda name: None) == nodecheck.Outcome()
    assert run_node(tmp_path, fake_nvidia_smi(tmp_path, 0) | {"SLURM_GPUS_ON_NODE": "0"}).returncode == 0


def test_the_sites_command_runs_after_the_gpus_and_its_output_is_kept_prefixed(tmp_path):
    env = fake_nvidia_smi(tmp_path, 2) | {"SLURM_GPUS_ON_NODE": "2", COMMAND: "echo Xid 79 on GPU 1 >&2; exit 3"}
    out = run_node(tmp_path, env)
    assert out.returncode == 1
    assert out.stdout.splitlines() == [
        f"{nodecheck.PREFIX} node2| Xid 79 on GPU 1",
        f"{nodecheck.PREFIX} node2 FAILED: its command exited with 3",
    ]
    passed = run_node(tmp_path, {COMMAND: "echo fine"})
    assert passed.returncode == 0 and passed.stdout.splitlines()[0] == f"{nodecheck.PREFIX} node2| fine"


def test_a_command_past_the_limit_is_killed_with_its_children_and_fails_the_node(tmp_path):
    # the child holds the output pipe: only the whole process group's end lets the check end at its limit
    env = {COMMAND: "sleep 300 & sleep 300", protocol.NODE_CHECK_TIMEOUT_VAR: "1"}
    out = run_node(tmp_path, env)
    assert out.returncode == 1
    assert out.stdout.splitlines()[-1] == f"{nodecheck.PREFIX} node2 FAILED: its command did not end within 1 s"


def test_a_long_output_keeps_its_last_lines():
    lines = nodecheck.report("n1", nodecheck.Outcome("", tuple(str(i) for i in range(250))), 1.0)
    assert lines[0] == f"{nodecheck.PREFIX} n1| (50 earlier line(s) left out)" and lines[1].endswith("| 50")
    assert len(lines) == nodecheck.OUTPUT_LINES + 2


# --- the launcher's step --------------------------------------------------------------------------------------------
def test_the_step_checks_every_given_node_once_without_killing_the_others_on_a_failure():
    argv = nodecheck.srun_command(["node1", "node3"], 4, python="/py")
    assert argv[0] == "srun" and argv[-4:] == ["/py", "-m", nodecheck.MODULE, "--gpus=4"]
    for flag in ("--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=node1,node3", "--overlap",
                 "--kill-on-bad-exit=0", "--export=ALL", f"--job-name={nodecheck.STEP_NAME}"):  # fmt: skip
        assert flag in argv


def test_the_step_runs_only_when_it_has_something_to_check():
    on, command = nodecheck.Settings(), nodecheck.Settings(command="true")
    assert not nodecheck.wanted(on, 8, which=lambda name: None)  # no nvidia-smi, no command: nothing to check
    assert nodecheck.wanted(on, 8, which=lambda name: "/usr/bin/nvidia-smi")
    assert not nodecheck.wanted(on, 0, which=lambda name: "/usr/bin/nvidia-smi")  # no GPUs to count
    assert nodecheck.wanted(command, 0, which=lambda name: None)
    assert not nodecheck.wanted(nodecheck.Settings(on=False, command="true"), 8, which=lambda name: "/x")


def fake_srun(tmp_path: Path, body: str) -> list[str]:
    srun = tmp_path / "srun"
    srun.write_text(f"#!/bin/bash\n{body}\n")
    srun.chmod(0o755)
    return [str(srun)]


def test_a_node_without_an_ok_line_is_bad_and_every_line_reaches_the_log(tmp_path):
    p = nodecheck.PREFIX
    argv = fake_srun(tmp_path, f"echo '{p} node1 ok (0.1 s)'; echo '{p} node2| Xid 79'\n"
                               f"echo '{p} node2 FAILED: its command exited with 1'\n"
                               "echo 'srun: error: node2: task 1: Exited with exit code 1' >&2; exit 1")  # fmt: skip
    seen: list[str] = []
    bad, code = nodecheck.run_step(argv, {}, ["node1", "node2", "node3"], 30, seen.append)
    assert bad == {"node2": "its command exited with 1", "node3": "no result: its check never reported"}
    assert code == 1 and len(seen) == 4 and seen[1] == f"{p} node2| Xid 79"


def test_a_step_past_its_limit_is_ended_and_its_silent_nodes_are_bad(tmp_path):
    argv = fake_srun(tmp_path, f"echo '{nodecheck.PREFIX} node1 ok (0.1 s)'; exec sleep 300")
    bad, _ = nodecheck.run_step(argv, {}, ["node1", "node2"], 1, lambda line: None)
    assert bad == {"node2": "no result within 1 s"}


def test_a_step_that_srun_could_not_start_blames_no_node(tmp_path):
    error = "srun: error: Unable to create step for job 77: Invalid generic resource specification"
    argv = fake_srun(tmp_path, f"echo '{error}' >&2; exit 1")
    assert nodecheck.run_step(argv, {}, ["node1", "node2"], 30, lambda line: None) == ({}, 1)


# --- the roster and the launcher ------------------------------------------------------------------------------------
def test_excluded_nodes_leave_the_roster_wherever_they_are_and_spares_fill_the_step():
    roster = spares.Roster(("node1", "node2", "node3", "node4", "node5"), 2)
    assert roster.exclude(["node2", "node4"]) == {"node2": "node3", "node4": None}  # node4 was a spare
    assert roster.chosen() == ("node1", "node3") and roster.spare() == "node5" and roster.enough()
    assert roster.exclude(["node1", "node3"]) == {"node1": "node5", "node3": None}  # one spare for two
    assert roster.chosen() == ("node5",) and not roster.enough()


def launches(
    monkeypatch: pytest.MonkeyPatch, checks: list[dict[str, str]], ends: list[StepEnd]
) -> tuple[list[list[str]], list[tuple[str, ...]]]:
    """The check steps and the training steps replaced: each check gives the next of `checks` (bad node -> why), each
    training step the next of `ends`; the nodes each check ran on and each training step trained on."""
    checked: list[list[str]] = []
    trained: list[tuple[str, ...]] = []

    def run_step(argv: Sequence[str], env: object, nodes: Sequence[str], limit: float, out: object) -> tuple:
        checked.append(list(nodes))
        return checks.pop(0), 0

    def launch_step(
        argv: Sequence[str],
        env: object,
        nodes: Sequence[str],
        spare_left: bool,
        spares: Sequence[str] = (),
        restartable: bool = False,
    ) -> StepEnd:
        trained.append(tuple(nodes))
        return ends.pop(0)

    monkeypatch.setattr(nodecheck, "run_step", run_step)
    monkeypatch.setattr(launcher, "launch_step", launch_step)
    monkeypatch.setattr(spares, "wait_step_gone", lambda job: True)
    monkeypatch.setattr(spares, "head_address", lambda head, peers: f"addr-of-{head}")
    return checked, trained


def job_env(tmp_path: Path, train: int | None = 2) -> dict[str, str]:
    env = {COMMAND: "site-check", protocol.LOG_STEM_VAR: str(JobFiles.of(tmp_path, "77", 1).prefix)}
    env[protocol.FAILED_NODE_FILE_VAR] = str(tmp_path / "77.failed-node")
    return env | ({protocol.TRAIN_NODES_VAR: str(train)} if train else {})


def test_a_node_failing_its_check_is_never_used_and_named(tmp_path, monkeypatch, capfd):
    env = job_env(tmp_path)
    checked, trained = launches(monkeypatch, [{"node2": "its command exited with 1"}], [StepEnd(0)])
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == 0
    assert checked == [["node1", "node2", "node3"]] and trained == [("node1", "node3")]
    err = capfd.readouterr().err
    assert "node node2 failed its node check: its command exited with 1; spare node3 takes its place" in err
    assert "node check: 2 of 3 node(s) ok" in err
    (line,) = [json.loads(x) for x in JobFiles(Path(env[protocol.LOG_STEM_VAR])).replacements.read_text().splitlines()]
    assert (line["event"], line["node"], line["spare"], line["relaunch"]) == ("check_failed", "node2", "node3", 0)
    said = status_view.replacements(str(JobFiles(Path(env[protocol.LOG_STEM_VAR])).log))
    assert said == "node2 -> node3 (failed its node check: its command exited with 1)"
    assert not Path(env[protocol.FAILED_NODE_FILE_VAR]).exists()


def test_a_spare_failing_its_check_is_left_unused_and_cannot_replace_a_node_later(tmp_path, monkeypatch, capfd):
    env = job_env(tmp_path)
    dead = launcher.Failure("node2", 1, 1, "Exited with exit code 1")
    checked, trained = launches(monkeypatch, [{"node3": "no result within 150 s"}, {}], [StepEnd(1, dead)])
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == 1  # the spare was bad: none left
    assert checked == [["node1", "node2", "node3"]] and trained == [("node1", "node2")]
    assert "node node3 failed its node check: no result within 150 s; a spare: unused" in capfd.readouterr().err
    assert status_view.replacements(str(JobFiles(Path(env[protocol.LOG_STEM_VAR])).log)) == (
        "node3 (failed its node check: no result within 150 s)"
    )


def test_every_relaunch_checks_its_nodes_first(tmp_path, monkeypatch):
    env = job_env(tmp_path)
    dead = launcher.Failure("node2", 1, 1, "Exited with exit code 1")
    checked, trained = launches(monkeypatch, [{}, {}], [StepEnd(1, dead), StepEnd(0)])
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == 0
    assert checked == [["node1", "node2", "node3"], ["node1", "node3"]]
    assert trained == [("node1", "node2"), ("node1", "node3")]


def test_without_a_good_node_to_spare_the_launcher_fails_naming_the_node_for_the_retry(tmp_path, monkeypatch, capfd):
    env = job_env(tmp_path, train=None)  # no spares
    checked, trained = launches(monkeypatch, [{"node3": "nvidia-smi -L lists 1 GPU(s), SLURM granted 2"}], [])
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == 1
    assert trained == []  # the training never started
    assert Path(env[protocol.FAILED_NODE_FILE_VAR]).read_text() == "node3\n"
    err = capfd.readouterr().err
    assert "node node3 failed its node check: nvidia-smi -L lists 1 GPU(s), SLURM granted 2; no spare left" in err
    assert "FAILED: 2 good node(s) left, the training needs 3; node node3 is named for the retry to exclude" in err


def test_with_the_check_off_no_step_runs(tmp_path, monkeypatch):
    env = job_env(tmp_path) | {protocol.NODE_CHECK_VAR: "0"}
    checked, trained = launches(monkeypatch, [], [StepEnd(0)])
    assert launcher.launch_with_spares(ALLOC, [], ["train.py"], env, None) == 0
    assert checked == [] and trained == [("node1", "node2")]
