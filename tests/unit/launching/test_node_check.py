"""The node check (node_check.py): the profile key and its exports, one node's check with a fake nvidia-smi and a site
command, the launcher's step and verdicts, and the launcher dropping a failing node before the training starts there
(the real run: tests/cluster/test_node_check_cluster.py).
The tests that start processes: tests/process/launching/test_node_check.py."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.launching import launcher, node_check, spares
from snakemake_executor_multinode.launching.launcher import Allocation, StepEnd
from snakemake_executor_multinode.planning.environment import EnvProfileError, load_profiles, render_lines, resolve
from snakemake_executor_multinode.watching import status_view
from tests.helpers import exports, profile_file

ALLOC = Allocation("77", ("node1", "node2", "node3"), gpus_per_node=2, cpus_per_task=2, master_addr="10.0.0.1",
                   master_port=20308)  # fmt: skip
COMMAND = protocol.NODE_CHECK_COMMAND_VAR


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


def test_without_the_key_nothing_is_exported_and_the_launcher_checks_by_default(tmp_path):
    assert exports(tmp_path, "true") and not [
        line for line in render_lines(resolve(load_profiles(), "ethernet")) if "NODE_CHECK" in line
    ]
    assert node_check.settings({}) == node_check.Settings(on=True, command="", timeout=120)
    assert not node_check.settings({protocol.NODE_CHECK_VAR: "0"}).on


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
        node_check.settings({protocol.NODE_CHECK_TIMEOUT_VAR: "soon"})


def test_the_granted_count_falls_back_to_cuda_visible_devices_then_the_allocation():
    assert node_check.granted_gpus({"SLURM_GPUS_ON_NODE": "2", "CUDA_VISIBLE_DEVICES": "0,1,2"}, 8) == 2
    assert node_check.granted_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2"}, 8) == 3
    assert node_check.granted_gpus({}, 8) == 8


def test_a_long_output_keeps_its_last_lines():
    lines = node_check.report("n1", node_check.Outcome("", tuple(str(i) for i in range(250))), 1.0)
    assert lines[0] == f"{node_check.PREFIX} n1| (50 earlier line(s) left out)" and lines[1].endswith("| 50")
    assert len(lines) == node_check.OUTPUT_LINES + 2


# --- the launcher's step --------------------------------------------------------------------------------------------
def test_the_step_checks_every_given_node_once_without_killing_the_others_on_a_failure():
    argv = node_check.srun_command(["node1", "node3"], 4, python="/py")
    assert argv[0] == "srun" and argv[-4:] == ["/py", "-m", node_check.MODULE, "--gpus=4"]
    for flag in ("--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=node1,node3", "--overlap",
                 "--kill-on-bad-exit=0", "--export=ALL", f"--job-name={node_check.STEP_NAME}"):  # fmt: skip
        assert flag in argv


def test_the_step_runs_only_when_it_has_something_to_check():
    on, command = node_check.Settings(), node_check.Settings(command="true")
    assert not node_check.wanted(on, 8, which=lambda name: None)  # no nvidia-smi, no command: nothing to check
    assert node_check.wanted(on, 8, which=lambda name: "/usr/bin/nvidia-smi")
    assert not node_check.wanted(on, 0, which=lambda name: "/usr/bin/nvidia-smi")  # no GPUs to count
    assert node_check.wanted(command, 0, which=lambda name: None)
    assert not node_check.wanted(node_check.Settings(on=False, command="true"), 8, which=lambda name: "/x")


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

    monkeypatch.setattr(node_check, "run_step", run_step)
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
