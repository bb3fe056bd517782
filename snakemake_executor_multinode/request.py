"""Rule resources -> a validated JobRequest. Every bad-input error is raised here, before anything is submitted.

Resource names follow the official SLURM plugin where they exist (slurm_partition, slurm_account, runtime, mem_mb,
mem_mb_per_cpu, cpus_per_task, constraint, qos, slurm_extra) so users' profiles carry over; ours: nodes, gpus
(PER NODE), gpu_type, nodelist, exclude, signal, env_profile, master_port.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class RequestError(ValueError):
    """Bad input in a rule's resources or the plugin settings; names rule, field, value and what is allowed."""

    def __init__(self, rule: str, fieldname: str, value: Any, allowed: str) -> None:
        self.rule, self.field, self.value, self.allowed = rule, fieldname, value, allowed
        super().__init__(f"rule {rule!r}: resource {fieldname}={value!r} is invalid: {allowed}")


# Flags the job script manages itself; slurm_extra may not set them (they would silently fight ours).
MANAGED_FLAGS = {
    "-N": "nodes",
    "--nodes": "nodes",
    "-n": "nodes",
    "--ntasks": "nodes",
    "--ntasks-per-node": "nodes",
    "-c": "cpus_per_task",
    "--cpus-per-task": "cpus_per_task",
    "--cpus-per-gpu": "cpus_per_task",
    "--gres": "gpus",
    "-G": "gpus",
    "--gpus": "gpus",
    "--gpus-per-node": "gpus",
    "--gpus-per-task": "gpus",
    "-p": "slurm_partition",
    "--partition": "slurm_partition",
    "-A": "slurm_account",
    "--account": "slurm_account",
    "-t": "runtime",
    "--time": "runtime",
    "--mem": "mem_mb",
    "--mem-per-cpu": "mem_mb_per_cpu",
    "--mem-per-gpu": "mem_mb",
    "-J": "(the job name)",
    "--job-name": "(the job name)",
    "-o": "(the log path)",
    "--output": "(the log path)",
    "-e": "(the log path)",
    "--error": "(the log path)",
    "--open-mode": "(append, always)",
    "--signal": "signal",
    "--comment": "(rule and wildcards)",
    "--export": "(the environment)",
    "-D": "(the working directory)",
    "--chdir": "(the working directory)",
    "-w": "nodelist",
    "--nodelist": "nodelist",
    "-x": "exclude",
    "--exclude": "exclude",
    "-C": "constraint",
    "--constraint": "constraint",
    "-q": "qos",
    "--qos": "qos",
    "--parsable": "(submission)",
    "--wrap": "(submission)",
    "-d": "(dependencies)",
    "--dependency": "(dependencies)",
    "--requeue": "(requeue policy setting)",
    "--no-requeue": "(requeue policy setting)",
}

_SIGNAL = re.compile(r"^(?:[BR]:)?(?:SIG)?[A-Z][A-Z0-9]*(?:@\d+)?$|^(?:[BR]:)?\d+(?:@\d+)?$")
_HOSTLIST = re.compile(r"^[A-Za-z0-9_.,\[\]\-]+$")
_NAME = re.compile(r"^[A-Za-z0-9_.:+\-]+$")
_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.,&|\[\]()*:!\-]+$")
_DURATION = re.compile(
    r"^(?:(?P<d>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$"  # SLURM: [D-]HH[:MM[:SS]] or MM[:SS]
)
_HUMAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(d|h|m|min|s)?\s*$", re.I)


@dataclass(frozen=True)
class Defaults:
    """Plugin settings that fill in what a rule leaves out."""

    account: str | None = None
    partition: str | None = None
    signal: str | None = "USR2@120"
    env_profile: str | None = None
    gpu_flag: str = "gres"  # or "gpus-per-node"
    max_requeues: int = 3  # 0: never requeue (sbatch --no-requeue)


@dataclass(frozen=True)
class JobRequest:
    """Everything SLURM is asked for, validated; rendering and submission only read it."""

    rule: str
    wildcards: tuple[tuple[str, str], ...] = ()
    nodes: int = 1
    gpus: int = 0  # per node
    gpu_type: str | None = None
    gpu_flag: str = "gres"
    cpus_per_task: int = 1
    threads: int = 1
    mem_mb: int | None = None
    mem_mb_per_cpu: int | None = None
    runtime_min: int | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    nodelist: str | None = None
    exclude: str | None = None
    signal: str | None = "USR2@120"
    env_profile: str | None = None
    master_port: int | None = None
    slurm_extra: tuple[str, ...] = ()
    max_requeues: int = 3
    attempt: int = 1
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @property
    def requeue(self) -> bool:
        return self.max_requeues > 0

    @property
    def omp_threads(self) -> int:
        """OpenMP threads per worker process: the node's CPUs shared by its GPU processes."""
        return max(1, self.cpus_per_task // self.gpus) if self.gpus else self.cpus_per_task

    @property
    def wildcards_str(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.wildcards)


def parse_runtime(value: Any) -> int:
    """Minutes from an int/float (minutes), '90', '2h', '1.5d', '30m', '45s', or SLURM's [D-]HH:MM[:SS]."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int | float):
        if value <= 0:
            raise ValueError(value)
        return max(1, round(value))
    text = str(value).strip()
    if m := _HUMAN.match(text):
        number, unit = float(m.group(1)), (m.group(2) or "m").lower()
        minutes = number * {"d": 1440, "h": 60, "m": 1, "min": 1, "s": 1 / 60}[unit]
        if minutes <= 0:
            raise ValueError(value)
        return max(1, round(minutes + 0.4999))
    if m := _DURATION.match(text):
        d = int(m.group("d") or 0)
        a, b, c = (int(x) if x is not None else None for x in m.group("a", "b", "c"))
        if m.group("d"):  # D-HH[:MM[:SS]]
            minutes = d * 1440 + a * 60 + (b or 0) + ((c or 0) + 59) // 60
        elif c is not None:  # HH:MM:SS
            minutes = a * 60 + b + (c + 59) // 60
        else:  # MM:SS
            minutes = a + ((b or 0) + 59) // 60
        if minutes > 0:
            return minutes
    raise ValueError(value)


def _int(rule: str, name: str, value: Any, low: int, allowed: str) -> int:
    if isinstance(value, bool):
        raise RequestError(rule, name, value, allowed)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or value < low:
        raise RequestError(rule, name, value, allowed)
    return value


def _text(rule: str, name: str, value: Any, pattern: re.Pattern[str], allowed: str) -> str | None:
    if value is None or value == "":
        return None
    text = str(value)
    if not pattern.match(text):
        raise RequestError(rule, name, value, allowed)
    return text


def _slurm_extra(rule: str, value: Any) -> tuple[str, ...]:
    if not value:
        return ()
    try:
        tokens = shlex.split(str(value))
    except ValueError as err:
        raise RequestError(rule, "slurm_extra", value, f"must be shell-style flags ({err})") from err
    for token in tokens:
        flag = token.split("=", 1)[0]
        if not flag.startswith("-"):
            continue
        owner = MANAGED_FLAGS.get(flag) or next(
            (o for f, o in MANAGED_FLAGS.items() if len(f) == 2 and flag.startswith(f) and len(flag) > 2), None
        )
        if owner:
            raise RequestError(
                rule, "slurm_extra", value, f"{flag} is managed by the plugin; set it with {owner} instead"
            )
    return tuple(tokens)


def build_request(
    rule: str,
    resources: Mapping[str, Any],
    *,
    threads: int = 1,
    wildcards: Mapping[str, Any] | None = None,
    attempt: int = 1,
    defaults: Defaults = Defaults(),
    known_profiles: set[str] | None = None,
    declared_nodes: int | None = None,
) -> JobRequest:
    """Validate one job's resources. `declared_nodes` is what the rule itself asked for, when known: Snakemake's
    --resources nodes=N silently caps a job's nodes, and the user should hear of it."""
    r = dict(resources)
    warnings: list[str] = []
    nodes = _int(rule, "nodes", r.get("nodes", 1), 1, "a positive integer (number of nodes)")
    if isinstance(declared_nodes, int) and declared_nodes > nodes:
        warnings.append(
            f"rule {rule!r} asks for nodes={declared_nodes} but gets {nodes}: Snakemake's "
            f"--resources nodes=... caps every job; raise it or drop it to run on {declared_nodes}"
        )
    gpus = _int(rule, "gpus", r.get("gpus", r.get("gpu", 0)), 0, "a non-negative integer (GPUs PER NODE)")
    default_cpus = max(threads, gpus, 1)
    cpus = _int(
        rule,
        "cpus_per_task",
        r.get("cpus_per_task", default_cpus),
        1,
        "a positive integer (CPUs per node for the one task on each node)",
    )
    if gpus and cpus < gpus:
        raise RequestError(
            rule, "cpus_per_task", cpus, f"must be at least gpus={gpus}: each GPU process needs one CPU or more"
        )
    mem_mb = r.get("mem_mb")
    mem_mb = None if mem_mb in (None, "", 0) else _int(rule, "mem_mb", mem_mb, 1, "a positive integer (MB per node)")
    mem_cpu = r.get("mem_mb_per_cpu")
    mem_cpu = (
        None
        if mem_cpu in (None, "", 0)
        else _int(rule, "mem_mb_per_cpu", mem_cpu, 1, "a positive integer (MB per CPU)")
    )
    runtime = r.get("runtime")
    runtime_min = None
    if runtime not in (None, ""):
        try:
            runtime_min = parse_runtime(runtime)
        except ValueError as err:
            raise RequestError(
                rule,
                "runtime",
                runtime,
                "minutes (int) or a duration like '90', '2h', '1d', '30m', '1-12:00:00', '12:00:00'",
            ) from err
    # The pre-time-limit signal is for training (GPU or multi-node) jobs; in a plain job USR2's default action
    # would only end the command two minutes early.
    signal = r.get("signal", defaults.signal if nodes > 1 or gpus > 0 else None)
    if signal in ("none", "off", False):
        signal = None
    signal = _text(rule, "signal", signal, _SIGNAL, "SLURM's --signal form, e.g. USR2@120, B:USR2@90, or 'none'")
    if signal and runtime_min and "@" in signal:
        lead = int(signal.rsplit("@", 1)[1])
        # slurmctld checks every 30 s and signals once the time left is within lead (+ up to one check)
        if runtime_min * 60 <= lead + 30:
            warnings.append(
                f"rule {rule!r}: signal {signal} with runtime {runtime_min} min: the signal arrives "
                "within 30 s of every start, so a checkpoint-and-requeue job would make no progress"
            )
    env_profile = r.get("env_profile", defaults.env_profile) or None
    if env_profile is not None and known_profiles is not None:
        # "infiniband,debug" applies both, left to right
        if any(name.strip() not in known_profiles for name in str(env_profile).split(",") if name.strip()):
            raise RequestError(
                rule,
                "env_profile",
                env_profile,
                f"unknown profile; defined: {', '.join(sorted(known_profiles)) or '(none)'}",
            )
    gpu_flag = r.get("gpu_flag", defaults.gpu_flag)
    if gpu_flag not in ("gres", "gpus-per-node"):
        raise RequestError(rule, "gpu_flag", gpu_flag, "'gres' or 'gpus-per-node'")
    port = r.get("master_port")
    port = None if port in (None, "") else _int(rule, "master_port", port, 1024, "a port number 1024..65535")
    if port is not None and port > 65535:
        raise RequestError(rule, "master_port", port, "a port number 1024..65535")
    name = "a SLURM name: letters, digits and _ . : + -"
    return JobRequest(
        rule=rule,
        wildcards=tuple((str(k), str(v)) for k, v in (wildcards or {}).items()),
        nodes=nodes,
        gpus=gpus,
        gpu_type=_text(rule, "gpu_type", r.get("gpu_type"), _NAME, name),
        gpu_flag=gpu_flag,
        cpus_per_task=cpus,
        threads=threads,
        mem_mb=None if mem_cpu else mem_mb,
        mem_mb_per_cpu=mem_cpu,
        runtime_min=runtime_min,
        partition=_text(rule, "slurm_partition", r.get("slurm_partition", defaults.partition), _NAME, name),
        account=_text(rule, "slurm_account", r.get("slurm_account", defaults.account), _NAME, name),
        qos=_text(rule, "qos", r.get("qos"), _NAME, name),
        constraint=_text(
            rule,
            "constraint",
            r.get("constraint"),
            _CONSTRAINT,
            "a SLURM feature expression, e.g. 'a100&ib' or '[rack1|rack2]'",
        ),
        nodelist=_text(rule, "nodelist", r.get("nodelist"), _HOSTLIST, "a host list like node[110-111],node5"),
        exclude=_text(rule, "exclude", r.get("exclude"), _HOSTLIST, "a host list like node[110-111],node5"),
        signal=signal,
        env_profile=env_profile,
        master_port=port,
        slurm_extra=_slurm_extra(rule, r.get("slurm_extra")),
        max_requeues=max(0, defaults.max_requeues),
        attempt=attempt,
        warnings=tuple(warnings),
    )
