"""Containers per environment profile: the job script's variables read back on the nodes, and each runtime's
rendering (what a profile may say: tests/unit/contract/test_container_spec.py).

The podman rendering runs for real in test_container_cluster.py; pyxis and apptainer are checked here as rendered.
The tests that start processes: tests/process/launching/test_container.py."""

from __future__ import annotations

import shlex
from pathlib import Path, PurePosixPath

import pytest

from snakemake_executor_multinode.contract import container_spec, protocol
from snakemake_executor_multinode.contract.container_spec import parse
from snakemake_executor_multinode.launching import container, launcher, nodelog
from snakemake_executor_multinode.launching.container import wrap
from snakemake_executor_multinode.planning import environment
from snakemake_executor_multinode.planning.request import RequestError, refuse_container_directive

ALLOC = launcher.Allocation(
    "42", ("node1", "node2"), gpus_per_node=4, cpus_per_task=8, master_addr="10.0.0.1", master_port=24242
)
TORCHRUN = ["/usr/bin/python3", "-m", "torch.distributed.run", "--nnodes=2", "train.py"]


def spec(**kw: object) -> container_spec.ContainerSpec:
    box = parse({"runtime": "podman", "image": "localhost/train:1"} | kw, "t.container")
    assert box is not None
    return box


def test_a_profile_file_error_names_the_file_the_profile_and_the_key(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("profiles:\n  box:\n    container: {runtime: podman, image: x, mounts: [relative]}\n")
    with pytest.raises(environment.EnvProfileError) as err:
        environment.load_profiles(path)
    assert str(err.value).startswith(f"{path}: profiles.box.container.mounts: 'relative' is invalid")


def profiles(tmp_path: Path, body: str) -> environment.ProfileSet:
    path = tmp_path / "p.yaml"
    path.write_text(body)
    return environment.load_profiles(path)


def test_the_job_script_exports_the_container_and_the_launcher_reads_it_back(tmp_path):
    ps = profiles(
        tmp_path,
        "profiles:\n  box:\n    extends: ethernet\n    env: {WANDB_MODE: offline}\n"
        "    container: {runtime: podman, image: 'localhost/t:1', mounts: ['/data:/data:ro', /scratch],\n"
        "                flags: ['--security-opt=label=disable', '--annotation=a b'], python: /opt/py/bin/python,\n"
        "                gpus: devices, env: [HF_*]}\n",
    )
    lines = environment.render_lines(environment.resolve(ps, "box"))
    exported = [line for line in lines if "MULTINODE_CONTAINER_" in line]
    assert all(line.startswith("export MULTINODE_CONTAINER_") for line in exported)
    env: dict[str, str] = {}
    for line in exported:  # what bash makes of the lines
        name, value = line.removeprefix("export ").split("=", 1)
        env[name] = shlex.split(value)[0]
    assert set(env) <= set(protocol.CONTAINER_VARIABLES)
    assert env[protocol.CONTAINER_ENV_VAR] == "HF_* WANDB_MODE"  # the profile's own variables pass in by name
    back = container.from_env(env)
    assert back == container_spec.ContainerSpec(
        "podman",
        "localhost/t:1",
        ("/data:/data:ro", "/scratch"),
        ("--security-opt=label=disable", "--annotation=a b"),
        None,
        "/opt/py/bin/python",
        "devices",
        ("HF_*", "WANDB_MODE"),
    )


def test_a_later_profile_turns_the_container_off_and_bad_variables_end_the_launcher(tmp_path):
    ps = profiles(tmp_path, "profiles:\n  box: {container: {runtime: podman, image: x}}\n  bare: {container: null}\n")
    assert not any("CONTAINER" in line for line in environment.render_lines(environment.resolve(ps, "box,bare")))
    assert container.from_env({}) is None
    with pytest.raises(SystemExit, match="MULTINODE_CONTAINER_\\* variables: container.runtime: 'docker'"):
        container.from_env({protocol.CONTAINER_RUNTIME_VAR: "docker", protocol.CONTAINER_IMAGE_VAR: "x"})


def test_podman_runs_torchrun_on_the_node_network_with_the_job_variables_gpus_and_the_relay(tmp_path):
    for i in range(2):
        (tmp_path / f"nvidia{i}").touch()
    w = wrap(
        spec(mounts=["/data:/data:ro"], gpus="devices"),
        TORCHRUN,
        workdir="/w",
        gpus_per_node=2,
        uid=0,
        dev_glob=str(tmp_path / "nvidia*"),
    )
    assert w.srun_flags == []
    assert w.argv[:5] == ["podman", "run", "--rm", "--network=host", "--ipc=host"]
    assert "--userns=keep-id" not in w.argv  # rootful: root's ids
    for name in ("MASTER_ADDR", "MASTER_PORT", "MULTINODE_*", "SLURM_*", "NCCL_*", "CUDA_VISIBLE_DEVICES"):
        assert f"--env={name}" in w.argv
    assert "--volume=/w:/w" in w.argv and "--volume=/data:/data:ro" in w.argv and "--workdir=/w" in w.argv
    assert [a for a in w.argv if a.startswith("--device")] == [
        f"--device={tmp_path}/nvidia0",
        f"--device={tmp_path}/nvidia1",
    ]
    at = w.argv.index("localhost/train:1")
    assert w.argv[at + 1 : at + 4] == ["sh", "-c", container.RELAY] and w.argv[at + 5 :] == TORCHRUN
    cdi = wrap(spec(), TORCHRUN, workdir="/w", gpus_per_node=8, uid=1000).argv
    assert "--device=nvidia.com/gpu=all" in cdi and "--userns=keep-id" in cdi
    assert not any(a.startswith("--device") for a in wrap(spec(), TORCHRUN, workdir="/w", gpus_per_node=0).argv)
    assert not any(
        a.startswith("--device") for a in wrap(spec(gpus="none"), TORCHRUN, workdir="/w", gpus_per_node=8).argv
    )


def test_apptainer_binds_the_mounts_and_adds_nv_only_where_the_job_has_gpus():
    box = parse({"runtime": "apptainer", "image": "/img/t.sif", "mounts": ["/data"], "flags": ["--cleanenv"]}, "t")
    with_gpus = wrap(box, TORCHRUN, workdir="/w", gpus_per_node=4).argv
    at = with_gpus.index("/img/t.sif")
    assert with_gpus[:at] == [
        "apptainer",
        "exec",
        "--nv",
        "--bind",
        "/w:/w",
        "--bind",
        "/data",
        "--pwd",
        "/w",
        "--cleanenv",
    ]
    assert with_gpus[at + 1 :] == ["sh", "-c", container.IGNORE_USR2, "multinode-agent", *TORCHRUN]
    assert "--nv" not in wrap(box, TORCHRUN, workdir="/w", gpus_per_node=0).argv
    sing = parse({"runtime": "singularity", "image": "/img/t.sif", "gpus": "none"}, "t")
    assert wrap(sing, TORCHRUN, workdir="/w", gpus_per_node=4).argv[:3] == ["singularity", "exec", "--bind"]


def test_pyxis_adds_srun_flags_and_runs_the_node_task_with_the_image_python(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    box = parse(
        {
            "runtime": "pyxis",
            "image": "nvcr.io#nvidia/pytorch:24.05-py3",
            "mounts": ["/data:/data:ro"],
            "flags": ["--container-remap-root"],
            "python": "/usr/bin/python",
        },
        "t",
    )
    argv = launcher.srun_command(ALLOC, [], ["train.py"], box=box)
    at = argv.index("bash")
    package = Path(container.__file__).parents[1]
    assert argv[at - 4 : at] == [
        "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
        f"--container-mounts={tmp_path}:{tmp_path},/data:/data:ro,{package}:/opt/multinode-launcher/{package.name}:ro",
        f"--container-workdir={tmp_path}",
        "--container-remap-root",
    ]
    task = argv[at + 2]
    assert task.startswith('trap "" USR2; exec /usr/bin/python -c ')  # the labeller, in the image
    assert "from snakemake_executor_multinode.launching.nodelog import main" in task
    assert "/usr/bin/python -m torch.distributed.run --nnodes=2" in task and '--node_rank="$SLURM_NODEID"' in task
    # what the boot line imports from the mount is this package's labeller, file for file
    source, target = argv[at - 3].split(",")[-1].removesuffix(":ro").split(":")
    labeller = PurePosixPath(container.PYXIS_PACKAGE_DIR, *container._LABELLER.split(".")).with_suffix(".py")
    assert labeller.is_relative_to(target)
    assert Path(source, labeller.relative_to(target)).resolve() == Path(nodelog.__file__).resolve()


def test_the_launcher_wraps_torchrun_and_keeps_the_node_rank_and_the_usr2_ignore(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    argv = launcher.srun_command(
        ALLOC, ["--nproc_per_node=2"], ["train.py", "--lr", "3e-4"], box=spec(python="/opt/py/python")
    )
    task = argv[argv.index("bash") + 2]
    assert task.startswith('trap "" USR2; exec ')
    words = shlex.split(task.split("exec ", 1)[1])
    assert "snakemake_executor_multinode.launching.nodelog" in words  # the labeller stays on the node, around podman
    assert words[words.index("podman") + 1] == "run"
    assert "--node_rank=$SLURM_NODEID" in words  # the node's shell fills it in, outside the container
    torchrun = words[words.index("/opt/py/python") :]
    assert torchrun[:3] == ["/opt/py/python", "-m", "torch.distributed.run"]
    assert torchrun[-3:] == ["train.py", "--lr", "3e-4"]


def test_the_container_directive_is_refused_for_multi_node_rules_and_the_launcher():
    with pytest.raises(RequestError) as err:
        refuse_container_directive("train", "docker://pytorch/pytorch:2.3.0", 2, "python train.py")
    assert "rule 'train': the container: directive ('docker://pytorch/pytorch:2.3.0')" in str(err.value)
    assert "`container: {runtime: apptainer, image: docker://pytorch/pytorch:2.3.0}`" in str(err.value)
    with pytest.raises(RequestError):
        refuse_container_directive("one", "x.sif", 1, "multinode torchrun train.py")
    refuse_container_directive("prep", "x.sif", 1, "python prep.py")  # one node, no launcher: Snakemake's business
