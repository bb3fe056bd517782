"""YAML environment profiles -> the ordered shell lines a job runs before the rule's command.

The order matters and follows the seed recipe: modules, CUDA (PATH extended, LD_LIBRARY_PATH and CUDA_HOME
replaced so two CUDA versions never mix), conda or venv activation, raw setup lines, NCCL/InfiniBand variables,
then plain variables. Every value is shell-quoted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from snakemake_executor_multinode.contract import container_spec
from snakemake_executor_multinode.contract.jobfiles import ShellJobFiles
from snakemake_executor_multinode.contract.protocol import (
    LOG_STEM_VAR,
    NETWORK_CHECK_DEFAULT_S,
    NETWORK_CHECK_VAR,
    NODE_CHECK_COMMAND_VAR,
    NODE_CHECK_DEFAULT_S,
    NODE_CHECK_TIMEOUT_VAR,
    NODE_CHECK_VAR,
)
from snakemake_executor_multinode.planning.launcher_resources import PROFILE_RESOURCES
from snakemake_executor_multinode.planning.quoting import shell_quote

DEFAULT_VARS = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PROFILE_KEYS = {
    "extends", "cuda", "modules", "conda", "venv", "setup", "nccl", "env", "container", "network_check",
    "node_check",
    *PROFILE_RESOURCES,  # read by the request, like a rule's resources of the same names
}  # fmt: skip
# profile key -> NCCL variable; booleans become 1/0 (ib is inverted: NCCL_IB_DISABLE).
NCCL_KEYS = {
    "socket_ifname": "NCCL_SOCKET_IFNAME",
    "hca": "NCCL_IB_HCA",
    "gid_index": "NCCL_IB_GID_INDEX",
    "tc": "NCCL_IB_TC",
    "ib_timeout": "NCCL_IB_TIMEOUT",
    "gdr_level": "NCCL_NET_GDR_LEVEL",
    "async_error_handling": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "launch_mode": "NCCL_LAUNCH_MODE",
    "min_nrings": "NCCL_MIN_NRINGS",
    "debug": "NCCL_DEBUG",
    "debug_subsys": "NCCL_DEBUG_SUBSYS",
    "nvls_enable": "NCCL_NVLS_ENABLE",
    "p2p_level": "NCCL_P2P_LEVEL",
    "algo": "NCCL_ALGO",
    "proto": "NCCL_PROTO",
    "cross_nic": "NCCL_CROSS_NIC",
    # torch's flight recorder: the last N collectives of every rank, dumped when a collective times out
    "trace_buffer_size": "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "dump_on_timeout": "TORCH_NCCL_DUMP_ON_TIMEOUT",
}
# Where the flight recorder writes each rank's dump (<prefix><rank>): beside the job's log, whose stem the job script
# exported before the environment section (relative to the submit folder, the working directory).
FLIGHT_RECORDER_FILE = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
FLIGHT_RECORDER_PREFIX = ShellJobFiles(f'"$SLURM_SUBMIT_DIR/${LOG_STEM_VAR}"').nccl_traces
TORCH_NCCL_VARIABLES = (*(v for v in NCCL_KEYS.values() if v.startswith("TORCH_")), FLIGHT_RECORDER_FILE)


class EnvProfileError(ValueError):
    """A profile file that cannot be used; the message names the file and the key."""


@dataclass
class ProfileSet:
    """All known profiles (built-in first, the user's file over them) and the default choice."""

    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    default: str | None = None

    @property
    def names(self) -> set[str]:
        return set(self.profiles)


def split_selection(selection: str | None) -> list[str]:
    return [s.strip() for s in (selection or "").split(",") if s.strip()]


def select(profiles: ProfileSet, selection: str, where: str) -> str:
    """The validated form of a selection like "infiniband, debug" (applied left to right): "infiniband,debug".

    The one place that decides whether a selection is valid; `where` names the setting or resource for the error."""
    names = split_selection(selection)
    unknown = [name for name in names if name not in profiles.profiles]
    if unknown or not names:
        raise EnvProfileError(
            f"{where}={selection!r}: unknown environment profile {', '.join(map(repr, unknown)) or '(empty)'}; "
            f"defined: {', '.join(sorted(profiles.names)) or '(none)'}"
        )
    return ",".join(names)


def load_profiles(path: str | Path | None = None) -> ProfileSet:
    builtin = resources.files(__package__).joinpath("profiles", "builtin.yaml")
    result = ProfileSet()
    _merge(result, builtin.read_text(), "built-in profiles")
    if path:
        p = Path(path)
        if not p.is_file():
            raise EnvProfileError(f"{p}: environment profile file not found")
        _merge(result, p.read_text(), str(p))
    return result


def _merge(into: ProfileSet, text: str, source: str) -> None:
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise EnvProfileError(f"{source}: not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise EnvProfileError(f"{source}: the top level must be a mapping with 'profiles' (and 'default')")
    unknown = set(data) - {"profiles", "default"}
    if unknown:
        raise EnvProfileError(f"{source}: unknown top-level key(s) {sorted(unknown)}; allowed: profiles, default")
    profiles = data.get("profiles") or {}
    if not isinstance(profiles, dict):
        raise EnvProfileError(f"{source}: 'profiles' must be a mapping of name -> profile")
    for name, body in profiles.items():
        where = f"{source}: profiles.{name}"
        if not isinstance(body, dict):
            raise EnvProfileError(f"{where}: must be a mapping of keys {sorted(PROFILE_KEYS)}")
        _check_profile(body, where)
        into.profiles[str(name)] = body
        into.sources[str(name)] = where
    if data.get("default") is not None:
        into.default = str(data["default"])
    for name in split_selection(into.default):
        if name not in into.profiles:
            raise EnvProfileError(f"{source}: default: profile {name!r} is not defined")
    for name, body in into.profiles.items():
        parent = body.get("extends")
        if parent is not None and parent not in into.profiles:
            raise EnvProfileError(f"{into.sources[name]}.extends: profile {parent!r} is not defined")


def _holds_nul(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_nul(v) for v in value)
    return isinstance(value, str) and "\x00" in value


def _check_profile(body: dict[str, Any], where: str) -> None:
    if _holds_nul(body):
        raise EnvProfileError(f"{where}: a value holds a NUL character, which no shell variable can carry")
    unknown = set(body) - PROFILE_KEYS
    if unknown:
        raise EnvProfileError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(PROFILE_KEYS)}")
    for key in ("cuda", "venv", "extends"):
        if key in body and not isinstance(body[key], str):
            raise EnvProfileError(f"{where}.{key}: must be a string")
    for key in ("modules", "setup"):
        if key in body and not (isinstance(body[key], list) and all(isinstance(x, str) for x in body[key])):
            raise EnvProfileError(f"{where}.{key}: must be a list of strings")
    if "conda" in body:
        conda = body["conda"]
        if not (isinstance(conda, dict) and isinstance(conda.get("env"), str) and set(conda) <= {"base", "env"}):
            raise EnvProfileError(f"{where}.conda: must be {{env: NAME_OR_PATH, base: /path/to/anaconda3}}")
    if "container" in body:  # container_spec.py owns its keys and their errors
        try:
            container_spec.parse(body["container"], f"{where}.container")
        except container_spec.ContainerError as err:
            raise EnvProfileError(str(err)) from err
    if "network_check" in body:
        network_check_seconds(body["network_check"], f"{where}.network_check")
    if "node_check" in body:
        node_check(body["node_check"], f"{where}.node_check")
    for key in ("nccl", "env"):
        if key in body and not isinstance(body[key], dict):
            raise EnvProfileError(f"{where}.{key}: must be a mapping")
    for key in body.get("nccl", {}) or {}:
        if key != "ib" and key not in NCCL_KEYS:
            raise EnvProfileError(f"{where}.nccl.{key}: unknown; allowed: ib, {', '.join(sorted(NCCL_KEYS))}")
    for var, value in (body.get("env") or {}).items():
        if not _VAR.match(str(var)):
            raise EnvProfileError(f"{where}.env.{var}: not a valid environment variable name")
        if isinstance(value, dict | list):
            raise EnvProfileError(f"{where}.env.{var}: must be a string or number")


NETWORK_CHECK_MAX_S = 3600


def network_check_seconds(value: Any, where: str = "network_check") -> int:
    """`network_check: true | false | {timeout: SECONDS}` -> the preflight's limit in seconds, 0 for off."""
    allowed = f"allowed: true, false or {{timeout: SECONDS}} (1-{NETWORK_CHECK_MAX_S}; true means {{timeout: 60}})"
    if isinstance(value, bool):
        return NETWORK_CHECK_DEFAULT_S if value else 0
    if not isinstance(value, dict):
        raise EnvProfileError(f"{where}: {value!r} is not valid; {allowed}")
    if set(value) - {"timeout"}:
        raise EnvProfileError(f"{where}: unknown key(s) {sorted(map(str, set(value) - {'timeout'}))}; {allowed}")
    timeout = value.get("timeout", NETWORK_CHECK_DEFAULT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 1 <= timeout <= NETWORK_CHECK_MAX_S:
        raise EnvProfileError(f"{where}.timeout: {timeout!r} is not valid; {allowed}")
    return timeout


NODE_CHECK_MAX_S = 3600


@dataclass(frozen=True)
class NodeCheck:
    """The profile's `node_check`: whether every node is checked before each launch, and the site's own command."""

    on: bool = True
    command: str = ""
    timeout: int = NODE_CHECK_DEFAULT_S


def node_check(value: Any, where: str = "node_check") -> NodeCheck:
    """`node_check: true | false | {command: "SHELL COMMAND", timeout: SECONDS}` -> the check it asks for; true (and
    an absent key) is the default check: the node's GPUs visible, where nvidia-smi exists."""
    allowed = (
        f"allowed: true, false or {{command: SHELL_COMMAND, timeout: SECONDS}} (both optional; timeout "
        f"1-{NODE_CHECK_MAX_S}, default {NODE_CHECK_DEFAULT_S})"
    )
    if isinstance(value, bool):
        return NodeCheck(on=value)
    if not isinstance(value, dict):
        raise EnvProfileError(f"{where}: {value!r} is not valid; {allowed}")
    if unknown := set(map(str, value)) - {"command", "timeout"}:
        raise EnvProfileError(f"{where}: unknown key(s) {sorted(unknown)}; {allowed}")
    command = value.get("command", "")
    if not isinstance(command, str) or (not command.strip() and "command" in value):
        raise EnvProfileError(f"{where}.command: {command!r} is not valid: must be a non-empty string; {allowed}")
    timeout = value.get("timeout", NODE_CHECK_DEFAULT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 1 <= timeout <= NODE_CHECK_MAX_S:
        raise EnvProfileError(f"{where}.timeout: {timeout!r} is not valid; {allowed}")
    return NodeCheck(on=True, command=command, timeout=timeout)


def node_check_lines(check: NodeCheck) -> list[str]:
    """The node check's exports: all three, so that none is inherited from the submitting shell (--export=ALL)."""
    said = "its GPUs visible" + (" and the profile's command" if check.command else "")
    return [
        f"# node check: every node before each launch, {said} (docs/further.md)" if check.on else "# node check: off",
        f"export {NODE_CHECK_VAR}={int(check.on)}",
        f"export {NODE_CHECK_COMMAND_VAR}={shell_quote(check.command)}",
        f"export {NODE_CHECK_TIMEOUT_VAR}={check.timeout}",
    ]


def resolve(profiles: ProfileSet, selection: str | None) -> dict[str, Any]:
    """Flatten the selected profiles (with `extends`) into one; later ones win key by key. A null under nccl or env
    unsets what an earlier profile of the chain set (a built-in's site-specific value); unsetting what none set is
    an error, as it is most likely a misspelt key."""
    merged: dict[str, Any] = {}
    for name in split_selection(selection or profiles.default):
        if name not in profiles.profiles:
            raise EnvProfileError(f"unknown environment profile {name!r}; defined: {sorted(profiles.names)}")
        for layer_name in _chain(profiles, name):
            for key, value in profiles.profiles[layer_name].items():
                if key == "extends":
                    continue
                if key in ("nccl", "env"):
                    section = {**merged.get(key, {})}
                    for sub, sub_value in value.items():
                        if sub_value is not None:
                            section[sub] = sub_value
                        elif section.pop(sub, None) is None:
                            raise EnvProfileError(
                                f"{profiles.sources[layer_name]}.{key}.{sub}: null unsets {key}.{sub}, but no "
                                f"profile before it in {selection or profiles.default!r} sets it"
                            )
                    merged[key] = section
                elif key in ("modules", "setup"):
                    merged[key] = [*merged.get(key, []), *value]
                else:
                    merged[key] = value
    return merged


def _chain(profiles: ProfileSet, name: str | None) -> list[str]:
    """`name` and the profiles it extends, the farthest first."""
    chain, seen = [], set()
    while name is not None:
        if name in seen:
            raise EnvProfileError(f"{profiles.sources[name]}.extends: cycle through {name!r}")
        seen.add(name)
        chain.append(name)
        name = profiles.profiles[name].get("extends")
    return chain[::-1]


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


# What changes the software a job runs (its Python and packages), as against the submitting side's environment that
# the job inherits (--export=ALL)
SOFTWARE_KEYS = ("modules", "cuda", "conda", "venv", "setup", "container")


def own_software(profile: dict[str, Any]) -> bool:
    """Whether a job with this flattened profile runs software of its own: then the job reads its package versions
    itself (`multinode provenance --start`), else the submission record holds the submitting side's."""
    env = {str(k) for k in profile.get("env") or {}}
    return any(profile.get(k) for k in SOFTWARE_KEYS) or any(k.endswith("PATH") or k == "PYTHONHOME" for k in env)


def nccl_variables(nccl: dict[str, Any]) -> dict[str, str]:
    """A profile's `nccl:` block as variables, in the order the job script exports them."""
    out = {"NCCL_IB_DISABLE": "0" if nccl["ib"] else "1"} if "ib" in nccl else {}
    return out | {var: _value(nccl[key]) for key, var in NCCL_KEYS.items() if key in nccl}


def plain_variables(profile: dict[str, Any]) -> dict[str, str]:
    """The profile's `env:` over the defaults every job gets."""
    return {**DEFAULT_VARS, **{str(k): _value(v) for k, v in (profile.get("env") or {}).items()}}


def render_lines(profile: dict[str, Any]) -> list[str]:
    """Shell lines, in order, for a flattened profile."""
    q = shell_quote
    lines: list[str] = []
    if profile.get("modules"):
        lines.append("# modules")
        lines += [f"module load {q(m)}" for m in profile["modules"]]
    if cuda := profile.get("cuda"):
        lines += [
            "# CUDA: PATH keeps what it had; LD_LIBRARY_PATH and CUDA_HOME are replaced so CUDA versions never mix",
            f'export PATH={q(cuda.rstrip("/") + "/bin")}:"$PATH"',
            f"export LD_LIBRARY_PATH={q(cuda.rstrip('/') + '/lib64')}",
            f"export CUDA_HOME={q(cuda.rstrip('/'))}",
        ]
    if conda := profile.get("conda"):
        lines.append("# conda environment (activated here, so the submitting shell needs none)")
        if base := conda.get("base"):
            lines.append(f"source {q(base.rstrip('/') + '/etc/profile.d/conda.sh')}")
        lines.append(f"conda activate {q(conda['env'])}")
    if venv := profile.get("venv"):
        lines += ["# virtual environment", f"source {q(venv.rstrip('/') + '/bin/activate')}"]
    if profile.get("setup"):
        lines.append("# setup lines from the profile (run as written)")
        lines += list(profile["setup"])
    nccl = profile.get("nccl") or {}
    if nccl:
        lines.append("# NCCL / InfiniBand")
        lines += [f"export {var}={q(value)}" for var, value in nccl_variables(nccl).items()]
        if nccl.get("dump_on_timeout"):
            lines.append(f"export {FLIGHT_RECORDER_FILE}={FLIGHT_RECORDER_PREFIX}  # the dumps, beside the job log")
    if "network_check" in profile:  # validated when the file was read
        seconds = network_check_seconds(profile["network_check"])
        lines.append(
            "# network preflight: one tiny all-reduce over all ranks before the training (docs/network-preflight.md)"
            if seconds
            else "# network preflight: off"
        )
        lines.append(f"export {NETWORK_CHECK_VAR}={seconds}")
    if "node_check" in profile:  # validated when the file was read; absent: the launcher's default check
        lines += node_check_lines(node_check(profile["node_check"]))
    variables = plain_variables(profile)
    lines.append("# variables")
    lines += [f"export {k}={q(v)}" for k, v in variables.items()]
    if box := container_spec.parse(profile.get("container"), "container"):  # validated when the file was read
        lines += container_spec.env_lines(box, list(variables), q)
    return lines
