"""No silent traps: a rule that asks for nodes (or several GPUs on one node) its command would leave idle is refused
before submission, with the fix in the message; own_launcher=True and --multinode-launchers say the command starts
its ranks itself. A CPU multi-node rule is accepted with a warning; the stall watchdog is said at submission.
The tests that start processes: tests/process/planning/test_launcher_use.py."""

from __future__ import annotations

import pytest

from snakemake_executor_multinode.planning import launcher_use
from snakemake_executor_multinode.planning.launcher_use import watchdog
from snakemake_executor_multinode.planning.plan import Planner
from snakemake_executor_multinode.planning.request import RequestError, build_request
from snakemake_executor_multinode.session import Settings, SettingsError


def refusal(resources: dict, shellcmd: str | None, kind: str | None = None, launchers: tuple[str, ...] = ()) -> str:
    with pytest.raises(RequestError) as err:
        launcher_use.refuse_idle(build_request("train", resources), shellcmd, kind, launchers)
    return str(err.value)


def accepted(resources: dict, shellcmd: str | None, launchers: tuple[str, ...] = ()) -> bool:
    launcher_use.refuse_idle(build_request("train", resources), shellcmd, "script rule", launchers)
    return True


def test_a_multinode_rule_that_never_starts_multinode_torchrun_is_refused_with_the_fix():
    assert refusal({"nodes": 4, "gpus": 8}, "python train.py") == (
        "rule train: nodes=4, gpus=8 but its command never starts `multinode torchrun`: it would run on the head node "
        "only while 3 node(s) idle. Write `multinode torchrun train.py ...`, name your launcher in "
        "--multinode-launchers, or set resources own_launcher=True if the script starts its ranks itself "
        "(srun, mpirun)."
    )


def test_several_gpus_on_one_node_without_a_launcher_are_refused():
    message = refusal({"gpus": 4}, "python train.py")
    assert message.startswith("rule train: gpus=4 but its command never starts `multinode torchrun`: it would run one ")
    assert "process while 3 of its 4 GPUs idle" in message


@pytest.mark.parametrize(
    "command",
    [
        "multinode torchrun train.py",
        "cd work && multinode torchrun train.py --lr 1e-4",
        "mkdir -p out\nOMP_NUM_THREADS=4 exec multinode torchrun train.py > out/log",
        "(multinode torchrun train.py) | tee log",
    ],
)
def test_multinode_torchrun_as_a_command_word_anywhere_counts(command):
    assert accepted({"nodes": 2, "gpus": 8}, command)


@pytest.mark.parametrize(
    "command",
    ["echo multinode torchrun train.py", "python train.py  # multinode torchrun", "multinode preview -- torchrun"],
)
def test_multinode_torchrun_only_mentioned_does_not_count(command):
    assert "never starts `multinode torchrun`" in refusal({"nodes": 2, "gpus": 8}, command)


def test_a_launcher_named_in_the_setting_counts_and_the_refusal_names_them():
    assert accepted({"nodes": 2, "gpus": 8}, "cd x && /opt/bin/accelerate launch train.py", ("accelerate",))
    message = refusal({"nodes": 2, "gpus": 8}, "python train.py", launchers=("accelerate", "deepspeed"))
    assert "never starts `multinode torchrun` (nor accelerate, deepspeed)" in message


def test_own_launcher_opts_out_and_takes_the_stall_watchdog_with_it():
    assert accepted({"nodes": 2, "gpus": 8, "own_launcher": True}, "srun python train.py")
    assert accepted({"nodes": 2, "own_launcher": "True"}, None)  # --set-resources hands over text
    assert build_request("train", {"nodes": 2, "own_launcher": True}).launcher.stall_timeout_s == 0
    assert build_request("train", {"nodes": 2}).launcher.stall_timeout_s is None  # the adaptive timeout


def test_a_sites_own_launcher_takes_the_stall_watchdog_with_it():
    """The watchdog lives in `multinode torchrun`: a command of --multinode-launchers runs without one."""
    assert launcher_use.site_launcher("accelerate launch train.py", ("accelerate",))
    assert not launcher_use.site_launcher("multinode torchrun train.py", ("accelerate",))
    assert not launcher_use.site_launcher("accelerate launch x.py && multinode torchrun y.py", ("accelerate",))
    assert not launcher_use.site_launcher(None, ("accelerate",)) and not launcher_use.site_launcher("python x.py", ())
    assert build_request("train", {"nodes": 2}, site_launcher=True).launcher.stall_timeout_s == 0


@pytest.mark.parametrize("value", [1, "yes", 2.0, None])
def test_own_launcher_is_a_bool(value):
    with pytest.raises(RequestError) as err:
        build_request("train", {"own_launcher": value})
    assert str(err.value) == (
        f"rule 'train': resource own_launcher={value!r} is invalid: True (the command starts its ranks on every node "
        "itself, e.g. with srun or mpirun) or False"
    )


def test_a_script_rule_on_several_nodes_is_refused_unless_own_launcher():
    message = refusal({"nodes": 2, "gpus": 4}, None, "script rule")
    assert message.startswith(
        "rule train: nodes=2, gpus=4 but it is a script rule, so nothing starts `multinode torchrun`: it would run on "
        "the head node only while 1 node(s) idle. Make it a shell rule that runs `multinode torchrun train.py ...`"
    )
    assert accepted({"nodes": 2, "gpus": 4, "own_launcher": True}, None)
    assert accepted({"gpus": 4}, None)  # one node: the script may use its GPUs itself


def test_a_single_gpu_rule_may_run_any_command():
    assert accepted({"gpus": 1}, "python evaluate.py")
    assert accepted({}, "python evaluate.py")


def test_a_launcher_that_is_not_a_command_is_a_settings_error(tmp_path):
    with pytest.raises(SettingsError) as err:
        Planner(Settings(launchers="bash, no-such-launcher-xyz"), tmp_path, "run1")
    assert str(err.value).startswith(
        "--multinode-launchers='bash, no-such-launcher-xyz': 'no-such-launcher-xyz' is not a command on PATH"
    )
    assert Planner(Settings(launchers="bash, sh"), tmp_path, "run1").launchers == ("bash", "sh")


def test_a_cpu_multinode_rule_is_accepted_with_a_warning_naming_the_rule():
    req = build_request("reduce", {"nodes": 3})
    assert req.warnings == (
        "rule 'reduce': nodes=3 without gpus: a CPU multi-node job. Each node gets one task and no GPU; "
        "`multinode torchrun` starts one process per node (gloo backend). Set gpus=N (per node) for GPU training",
    )
    assert build_request("train", {"nodes": 3, "gpus": 1}).warnings == ()


def test_the_submission_line_states_the_stall_watchdog_and_the_restarts_where_they_apply():
    torchrun = "multinode torchrun train.py"
    restarts = ", up to 3 in-job restart(s) (resources max_restarts)"
    assert watchdog(build_request("train", {"nodes": 2, "gpus": 1}), torchrun) == (
        ", stall watchdog adaptive (10x the interval between step lines, at least 30 s; 30 min before the second "
        "step line, during a checkpoint save and without step lines; resources stall_timeout)" + restarts
    )
    assert watchdog(build_request("train", {"nodes": 2, "gpus": 1, "stall_timeout": "90s"}), torchrun) == (
        ", stall watchdog 90 s (resources stall_timeout; 0 turns it off)" + restarts
    )
    assert watchdog(build_request("eval", {"gpus": 1}), torchrun) == restarts  # one node: no watchdog by default
    off = {"nodes": 2, "gpus": 1, "stall_timeout": "off", "max_restarts": 0}
    assert watchdog(build_request("train", off), torchrun) == ""


def test_a_job_started_by_another_launcher_is_told_of_no_watchdog_it_does_not_have():
    """The watchdog runs inside `multinode torchrun`: an accelerate command named in --multinode-launchers has none."""
    req = build_request("train", {"nodes": 2, "gpus": 1})
    assert watchdog(req, "accelerate launch train.py") == ""
    assert watchdog(req, "cd src && multinode torchrun train.py") != ""


def test_a_stall_timeout_on_a_site_launchers_rule_is_said_to_have_no_effect_not_dropped_in_silence():
    req = build_request("train", {"nodes": 2, "stall_timeout": "20m"}, site_launcher=True)
    assert req.launcher.stall_timeout_s == 0
    assert any("stall_timeout has no effect" in w and "--multinode-launchers" in w for w in req.warnings)
    assert not [w for w in build_request("train", {"nodes": 2}, site_launcher=True).warnings if "stall_timeout" in w]
