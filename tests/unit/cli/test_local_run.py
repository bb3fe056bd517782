"""`multinode torchrun` outside SLURM gives the training what a job gives it where one machine has it: the chosen
environment profile's NCCL block and variables, a metrics file, a preempt file and a log stem, and it says what it
does not apply (cli/local_run.py). The runs themselves: tests/unit/launching/test_launcher.py (outside SLURM) and
tests/training/test_dataloader_usr2.py (the signal)."""

from __future__ import annotations

from pathlib import Path

import pytest

from snakemake_executor_multinode.cli.local_run import ENV_PROFILE_VAR, PROFILE_FILE_VAR, prepare
from snakemake_executor_multinode.contract.jobfiles import StateFolders

NOW, PID = 1765000000.0, 4242


def test_the_chosen_profile_gives_its_nccl_block_and_the_run_gets_a_job_s_files(tmp_path):
    run = prepare({ENV_PROFILE_VAR: "infiniband"}, tmp_path, NOW, PID)
    v = run.variables
    assert v["NCCL_IB_DISABLE"] == "0" and v["NCCL_IB_TIMEOUT"] == "22" and v["NCCL_DEBUG"] == "WARN"
    assert v["NCCL_SOCKET_IFNAME"] == "^lo,docker"  # NCCL's own docker exclusion kept (a value replaces its default)
    assert v["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"  # what every job gets
    folder = StateFolders(tmp_path).local_runs
    assert (
        run.files.prefix.parent == folder
        and run.files.prefix.name.startswith("local-")
        and str(PID) in v["MULTINODE_METRICS_FILE"]
    )
    assert v["MULTINODE_METRICS_FILE"] == str(run.files.metrics)
    assert v["MULTINODE_PREEMPT_FILE"] == str(run.files.preempt_marker) and v["MULTINODE_LOG_STEM"] == str(
        run.files.prefix
    )
    assert v["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(run.files.nccl_traces)  # dumps beside the run's files
    assert run.said[0].startswith("profile infiniband: NCCL_IB_DISABLE=0 ")
    assert "not here: the network preflight (one node), the node check, the stall watchdog" in run.said[-1]


def test_without_a_profile_only_the_defaults_and_the_files_are_set(tmp_path):
    run = prepare({}, tmp_path, NOW, PID)
    assert not [k for k in run.variables if k.startswith(("NCCL_", "TORCH_NCCL_"))]
    assert run.said[0].startswith("profile (none): PYTORCH_CUDA_ALLOC_CONF=")


def test_a_profile_file_s_default_software_and_replaced_variables_are_said(tmp_path):
    f = tmp_path / "site.yaml"
    f.write_text(
        "default: site\n"
        "profiles:\n"
        "  site:\n"
        "    extends: ethernet\n"
        "    conda: {env: train}\n"
        "    modules: [cuda/12.4]\n"
        "    env: {MY_VAR: '1'}\n"
    )
    run = prepare({PROFILE_FILE_VAR: str(f), "NCCL_DEBUG": "INFO"}, tmp_path, NOW, PID)
    assert run.variables["MY_VAR"] == "1" and run.variables["NCCL_SOCKET_IFNAME"] == "^lo,docker"
    assert run.said[0].startswith("profile site: ")
    assert "replaced as in a job (the profile's values win): NCCL_DEBUG" in run.said
    (software,) = [line for line in run.said if line.startswith("not applied here")]
    assert "the profile's modules, conda (they choose the software" in software


@pytest.mark.parametrize(
    "env, message",
    [
        ({ENV_PROFILE_VAR: "infiniban"}, f"{ENV_PROFILE_VAR}='infiniban': unknown environment profile 'infiniban'"),
        ({PROFILE_FILE_VAR: "/nonexistent.yaml"}, "/nonexistent.yaml: environment profile file not found"),
    ],
)
def test_a_profile_that_cannot_be_used_is_an_error_naming_it(tmp_path, env, message):
    with pytest.raises(SystemExit, match=message.replace("(", r"\(").replace(")", r"\)")):
        prepare(env, Path(tmp_path), NOW, PID)
