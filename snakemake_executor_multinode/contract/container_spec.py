"""A profile's `container:` key: what it may say (`parse`, whose errors name the key and what is allowed), and the
MULTINODE_CONTAINER_* variables that carry it from the job script to the launcher: written by `env_lines` when
planning, read back by `read_variables` on the nodes (launching/container.py builds the runtime's command from it).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
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


def read_variables(env: Mapping[str, str]) -> ContainerSpec | None:
    """The spec the job script (or a hand-written one) exported; None when MULTINODE_CONTAINER_RUNTIME is unset.
    ContainerError for invalid values, naming the variable's key and what is allowed."""
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
    return parse(raw, "the job's MULTINODE_CONTAINER_* variables: container")


def _passed(name: str) -> bool:
    """Whether podman passes `name` in anyway (PASS_ENV, prefixes included)."""
    return any(name == p or (p.endswith("*") and name.startswith(p[:-1])) for p in PASS_ENV)


def describe(spec: ContainerSpec) -> str:
    """One line for the launcher's log."""
    return f"{spec.runtime} image {spec.image}"
