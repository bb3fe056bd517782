"""Containers: each node's torchrun runs inside an image (pyxis, apptainer/singularity or podman).

An environment profile's `container:` key (contract/container_spec.py: validated by `parse`) becomes
MULTINODE_CONTAINER_* variables in the job script (`env_lines`); `multinode torchrun` reads them back (`from_env`; a
hand-written sbatch script may set them too) and `wrap` turns each node's torchrun into the runtime's command. Only
the per-node launch is wrapped: the job script's head-node part (node discovery, markers, requeue) and the launcher
itself stay outside the image.

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
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from snakemake_executor_multinode.contract.container_spec import PASS_ENV, ContainerError, ContainerSpec, read_variables


@dataclass(frozen=True)
class Wrapped:
    srun_flags: list[str]  # added to the launcher's srun step (pyxis)
    argv: list[str]  # what each node's task execs


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


def from_env(env: Mapping[str, str]) -> ContainerSpec | None:
    """The spec the job script (or a hand-written one) exported (container_spec.read_variables); None when
    MULTINODE_CONTAINER_RUNTIME is unset. Invalid values end the launcher (SystemExit) with the variable's key and
    what is allowed."""
    try:
        return read_variables(env)
    except ContainerError as err:  # the launcher's user sees a message, not a stack
        raise SystemExit(f"multinode torchrun: {err}") from err


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
    """`torchrun` (an argv whose first word is the interpreter; launcher.py builds it with spec.python) as each node
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
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the whole package: the labeller imports it
    boot = (
        f"import sys; sys.path.insert(0, {PYXIS_PACKAGE_DIR!r}); "
        f"from {_LABELLER} import main; sys.exit(main(sys.argv[1:]))"
    )
    mount = f"{package}:{PYXIS_PACKAGE_DIR}/{os.path.basename(package)}:ro"
    srun = [f"{f},{mount}" if f.startswith("--container-mounts=") else f for f in boxed.srun_flags]
    return Wrapped(srun, [spec.python, "-c", boot, *task[at + 1 :]])
