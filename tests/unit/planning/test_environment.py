"""Environment profiles (YAML) -> the shell lines a job runs before the rule."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest

from snakemake_executor_multinode.planning import environment
from snakemake_executor_multinode.planning.environment import EnvProfileError, load_profiles, render_lines, resolve


def lines_for(tmp_path, text: str, selection: str | None = None) -> list[str]:
    f = tmp_path / "env.yaml"
    f.write_text(text)
    profiles = load_profiles(f)
    return render_lines(resolve(profiles, selection))


def test_cuda_extends_path_but_replaces_library_path_and_home(tmp_path):
    lines = lines_for(tmp_path, "profiles:\n  cu118:\n    cuda: /opt/cuda-11.8/\n", "cu118")
    assert 'export PATH=/opt/cuda-11.8/bin:"$PATH"' in lines
    assert "export LD_LIBRARY_PATH=/opt/cuda-11.8/lib64" in lines  # replaced, not appended
    assert "export CUDA_HOME=/opt/cuda-11.8" in lines


def test_conda_is_activated_in_the_job_and_alloc_conf_is_always_set(tmp_path):
    lines = lines_for(tmp_path, "profiles:\n  c:\n    conda: {base: /opt/anaconda3, env: my env}\n", "c")
    assert lines.index("source /opt/anaconda3/etc/profile.d/conda.sh") < lines.index("conda activate 'my env'")
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in lines


def test_builtin_infiniband_profile_holds_only_what_is_right_on_any_fabric():
    lines = render_lines(resolve(load_profiles(), "infiniband"))
    for expected in (
        "NCCL_IB_DISABLE=0",
        "NCCL_IB_TIMEOUT=22",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING=1",
        "TORCH_NCCL_TRACE_BUFFER_SIZE=2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT=1",
        "NCCL_DEBUG=WARN",
        "MULTINODE_NETWORK_CHECK=60",
    ):
        assert f"export {expected}" in lines
    # site- and hardware-specific: NCCL's own detection picks every HCA
    for variable in ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_IB_TC", "NCCL_LAUNCH_MODE", "NCCL_MIN_NRINGS"):
        assert not any(line.startswith(f"export {variable}=") for line in lines), variable


def test_a_null_unsets_what_an_extended_builtin_profile_sets(tmp_path):
    text = "profiles:\n  site:\n    extends: infiniband\n    nccl: {socket_ifname: null}\n    env: {X: null}\n"
    text += "  base:\n    env: {X: '1'}\n"
    lines = lines_for(tmp_path, text, "base,site")
    assert not any(line.startswith("export NCCL_SOCKET_IFNAME=") for line in lines)
    assert not any(line.startswith("export X=") for line in lines)
    assert "export NCCL_IB_DISABLE=0" in lines  # the rest of the built-in stays


def test_a_null_unsets_what_an_earlier_profile_of_the_selection_sets(tmp_path):
    lines = lines_for(tmp_path, "profiles:\n  quiet:\n    nccl: {debug: null}\n", "infiniband,quiet")
    assert not any(line.startswith("export NCCL_DEBUG=") for line in lines)


def test_unsetting_a_key_no_profile_in_the_chain_sets_is_an_error_naming_file_profile_and_key(tmp_path):
    with pytest.raises(EnvProfileError) as err:
        lines_for(tmp_path, "profiles:\n  site:\n    extends: ethernet\n    nccl: {hca: null}\n", "site")
    assert f"{tmp_path / 'env.yaml'}: profiles.site.nccl.hca: null unsets nccl.hca" in str(err.value)


def test_ethernet_and_debug_profiles_compose_left_to_right():
    lines = render_lines(resolve(load_profiles(), "ethernet,debug"))
    assert "export NCCL_IB_DISABLE=1" in lines
    assert "export NCCL_DEBUG=INFO" in lines and "export NCCL_DEBUG=WARN" not in lines
    assert "export TORCH_DISTRIBUTED_DEBUG=DETAIL" in lines


def test_extends_and_default_apply(tmp_path):
    text = (
        "default: mine\nprofiles:\n  mine:\n    extends: infiniband\n    nccl: {hca: mlx5_2}\n"
        "    env: {WANDB_MODE: offline}\n    modules: [cuda/12.1]\n"
    )
    lines = lines_for(tmp_path, text)
    assert "export NCCL_IB_HCA=mlx5_2" in lines and "export NCCL_IB_TIMEOUT=22" in lines
    assert "export WANDB_MODE=offline" in lines and "module load cuda/12.1" in lines


def test_values_are_quoted(tmp_path):
    lines = lines_for(tmp_path, 'profiles:\n  q:\n    env: {X: "$(touch pwned); echo"}\n', "q")
    assert "export X='$(touch pwned); echo'" in lines


@pytest.mark.parametrize(
    "text,expected",
    [
        ("profiles: [a, b]", "env.yaml: 'profiles' must be a mapping"),
        ("profiles:\n  a:\n    cuda: [1]\n", "env.yaml: profiles.a.cuda: must be a string"),
        ("profiles:\n  a:\n    nccl: {ibb: 1}\n", "env.yaml: profiles.a.nccl.ibb: unknown"),
        ("profiles:\n  a:\n    colour: red\n", "env.yaml: profiles.a: unknown key(s) ['colour']"),
        ("profiles:\n  a:\n    env: {1BAD: x}\n", "profiles.a.env.1BAD: not a valid environment variable name"),
        ("profiles:\n  a:\n    extends: nope\n", "profiles.a.extends: profile 'nope' is not defined"),
        ("default: nope\nprofiles: {}\n", "env.yaml: default: profile 'nope' is not defined"),
        ("profiles:\n  a: {env: {X: 1}\n", "env.yaml: not valid YAML"),
        ("profiles:\n  a:\n    conda: my_env\n", "profiles.a.conda: must be {env: NAME_OR_PATH"),
    ],
)
def test_malformed_profile_files_name_the_file_and_key(tmp_path, text, expected):
    with pytest.raises(EnvProfileError) as err:
        lines_for(tmp_path, text)
    assert expected in str(err.value)
    assert str(tmp_path / "env.yaml") in str(err.value)


def test_missing_profile_file_is_named(tmp_path):
    with pytest.raises(EnvProfileError, match="nope.yaml: environment profile file not found"):
        load_profiles(tmp_path / "nope.yaml")


def test_the_torch_nccl_variables_we_set_exist_in_the_installed_torch():
    """torch renames its NCCL variables now and then (NCCL_ASYNC_ERROR_HANDLING became TORCH_NCCL_...): every
    TORCH_NCCL_* name a profile can set must be one torch's c10d library reads."""
    import os

    import torch

    root = Path(os.path.dirname(torch.__file__))
    # the CPU wheel has no libtorch_cuda: ProcessGroupNCCL's names are in its header, the flight recorder's in libtorch
    headers = b"".join(f.read_bytes() for f in (root / "include/torch/csrc/distributed/c10d").glob("*.hpp"))
    with open(root / "lib" / "libtorch_cpu.so", "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as lib:
        missing = [
            v
            for v in environment.TORCH_NCCL_VARIABLES
            if f'"{v}"'.encode() not in headers and lib.find(v.encode() + b"\0") < 0
        ]
    assert missing == []


def test_the_flight_recorder_dumps_beside_the_job_log():
    lines = environment.render_lines({"nccl": {"trace_buffer_size": 2000, "dump_on_timeout": True}})
    assert "export TORCH_NCCL_TRACE_BUFFER_SIZE=2000" in lines and "export TORCH_NCCL_DUMP_ON_TIMEOUT=1" in lines
    assert any(
        line.startswith(
            'export TORCH_NCCL_DEBUG_INFO_TEMP_FILE="$SLURM_SUBMIT_DIR/$MULTINODE_LOG_STEM".nccl-trace-rank'
        )
        for line in lines
    )
