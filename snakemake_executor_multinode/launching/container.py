"""Containers: each node's torchrun runs inside an image (pyxis, apptainer/singularity or podman).

An environment profile's `container:` key (validated by `parse`) becomes MULTINODE_CONTAINER_* variables in the job
script (`env_lines`); `multinode torchrun` reads them back (`from_env`; a hand-written sbatch script may set them
too) and `wrap` turns each node's torchrun into the runtime's command. Only the per-node launch is wrapped: the job
script's head-node part (node discovery, markers, requeue) and the launcher itself stay outside the image.

- pyxis: srun flags (`--container-image/-mounts/-workdir`); the whole task (`bash -c`) then runs in the image.
- apptainer/singularity: `apptainer exec [--nv] --bind ... --pwd ... IMAGE sh -c 'trap "" USR2; exec "$@"' ...`;
  the container shares the node's PID namespace, so SLURM's signals reach the workers directly.
- podman: `podman run --rm --network=host --ipc=host ...` with the GPU devices (CDI or /dev/nvidia*), the job's
  variables passed by name, the caller's uid. The container has its own PID namespace and is not SLURM's child
  (conmon), so its PID 1 is a small relay (RELAY): USR2 goes to every process in the container (the agent ignores
  it, the workers checkpoint), TERM/INT to torchrun's agent.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from snakemake_executor_multinode.contract import protocol

RUNTIMES = ("pyxis", "apptainer", "singularity", "podman")
KEYS = ("runtime", "image", "mounts", "flags", "workdir", "python", "gpus", "env")
# GPU modes per runtime. auto: the runtime's GPU flags when the job has GPUs on each node (podman: CDI).
GPU_MODES = {
    "pyxis": ("auto",),  # enroot's NVIDIA hook exposes the job's GPUs itself
    "apptainer": ("auto", "none"),
    "singularity": ("auto", "none"),
    "podman": ("auto", "cdi", "devices", "none"),
}
# Options the launcher sets itself: a user value would break the launch, so it is refused (with the key to use).
OWNED_FLAGS = {
    "pyxis": ("--container-image", "--container-mounts", "--container-workdir"),
    "apptainer": ("--bind", "-B", "--pwd", "--nv", "--mount"),
    "podman": (
        "--rm",
        "--network",
        "--net",
        "--ipc",
        "--workdir",
        "-w",
        "--volume",
        "-v",
        "--mount",
        "--device",
        "--detach",
        "-d",
        "--tty",
        "-t",
        "--init",
        "--sig-proxy",
        "--user",
        "-u",
        "--userns",
        "--name",
    ),
}
OWNED_FLAGS["singularity"] = OWNED_FLAGS["apptainer"]
USE_INSTEAD = {
    "--container-image": "image",
    "--container-mounts": "mounts",
    "--container-workdir": "workdir",
    "--bind": "mounts",
    "-B": "mounts",
    "--mount": "mounts",
    "--volume": "mounts",
    "-v": "mounts",
    "--pwd": "workdir",
    "--workdir": "workdir",
    "-w": "workdir",
    "--nv": "gpus",
    "--device": "gpus (or mounts)",
}
# Variables podman passes into the container by name (apptainer and pyxis pass the whole environment): the
# rendezvous, the launcher's and SLURM's, the NCCL/torch/gloo tuning, threads and GPU selection.
PASS_ENV = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODELIST",
    "NODE_NUM",
    "CUDA_VISIBLE_DEVICES",
    "PYTORCH_CUDA_ALLOC_CONF",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "MULTINODE_*",
    "SLURM_*",
    "SLURMD_*",
    "NCCL_*",
    "TORCH_*",
    "GLOO_*",
)
# PID 1 of a podman container (POSIX sh; "$@" is torchrun). PID 1 ignores signals it has no handler for, and the
# container is outside SLURM's process tree: SLURM's USR2 reaches podman, whose signal proxy sends it here.
RELAY = (
    "trap 'kill -USR2 -1 2>/dev/null' USR2; "  # every other process in the container: the workers checkpoint
    "trap 'kill -TERM \"$c\" 2>/dev/null' TERM INT; "  # torchrun's agent stops its workers
    '(trap "" USR2; exec "$@") & c=$!; r=0; '  # the agent starts with USR2 ignored, as outside a container
    'while kill -0 "$c" 2>/dev/null; do wait "$c"; r=$?; done; '  # a trapped signal interrupts wait: wait again
    'wait "$c" 2>/dev/null; s=$?; [ "$s" = 127 ] && s=$r; exit "$s"'
)
# apptainer: the agent's USR2 ignore is set inside the image, whatever the runtime's starter does with signals.
IGNORE_USR2 = 'trap "" USR2; exec "$@"'

_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\*?$")
_PATH = re.compile(r"^/[^\s,:]*$")  # absolute, and no separator the runtimes' mount syntax uses
_WORD = re.compile(r"^[^\s\x00-\x1f\x7f]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class ContainerError(ValueError):
    """A container setting that cannot be used; the message names where it came from, the key and what is allowed."""


@dataclass(frozen=True)
class ContainerSpec:
    runtime: str  # pyxis | apptainer | singularity | podman
    image: str
    mounts: tuple[str, ...] = ()  # SRC[:DST[:ro|rw]]; the job's working directory is always mounted too
    flags: tuple[str, ...] = ()  # extra options: srun's --container-* (pyxis), `exec`'s, `run`'s
    workdir: str | None = None  # None: the job's working directory, at the same path
    python: str = "python3"  # the interpreter inside the image that starts torchrun
    gpus: str = "auto"
    env: tuple[str, ...] = ()  # podman: more variables (NAME or PREFIX*) to pass in


@dataclass(frozen=True)
class Wrapped:
    srun_flags: list[str]  # added to the launcher's srun step (pyxis)
    argv: list[str]  # what each node's task execs


def parse(value: Any, where: str) -> ContainerSpec | None:
    """A profile's `container:` value -> a spec (None: no container, also `container: null` over a parent's)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ContainerError(f"{where}: must be a mapping with keys {', '.join(KEYS)} (runtime and image required)")
    unknown = sorted(set(map(str, value)) - set(KEYS))
    if unknown:
        raise ContainerError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(KEYS)}")
    runtime = value.get("runtime")
    if runtime not in RUNTIMES:
        raise ContainerError(f"{where}.runtime: {runtime!r} is not a container runtime; allowed: {', '.join(RUNTIMES)}")
    image = value.get("image")
    if not isinstance(image, str) or not _WORD.match(image) or image.startswith("-"):
        raise ContainerError(
            f"{where}.image: {image!r} is invalid: an image reference or path (one word, not an option), e.g. "
            + {
                "pyxis": "'nvcr.io#nvidia/pytorch:24.05-py3' or /shared/images/pytorch.sqsh",
                "podman": "'localhost/train:1' or 'docker.io/pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime'",
            }.get(runtime, "/shared/images/train.sif or 'docker://pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime'")
        )
    mounts = _strings(value.get("mounts"), f"{where}.mounts")
    for mount in mounts:
        _check_mount(mount, f"{where}.mounts")
    flags = _strings(value.get("flags"), f"{where}.flags")
    for flag in flags:
        _check_flag(runtime, flag, f"{where}.flags")
    workdir = value.get("workdir")
    if workdir is not None and not (isinstance(workdir, str) and _PATH.match(workdir)):
        raise ContainerError(f"{where}.workdir: {workdir!r} is invalid: an absolute path without spaces, ',' or ':'")
    python = value.get("python", "python3")
    if not isinstance(python, str) or not _WORD.match(python) or python.startswith("-"):
        raise ContainerError(
            f"{where}.python: {python!r} is invalid: the image's interpreter, e.g. python3 or /usr/bin/python"
        )
    gpus = value.get("gpus", "auto")
    if gpus not in GPU_MODES[runtime]:
        raise ContainerError(
            f"{where}.gpus: {gpus!r} is invalid for runtime {runtime}; allowed: {', '.join(GPU_MODES[runtime])}"
        )
    env = _strings(value.get("env"), f"{where}.env")
    for name in env:
        if not _VAR.match(name):
            raise ContainerError(f"{where}.env: {name!r} is invalid: a variable name, or a prefix ending in * (NCCL_*)")
    if env and runtime != "podman":
        raise ContainerError(f"{where}.env: only for runtime podman ({runtime} passes the whole environment)")
    return ContainerSpec(runtime, image, mounts, flags, workdir, python, gpus, env)


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not (isinstance(value, list) and all(isinstance(x, str) for x in value)):
        raise ContainerError(f"{where}: must be a list of strings")
    return tuple(value)


def _check_mount(mount: str, where: str) -> None:
    parts = mount.split(":")
    ok = 1 <= len(parts) <= 3 and all(_PATH.match(p) for p in parts[:2])
    if len(parts) == 3 and parts[2] not in ("ro", "rw"):
        ok = False
    if not ok:
        raise ContainerError(
            f"{where}: {mount!r} is invalid: SRC[:DST[:ro|rw]] with absolute paths without spaces, ',' or ':' "
            "(e.g. /data:/data:ro)"
        )


def _check_flag(runtime: str, flag: str, where: str) -> None:
    if not flag.startswith("-") or _CONTROL.search(flag):
        raise ContainerError(f"{where}: {flag!r} is invalid: one option per item, e.g. '--option=value'")
    name = flag.split("=", 1)[0]
    if runtime == "pyxis" and not name.startswith(("--container-", "--no-container-")):
        raise ContainerError(
            f"{where}: {flag!r} is invalid for pyxis: only srun's --container-*/--no-container-* options "
            "(the launcher's srun step owns the others)"
        )
    if name in OWNED_FLAGS[runtime]:
        instead = f"; use the key `{USE_INSTEAD[name]}`" if name in USE_INSTEAD else ""
        raise ContainerError(f"{where}: {name} is set by the launcher for {runtime}{instead}")


# --- the job script's variables ----------------------------------------------------------------------------------

_FIELDS = {
    "runtime": protocol.CONTAINER_RUNTIME_VAR,
    "image": protocol.CONTAINER_IMAGE_VAR,
    "mounts": protocol.CONTAINER_MOUNTS_VAR,
    "flags": protocol.CONTAINER_FLAGS_VAR,
    "workdir": protocol.CONTAINER_WORKDIR_VAR,
    "python": protocol.CONTAINER_PYTHON_VAR,
    "gpus": protocol.CONTAINER_GPUS_VAR,
    "env": protocol.CONTAINER_ENV_VAR,
}


def variables(spec: ContainerSpec, env_names: Sequence[str] = ()) -> dict[str, str]:
    """The MULTINODE_CONTAINER_* values for `spec`: lists are space-separated words (flags: shell words).
    `env_names`: the profile's own variables, which podman passes in by name too."""
    names = [n for n in dict.fromkeys([*spec.env, *env_names]) if not _passed(n)]
    values = {
        "runtime": spec.runtime,
        "image": spec.image,
        "mounts": " ".join(spec.mounts),
        "flags": shlex.join(spec.flags),
        "workdir": spec.workdir or "",
        "python": spec.python,
        "gpus": spec.gpus,
        "env": " ".join(names) if spec.runtime == "podman" else "",
    }
    return {_FIELDS[k]: v for k, v in values.items() if v}


def env_lines(spec: ContainerSpec, env_names: Sequence[str], quote: Any) -> list[str]:
    """Job-script lines (environment section) that tell `multinode torchrun` the container."""
    return [
        f"# container ({spec.runtime}): `multinode torchrun` runs each node's torchrun in it; this script does not",
        *(f"export {k}={quote(v)}" for k, v in variables(spec, env_names).items()),
    ]


def from_env(env: Mapping[str, str]) -> ContainerSpec | None:
    """The spec the job script (or a hand-written one) exported; None when MULTINODE_CONTAINER_RUNTIME is unset.
    Invalid values end the launcher (SystemExit) with the variable's key and what is allowed."""
    if not env.get(protocol.CONTAINER_RUNTIME_VAR):
        return None
    raw: dict[str, Any] = {}
    for key, var in _FIELDS.items():
        if (value := env.get(var)) is None or value == "":
            continue
        if key == "flags":
            raw[key] = shlex.split(value)
        elif key in ("mounts", "env"):
            raw[key] = value.split()
        else:
            raw[key] = value
    try:
        return parse(raw, "the job's MULTINODE_CONTAINER_* variables: container")
    except ContainerError as err:  # the launcher's user sees a message, not a stack
        raise SystemExit(f"multinode torchrun: {err}") from err


def _passed(name: str) -> bool:
    """Whether podman passes `name` in anyway (PASS_ENV, prefixes included)."""
    return any(name == p or (p.endswith("*") and name.startswith(p[:-1])) for p in PASS_ENV)


# --- the per-node command ----------------------------------------------------------------------------------------


def wrap(
    spec: ContainerSpec | None,
    torchrun: Sequence[str],
    *,
    workdir: str,
    gpus_per_node: int,
    uid: int | None = None,
    dev_glob: str = "/dev/nvidia*",
) -> Wrapped:
    """`torchrun` (an argv whose first word is the interpreter; launch.py builds it with spec.python) as each node
    runs it in `spec`'s runtime. `workdir`: the job's working directory (mounted at the same path); `uid`: the
    caller's (decided on the head node, as are the GPU devices: the nodes of a job are alike)."""
    if spec is None:
        return Wrapped([], list(torchrun))
    wd = spec.workdir or workdir
    # The node's labeller (nodelog.py, outside the image) reads the ranks' files torchrun writes under the temp dir.
    tmp = tempfile.gettempdir()
    mounts = _unique([f"{workdir}:{workdir}", *spec.mounts, *([f"{tmp}:{tmp}"] if spec.runtime == "podman" else [])])
    gpus = spec.gpus != "none" and gpus_per_node > 0
    if spec.runtime == "pyxis":
        srun = [
            f"--container-image={spec.image}",
            f"--container-mounts={','.join(mounts)}",
            f"--container-workdir={wd}",
            *spec.flags,
        ]
        return Wrapped(srun, list(torchrun))
    if spec.runtime in ("apptainer", "singularity"):
        cmd = [spec.runtime, "exec", *(["--nv"] if gpus else [])]
        for mount in mounts:
            cmd += ["--bind", mount]
        cmd += ["--pwd", wd, *spec.flags, spec.image, "sh", "-c", IGNORE_USR2, "multinode-agent"]
        return Wrapped([], [*cmd, *torchrun])
    uid = os.geteuid() if uid is None else uid
    cmd = ["podman", "run", "--rm", "--network=host", "--ipc=host"]
    if uid != 0:  # rootless podman: the caller's own ids inside, so what the job writes in the workdir is theirs
        cmd.append("--userns=keep-id")
    cmd += [f"--env={name}" for name in dict.fromkeys([*PASS_ENV, *spec.env])]
    for mount in mounts:
        cmd.append(f"--volume={mount}")
    cmd.append(f"--workdir={wd}")
    if gpus and spec.gpus in ("auto", "cdi"):
        cmd.append("--device=nvidia.com/gpu=all")  # CDI (nvidia-ctk cdi generate): devices and driver libraries
    elif gpus and spec.gpus == "devices":
        cmd += [f"--device={dev}" for dev in sorted(glob.glob(dev_glob)) if not os.path.isdir(dev)]
    cmd += [*spec.flags, spec.image, "sh", "-c", RELAY, "multinode-agent"]
    return Wrapped([], [*cmd, *torchrun])


def _unique(mounts: Sequence[str]) -> list[str]:
    """One mount per destination (the first wins): a runtime refuses two mounts on one path."""
    seen: dict[str, str] = {}
    for mount in mounts:
        parts = mount.split(":")
        seen.setdefault(parts[1] if len(parts) > 1 else parts[0], mount)
    return list(seen.values())


def python(spec: ContainerSpec | None, default: str) -> str:
    """The interpreter that starts torchrun: the image's inside a container, else `default`."""
    return spec.python if spec is not None else default


# Where pyxis sees this package: the whole task runs in the image there, the node's labeller (nodelog.py) included,
# so the launcher's own package is mounted read-only and imported from there (its child, torchrun, never sees it).
PYXIS_PACKAGE_DIR = "/opt/multinode-launcher"
_LABELLER = "snakemake_executor_multinode.launching.nodelog"


def node_task(
    spec: ContainerSpec | None,
    torchrun: Sequence[str],
    labelled: Callable[[list[str]], list[str]],
    *,
    workdir: str,
    gpus_per_node: int,
) -> Wrapped:
    """What each node of the launcher's step runs: the node's labeller (`labelled`, nodelog.py) around torchrun in
    the image. podman/apptainer: the labeller runs on the node, around the runtime's command. pyxis puts the whole
    task in the image: the labeller runs there with the image's interpreter, from a read-only mount of this
    package, and the step gets pyxis's srun flags."""
    boxed = wrap(spec, torchrun, workdir=workdir, gpus_per_node=gpus_per_node)
    task = labelled(boxed.argv)
    if spec is None or spec.runtime != "pyxis" or _LABELLER not in task:
        return Wrapped(boxed.srun_flags, task)
    at = task.index(_LABELLER)
    package = os.path.dirname(os.path.abspath(__file__))
    boot = (
        f"import sys; sys.path.insert(0, {PYXIS_PACKAGE_DIR!r}); "
        f"from {_LABELLER} import main; sys.exit(main(sys.argv[1:]))"
    )
    mount = f"{package}:{PYXIS_PACKAGE_DIR}/{os.path.basename(package)}:ro"
    srun = [f"{f},{mount}" if f.startswith("--container-mounts=") else f for f in boxed.srun_flags]
    return Wrapped(srun, [spec.python, "-c", boot, *task[at + 1 :]])


def describe(spec: ContainerSpec) -> str:
    """One line for the launcher's log."""
    return f"{spec.runtime} image {spec.image}"
