"""Rule resources -> a validated JobRequest. Every bad-input error is raised here, before anything is submitted.

Every resource key is known, mapped or refused (docs/resources.md has the table):
- ours: nodes, gpus (PER NODE), gpu_type, gpu_flag, cpus_per_task, mem_mb_per_cpu, slurm_partition, slurm_account,
  slurm_reservation, qos, constraint, nodelist, exclude, signal, env_profile, master_port, slurm_extra; names shared
  with the official SLURM plugin mean the same there, so profiles carry over; and the launcher's resources
  (stall_timeout, spare_nodes, ...), which launcher_resources.py reads and checks;
- Snakemake's own (mem, mem_mb, mem_mib, disk*, runtime, tmpdir, threads, and every key starting with "_");
- the official SLURM plugin's that mean something else here are mapped (gpu = GPUs per JOB, gpu_model, gres,
  cpus_per_gpu, tasks == nodes, tasks_per_node == 1) or refused with what to use instead (mpi, tasks, clusters, ...);
- anything else is an error naming close matches, unless --multinode-allow-unknown-resources.

Durations and sizes are read with Snakemake's own rules (util/units.py); slurm_extra as sbatch reads it
(slurm/sbatch_flags.py).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from snakemake_executor_multinode.planning import launcher_resources
from snakemake_executor_multinode.planning.launcher_resources import LauncherResources
from snakemake_executor_multinode.planning.resource_values import RequestError, given, read_int
from snakemake_executor_multinode.planning.settings import PlanningSettings
from snakemake_executor_multinode.slurm.sbatch_flags import ANY_RELEASE, OptionTable, parse_sbatch_flags
from snakemake_executor_multinode.util.units import mib_to_mb, parse_mem_mb, read_runtime, runtime_hint

# --- resource keys ---------------------------------------------------------------------------------------------

# Snakemake's own (snakemake 9.27 resources.py: the sized resources mem/disk with their _mb/_mib forms, which
# Snakemake expands into all three, runtime, tmpdir from --default-resources, and the internal _cores/_nodes; any key
# starting with "_" is Snakemake's). Only mem* and runtime mean something to SLURM here.
SNAKEMAKE_RESOURCES = frozenset(
    {"mem", "mem_mb", "mem_mib", "disk", "disk_mb", "disk_mib", "runtime", "tmpdir", "threads", "_cores", "_nodes"}
)
# This plugin's resources (README, "The rule interface"): SLURM's, and the launcher's (launcher_resources.py).
OWN_RESOURCES = launcher_resources.NAMES | frozenset(
    {
        "nodes",
        "gpus",
        "gpu_type",
        "gpu_flag",
        "cpus_per_task",
        "mem_mb_per_cpu",
        "slurm_partition",
        "slurm_account",
        "slurm_reservation",
        "qos",
        "constraint",
        "nodelist",
        "exclude",
        "signal",
        "env_profile",
        "master_port",
        "slurm_extra",
    }
)
# The official SLURM plugin's resources with another meaning here: mapped onto ours, or accepted where they mean
# what this plugin does anyway (see build_request and docs/resources.md).
MAPPED_RESOURCES = frozenset(
    {"gpu", "gpu_model", "gres", "cpus_per_gpu", "tasks", "tasks_per_node", "tasks_per_gpu", "mpi"}
)

_SUBMIT_HERE = (
    "multi-cluster submission is not supported: status queries and scancel would not find the job; run "
    "Snakemake on a login node of the cluster that should run it"
)
# The official plugin's (documented or read) resources this plugin refuses when set, and what to do instead.
REFUSED_RESOURCES = {
    "clusters": _SUBMIT_HERE,
    "cluster": _SUBMIT_HERE,
    "slurm_cluster": _SUBMIT_HERE,
    "slurm_requeue": (
        "requeueing is managed by the plugin: a job that checkpoints on the pre-time-limit signal requeues itself; "
        "set --multinode-max-requeues (0: never; Snakemake's --retries then reruns it)"
    ),
    "gpu_manufacturer": "SLURM does not know GPU manufacturers: use gpu_type (e.g. a100) or constraint",
}
KNOWN_RESOURCES = SNAKEMAKE_RESOURCES | OWN_RESOURCES | MAPPED_RESOURCES | frozenset(REFUSED_RESOURCES)

# Names other tools use -> ours, for "did you mean" (difflib finds typos; these are different words).
_ALIASES = {
    "gpus_per_node": "gpus",
    "gpu_per_node": "gpus",
    "gpus_per_task": "gpus",
    "num_gpus": "gpus",
    "ngpus": "gpus",
    "num_nodes": "nodes",
    "nnodes": "nodes",
    "partition": "slurm_partition",
    "account": "slurm_account",
    "reservation": "slurm_reservation",
    "time": "runtime",
    "walltime": "runtime",
    "time_min": "runtime",
    "mem_per_cpu": "mem_mb_per_cpu",
    "memory": "mem_mb",
    "cpus": "cpus_per_task",
    "ncpus": "cpus_per_task",
    "cpus_per_node": "cpus_per_task",
    "ntasks": "tasks",
    "ntasks_per_node": "tasks_per_node",
    "features": "constraint",
    "sbatch_extra": "slurm_extra",
    "port": "master_port",
}


def refuse_container_directive(rule: str, image: str, nodes: Any, command: str | None) -> None:
    """Snakemake's `container:` directive runs the rule's whole shell in the image, on the head node, where srun
    (and so `multinode torchrun`'s step) does not exist: refused for a multi-node rule or one that runs the
    launcher. The image belongs in an environment profile, whose container the launcher puts on every node."""
    try:
        many = int(nodes) > 1
    except (TypeError, ValueError):
        many = False
    if many or "multinode torchrun" in (command or ""):
        raise RequestError(
            rule,
            "container",
            image,
            message=f"rule {rule!r}: the container: directive ({image!r}) cannot run a multi-node job or `multinode "
            "torchrun`: Snakemake would run the whole rule inside the image on the head node, where srun does not "
            "exist. Drop the directive and put the image in an environment profile, selected with env_profile: "
            f"`container: {{runtime: apptainer, image: {image}}}` (or pyxis, podman); see docs/containers.md",
        )


def _one_task(per_node: Any = "N") -> str:
    return (
        "the launcher runs one task (one torchrun) per node; for "
        f"{per_node} processes per node set gpus={per_node} (torchrun starts one per GPU) or pass "
        f"--nproc_per_node={per_node} to `multinode torchrun`"
    )


_SUBMISSION = "the plugin submits with sbatch --parsable and reads the job id back"
_TASKS = "(tasks)"  # owner of the task-count flags: the message says how to get N processes per node instead
_REQUEUES = (
    "every job may be requeued by SLURM (an admin's requeue, a preemption); how often a job requeues itself after "
    "its pre-time-limit checkpoint is --multinode-max-requeues (0: never)"
)
# Flags the job script manages itself; slurm_extra may not set them (they would silently fight ours). Value: the
# resource that sets it instead, or why it is the plugin's. Short forms are listed for reference; the check runs on
# the long name every spelling resolves to (`--outp` is `--output`, `-vN3` holds `-N 3`).
MANAGED_FLAGS = {
    "-N": "nodes",
    "--nodes": "nodes",
    "-n": _TASKS,
    "--ntasks": _TASKS,
    "--ntasks-per-node": _TASKS,
    "--tasks-per-node": _TASKS,
    "--ntasks-per-core": _TASKS,
    "--ntasks-per-socket": _TASKS,
    "--ntasks-per-gpu": _TASKS,
    "--ntasks-per-tres": _TASKS,
    "-c": "cpus_per_task",
    "--cpus-per-task": "cpus_per_task",
    "--cpus-per-gpu": "cpus_per_gpu",
    "--gres": "gpus",
    "-G": "gpus",
    "--gpus": "gpus",
    "--gpus-per-node": "gpus",
    "--gpus-per-task": "gpus",
    "--gpus-per-socket": "gpus",
    "-p": "slurm_partition",
    "--partition": "slurm_partition",
    "-A": "slurm_account",
    "--account": "slurm_account",
    "--reservation": "slurm_reservation",
    "-t": "runtime",
    "--time": "runtime",
    "--mem": "mem_mb",
    "--mem-per-cpu": "mem_mb_per_cpu",
    "--mem-per-gpu": "mem_mb",
    "--signal": "signal",
    "-w": "nodelist",
    "--nodelist": "nodelist",
    "-F": "nodelist",
    "--nodefile": "nodelist",
    "-x": "exclude",
    "--exclude": "exclude",
    "-C": "constraint",
    "--constraint": "constraint",
    "-q": "qos",
    "--qos": "qos",
    "-J": "the plugin names the job (mn-<run>-<rule>)",
    "--job-name": "the plugin names the job (mn-<run>-<rule>)",
    "-o": "the plugin writes the log (one per attempt, under --multinode-logdir)",
    "--output": "the plugin writes the log (one per attempt, under --multinode-logdir)",
    "-e": "the plugin writes the log (one per attempt, under --multinode-logdir)",
    "--error": "the plugin writes the log (one per attempt, under --multinode-logdir)",
    "--open-mode": "the log is always appended to (requeued runs included)",
    "--comment": "the comment holds the rule and wildcards",
    "--export": "the job gets the submitting environment (--export=ALL) plus the env_profile",
    "--export-file": "the job gets the submitting environment (--export=ALL) plus the env_profile",
    "-D": "the job runs in Snakemake's working directory",
    "--chdir": "the job runs in Snakemake's working directory",
    "-M": _SUBMIT_HERE,
    "--clusters": _SUBMIT_HERE,
    "--cluster": _SUBMIT_HERE,
    "-a": "one SLURM job per Snakemake job: array jobs are not supported",
    "--array": "one SLURM job per Snakemake job: array jobs are not supported",
    "--parsable": _SUBMISSION,
    "--wrap": "the plugin writes the job script",
    "-W": f"{_SUBMISSION}; --wait would block it",
    "--wait": f"{_SUBMISSION}; --wait would block it",
    "--test-only": f"{_SUBMISSION}; --test-only submits nothing",
    "-h": f"{_SUBMISSION}; --help submits nothing",
    "--help": f"{_SUBMISSION}; --help submits nothing",
    "--usage": f"{_SUBMISSION}; --usage submits nothing",
    "-V": f"{_SUBMISSION}; --version submits nothing",
    "--version": f"{_SUBMISSION}; --version submits nothing",
    "-d": "dependencies are the plugin's (--immediate-submit chains jobs with afterok)",
    "--dependency": "dependencies are the plugin's (--immediate-submit chains jobs with afterok)",
    "--requeue": _REQUEUES,
    "--no-requeue": _REQUEUES,
}


def _slurm_extra(rule: str, value: Any, table: OptionTable) -> tuple[str, ...]:
    """slurm_extra -> canonical `--long[=value]` words, after refusing what sbatch would refuse and every flag the
    plugin manages."""
    if value is None or value == "":
        return ()
    try:
        options = parse_sbatch_flags(str(value), table)
    except ValueError as err:
        raise RequestError(rule, "slurm_extra", value, str(err)) from err
    out = []
    for spelled, name, arg in options:
        owner = MANAGED_FLAGS.get(f"--{name}")
        if owner:
            flag = spelled if spelled == f"--{name}" else f"{spelled} (= --{name})"
            if owner == _TASKS:
                per_node = arg if arg and arg.isdigit() and name in ("ntasks-per-node", "tasks-per-node") else "N"
                why = _one_task(per_node)
            elif owner in KNOWN_RESOURCES:
                why = f"set it with {owner} instead"
            else:
                why = owner
            raise RequestError(rule, "slurm_extra", value, f"{flag} is managed by the plugin; {why}")
        out.append(f"--{name}" if arg is None else f"--{name}={arg}")
    return tuple(out)


# --- validation helpers ------------------------------------------------------------------------------------------

_SIGNAL = re.compile(r"^(?:[BR]:)?(?:SIG)?[A-Z][A-Z0-9]*(?:@\d+)?$|^(?:[BR]:)?\d+(?:@\d+)?$")
_HOSTLIST = re.compile(r"^[A-Za-z0-9_.,\[\]\-]+$")
_NAME = re.compile(r"^[A-Za-z0-9_.:+\-]+$")
_NAMES = re.compile(r"^[A-Za-z0-9_.:+\-]+(?:,[A-Za-z0-9_.:+\-]+)*$")
_GPU_TYPE = re.compile(r"^[A-Za-z0-9_.\-]+$")
_GRES_GPU = re.compile(r"^gpu(?::(?P<type>[A-Za-z0-9_.\-]+))?(?::(?P<count>\d+))?$")
_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.,&|\[\]()*:!\-]+$")


DEFAULTS = PlanningSettings()  # what a rule leaves out, when no plugin setting is given


@dataclass(frozen=True)
class JobRequest:
    """Everything SLURM is asked for, validated; rendering and submission only read it."""

    rule: str
    wildcards: tuple[tuple[str, str], ...] = ()
    nodes: int = 1
    gpus: int = 0  # per node
    gpu_type: str | None = None
    gpu_flag: str = PlanningSettings.gpu_flag
    cpus_per_task: int = 1
    threads: int = 1
    mem_mb: int | None = None
    mem_mb_per_cpu: int | None = None
    runtime_min: int | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    reservation: str | None = None
    constraint: str | None = None
    nodelist: str | None = None
    exclude: str | None = None
    signal: str | None = PlanningSettings.signal
    env_profile: str | None = None
    master_port: int | None = None
    slurm_extra: tuple[str, ...] = ()
    max_requeues: int = PlanningSettings.max_requeues
    # quick failures in a row that end a requeued job (0: no bound); "quick": within crash_loop_s of the run's start
    crash_loop_runs: int = PlanningSettings.crash_loop_runs
    crash_loop_s: int = int(PlanningSettings.crash_loop_seconds)
    launcher: LauncherResources = LauncherResources()  # what `multinode torchrun` is told (launcher_resources.py)
    attempt: int = 1
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def launcher_variables(self) -> dict[str, str]:
        """What `multinode torchrun` reads of this job's resources; the job script exports each."""
        return self.launcher.variables(self.nodes, self.crash_loop_runs)

    @property
    def spare_nodes(self) -> int:
        """The launcher's spares, which SLURM allocates beside the training's nodes."""
        return self.launcher.spare_nodes

    @property
    def allocated_nodes(self) -> int:
        """What SLURM is asked for: the training's nodes and the spares."""
        return self.nodes + self.spare_nodes

    @property
    def omp_threads(self) -> int:
        """OpenMP threads per worker process: the node's CPUs shared by its GPU processes."""
        return max(1, self.cpus_per_task // self.gpus) if self.gpus else self.cpus_per_task

    @property
    def wildcards_str(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.wildcards)


def _text(rule: str, name: str, value: Any, pattern: re.Pattern[str], allowed: str) -> str | None:
    if value is None or value == "":
        return None
    text = str(value)
    if not pattern.match(text):
        raise RequestError(rule, name, value, allowed)
    return text


def _check_keys(rule: str, r: Mapping[str, Any], defaults: PlanningSettings, warnings: list[str]) -> None:
    """Every key is known, mapped or refused; an unknown one is an error naming close matches."""
    unknown = sorted(k for k in r if not str(k).startswith("_") and k not in KNOWN_RESOURCES)
    if unknown and defaults.allow_unknown_resources:
        warnings.append(
            f"rule {rule!r}: unknown resource(s) {', '.join(unknown)} ignored "
            "(--multinode-allow-unknown-resources); nothing is sent to SLURM for them"
        )
    elif unknown:
        key = unknown[0]
        known = sorted(k for k in KNOWN_RESOURCES if not k.startswith("_"))
        close = [_ALIASES[key]] if key in _ALIASES else difflib.get_close_matches(key, known, n=2)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise RequestError(
            rule, key, r[key], f"unknown resource {key}{hint} (known: {', '.join(known)}; and any _name)"
        )
    for key, why in REFUSED_RESOURCES.items():
        if r.get(key) not in (None, "", False, 0):
            raise RequestError(rule, key, r[key], why)


def _gpus(rule: str, r: Mapping[str, Any], nodes: int, warnings: list[str]) -> tuple[int, str | None]:
    """GPUs per node and GPU type from gpus (ours, per node), gpu (official: per JOB), gres (gpu[:type][:N], per node
    as in SLURM), gpu_type (ours), gpu_model (official). Sources that are given must agree."""
    per_node: dict[str, int] = {}
    types: dict[str, str] = {}
    if given(r, "gpus"):
        per_node["gpus"] = read_int(rule, "gpus", r["gpus"], 0, "a non-negative integer (GPUs PER NODE)")
    if given(r, "gpu"):
        per_node["gpu"] = _gpu_per_job(rule, r["gpu"], nodes, warnings)
    if given(r, "gres"):
        per_node["gres"], gres_type = _gres(rule, r["gres"])
        if gres_type:
            types["gres"] = gres_type
    for key in ("gpu_type", "gpu_model"):
        value = _text(rule, key, r.get(key), _GPU_TYPE, "a GPU type as in gres, e.g. a100: letters, digits and _ . -")
        if value:
            types[key] = value
    _agree(rule, r, nodes, per_node, types)
    return next(iter(per_node.values()), 0), next(iter(types.values()), None)


def _gpu_per_job(rule: str, value: Any, nodes: int, warnings: list[str]) -> int:
    """The official plugin's gpu=N (GPUs for the whole job) as GPUs per node."""
    total = read_int(
        rule, "gpu", value, 0, "a non-negative integer (GPUs for the whole job, as in the official SLURM plugin)"
    )
    if total % nodes:
        raise RequestError(
            rule,
            "gpu",
            value,
            f"gpu is GPUs for the whole job (the official plugin's meaning) and must split evenly over "
            f"nodes={nodes}; use a multiple of {nodes}, or gpus=N (GPUs per node)",
        )
    if nodes > 1 and total:
        warnings.append(
            f"rule {rule!r}: gpu={total} is per job (official plugin's meaning) -> gpus={total // nodes} per node "
            f"on {nodes} nodes"
        )
    return total // nodes


def _gres(rule: str, value: Any) -> tuple[int, str | None]:
    """gres=gpu[:type][:N] (per node, as --gres counts) as (count, type)."""
    m = _GRES_GPU.match(str(value).strip())
    if not m:
        raise RequestError(
            rule,
            "gres",
            value,
            "only GPUs: gpu, gpu:N or gpu:TYPE:N (N GPUs per node, as --gres counts); other generic resources "
            "are not supported (the plugin writes --gres itself); request node features with constraint",
        )
    gtype, count = m.group("type"), m.group("count")
    if gtype and gtype.isdigit() and count is None:
        gtype, count = None, gtype
    return (int(count) if count is not None else 1), gtype


def _agree(rule: str, r: Mapping[str, Any], nodes: int, per_node: dict[str, int], types: dict[str, str]) -> None:
    """The GPU counts and types given in several keys must say the same; a model needs a count."""
    if len(set(per_node.values())) > 1:
        (first, n_first), *rest = per_node.items()
        second, n_second = next((k, v) for k, v in rest if v != n_first)

        def said(key: str, n: int) -> str:
            return f"{n} per node" if key != "gpu" else f"per job: {n} per node on {nodes} nodes"

        raise RequestError(
            rule,
            second,
            r[second],
            f"disagrees with {first}={r[first]!r} ({said(first, n_first)}); {second} means {said(second, n_second)}: "
            "give one of them",
        )
    if len(set(types.values())) > 1:
        (first, t_first), *other_types = types.items()
        second = next(k for k, v in other_types if v != t_first)
        raise RequestError(rule, second, r[second], f"disagrees with {first}={r[first]!r}: give the GPU type once")
    if "gpu_model" in types and not per_node:
        raise RequestError(
            rule,
            "gpu_model",
            r["gpu_model"],
            "a GPU model needs a GPU count: gpu=N (GPUs for the whole job) or gpus=N (per node)",
        )


def _tasks(rule: str, r: Mapping[str, Any], nodes: int) -> None:
    """One task (one torchrun) per node: tasks == nodes and tasks_per_node == 1 are no-ops, the rest is refused."""
    if given(r, "tasks"):
        tasks = read_int(rule, "tasks", r["tasks"], 1, f"a positive integer equal to nodes={nodes}; {_one_task()}")
        if tasks != nodes:
            per_node = tasks // nodes if tasks % nodes == 0 else "N"
            raise RequestError(
                rule, "tasks", r["tasks"], f"must equal nodes={nodes} or be left out: {_one_task(per_node)}"
            )
    if given(r, "tasks_per_node"):
        tpn = read_int(rule, "tasks_per_node", r["tasks_per_node"], 1, f"1; {_one_task()}")
        if tpn != 1:
            raise RequestError(rule, "tasks_per_node", r["tasks_per_node"], f"must be 1 or left out: {_one_task(tpn)}")
    if given(r, "tasks_per_gpu"):
        tpg = read_int(rule, "tasks_per_gpu", r["tasks_per_gpu"], -(2**31), "an integer")
        if tpg > 0:
            raise RequestError(
                rule,
                "tasks_per_gpu",
                r["tasks_per_gpu"],
                f"not supported: {_one_task()}; torchrun already starts one process per GPU",
            )
    if r.get("mpi") not in (None, "", False, 0):
        raise RequestError(
            rule,
            "mpi",
            r["mpi"],
            "not supported: `multinode torchrun` in the shell command starts one torchrun per node with srun "
            "itself; drop mpi (a command that starts its ranks itself with srun or mpirun sets own_launcher=True)",
        )


def _mem_mb(rule: str, r: Mapping[str, Any]) -> int | None:
    """mem_mb; else mem_mib or mem as Snakemake converts them (the executor always sees mem_mb; a preview may not)."""
    mem_mb = r.get("mem_mb")
    if mem_mb not in (None, "", 0):
        return read_int(
            rule, "mem_mb", mem_mb, 1, "a positive integer (MB per node); for a unit use mem, e.g. mem='8GB'"
        )
    mib = r.get("mem_mib")
    if mib not in (None, "", 0):
        return mib_to_mb(read_int(rule, "mem_mib", mib, 1, "a positive integer (MiB per node)"))
    mem = r.get("mem")
    if mem not in (None, "", 0):
        try:
            return parse_mem_mb(mem)
        except ValueError as err:
            raise RequestError(
                rule, "mem", mem, "a size as Snakemake reads it: MB (int) or a number and a unit, e.g. '8GB', '500 MiB'"
            ) from err
    return None


def build_request(
    rule: str,
    resources: Mapping[str, Any],
    *,
    threads: int = 1,
    wildcards: Mapping[str, Any] | None = None,
    attempt: int = 1,
    defaults: PlanningSettings = DEFAULTS,
    env_profile: str | None = None,
    declared_nodes: int | None = None,
    profile: Mapping[str, Any] | None = None,
    sbatch_options: OptionTable = ANY_RELEASE,
    site_launcher: bool = False,
) -> JobRequest:
    """Validate one job's resources. `env_profile` is the job's environment profile selection, already validated
    by environment.select (environment.py owns profiles). `declared_nodes` is what the rule itself asked for, when
    known: Snakemake's --resources nodes=N silently caps a job's nodes, and the user should hear of it. slurm_extra is
    read with `sbatch_options`, the table of the SLURM release the session found. `site_launcher`: the command
    starts its ranks with a site's own launcher (--multinode-launchers), where no stall watchdog runs."""
    r = dict(resources)
    warnings: list[str] = []
    _check_keys(rule, r, defaults, warnings)
    nodes = _nodes(rule, r, declared_nodes, warnings)
    _tasks(rule, r, nodes)
    gpus, gpu_type = _gpus(rule, r, nodes, warnings)
    mem_mb, mem_cpu = _mem_mb(rule, r), _mem_mb_per_cpu(rule, r)
    runtime_min = _runtime(rule, r, warnings)
    profile = profile or {}
    launcher = launcher_resources.read_first(
        rule, r, profile, nodes=nodes, site_launcher=site_launcher, warnings=warnings
    )
    if nodes > 1 and not gpus:
        warnings.append(
            f"rule {rule!r}: nodes={nodes} without gpus: a CPU multi-node job. Each node gets one task and no GPU; "
            "`multinode torchrun` starts one process per node (gloo backend). Set gpus=N (per node) for GPU training"
        )
    return JobRequest(
        rule=rule,
        wildcards=tuple((str(k), str(v)) for k, v in (wildcards or {}).items()),
        nodes=nodes,
        gpus=gpus,
        gpu_type=gpu_type,
        gpu_flag=_gpu_flag(rule, r, defaults),
        cpus_per_task=_cpus(rule, r, threads, gpus),
        threads=threads,
        mem_mb=None if mem_cpu else mem_mb,
        mem_mb_per_cpu=mem_cpu,
        runtime_min=runtime_min,
        **_names(rule, r, defaults),
        signal=_signal(rule, r, defaults, training=nodes > 1 or gpus > 0, runtime_min=runtime_min, warnings=warnings),
        env_profile=env_profile,
        master_port=_master_port(rule, r),
        slurm_extra=_slurm_extra(rule, r.get("slurm_extra"), sbatch_options),
        max_requeues=max(0, defaults.max_requeues),
        crash_loop_runs=defaults.crash_loop_runs,
        crash_loop_s=math.ceil(defaults.crash_loop_seconds),
        launcher=launcher_resources.read_rest(rule, r, profile, launcher, nodes=nodes),
        attempt=attempt,
        warnings=tuple(warnings),
    )


def _names(rule: str, r: Mapping[str, Any], defaults: PlanningSettings) -> dict[str, Any]:
    """The resources that name something of SLURM's (partition, account, ..., hosts), checked for sbatch's parser."""
    name = "a SLURM name: letters, digits and _ . : + -"
    hosts = "a host list like node[110-111],node5"
    return {
        "partition": _text(
            rule,
            "slurm_partition",
            r.get("slurm_partition", defaults.partition),
            _NAMES,
            f"{name}; several: comma-separated",
        ),
        "account": _text(rule, "slurm_account", r.get("slurm_account", defaults.account), _NAME, name),
        "qos": _text(rule, "qos", r.get("qos"), _NAME, name),
        "reservation": _text(rule, "slurm_reservation", r.get("slurm_reservation", defaults.reservation), _NAME, name),
        "constraint": _text(
            rule,
            "constraint",
            r.get("constraint"),
            _CONSTRAINT,
            "a SLURM feature expression, e.g. 'a100&ib' or '[rack1|rack2]'",
        ),
        "nodelist": _text(rule, "nodelist", r.get("nodelist"), _HOSTLIST, hosts),
        "exclude": _text(rule, "exclude", r.get("exclude"), _HOSTLIST, hosts),
    }


def _nodes(rule: str, r: Mapping[str, Any], declared: int | None, warnings: list[str]) -> int:
    nodes = read_int(rule, "nodes", r.get("nodes", 1), 1, "a positive integer (number of nodes)")
    if isinstance(declared, int) and declared > nodes:
        warnings.append(
            f"rule {rule!r} asks for nodes={declared} but gets {nodes}: Snakemake's "
            f"--resources nodes=... caps every job; raise it or drop it to run on {declared}"
        )
    return nodes


def _cpus(rule: str, r: Mapping[str, Any], threads: int, gpus: int) -> int:
    """CPUs of the one task on each node: cpus_per_task, or cpus_per_gpu x gpus, or the rule's threads."""
    default_cpus = max(threads, gpus, 1)
    if given(r, "cpus_per_gpu"):
        # official meaning: CPUs per GPU; 0 or less: not set. One task holds all of a node's GPUs.
        per_gpu = read_int(rule, "cpus_per_gpu", r["cpus_per_gpu"], -(2**31), "an integer (CPUs per GPU)")
        if per_gpu > 0 and gpus:
            default_cpus = per_gpu * gpus
            if given(r, "cpus_per_task"):
                cpt = read_int(rule, "cpus_per_task", r["cpus_per_task"], 1, "a positive integer (CPUs per node)")
                if cpt != default_cpus:
                    raise RequestError(
                        rule,
                        "cpus_per_gpu",
                        r["cpus_per_gpu"],
                        f"cpus_per_gpu={per_gpu} x gpus={gpus} is cpus_per_task={default_cpus} (one task per node), "
                        f"but cpus_per_task={cpt}: give one of them",
                    )
    cpus = read_int(
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
    return cpus


def _mem_mb_per_cpu(rule: str, r: Mapping[str, Any]) -> int | None:
    value = r.get("mem_mb_per_cpu")
    return (
        None
        if value in (None, "", 0)
        else read_int(rule, "mem_mb_per_cpu", value, 1, "a positive integer (MB per CPU)")
    )


def _runtime(rule: str, r: Mapping[str, Any], warnings: list[str]) -> int | None:
    runtime = r.get("runtime")
    if runtime in (None, ""):
        return None
    try:
        minutes, note = read_runtime(runtime)
    except ValueError as err:
        raise RequestError(
            rule,
            "runtime",
            runtime,
            "minutes (int) or a duration as Snakemake reads it: one number and one unit, e.g. '90', '2h', "
            f"'1.5d', '2 days', '30min'{runtime_hint(runtime)}",
        ) from err
    if note:
        warnings.append(f"rule {rule!r}: {note} -> {minutes} min")
    return minutes


def _signal(
    rule: str,
    r: Mapping[str, Any],
    defaults: PlanningSettings,
    training: bool,
    runtime_min: int | None,
    warnings: list[str],
) -> str | None:
    # The pre-time-limit signal is for training (GPU or multi-node) jobs; in a plain job USR2's default action
    # would only end the command two minutes early.
    signal = r.get("signal", defaults.signal if training else None)
    if signal in ("none", "off", False):
        return None
    signal = _text(rule, "signal", signal, _SIGNAL, "SLURM's --signal form, e.g. USR2@120, B:USR2@90, or 'none'")
    if signal and runtime_min and "@" in signal:
        lead = int(signal.rsplit("@", 1)[1])
        # slurmctld checks every 30 s and signals once the time left is within lead (+ up to one check)
        if runtime_min * 60 <= lead + 30:
            warnings.append(
                f"rule {rule!r}: signal {signal} with runtime {runtime_min} min: the signal arrives "
                "within 30 s of every start, so a checkpoint-and-requeue job would make no progress"
            )
    return signal


def _gpu_flag(rule: str, r: Mapping[str, Any], defaults: PlanningSettings) -> str:
    gpu_flag = r.get("gpu_flag", defaults.gpu_flag)
    if gpu_flag not in ("gres", "gpus-per-node"):
        raise RequestError(rule, "gpu_flag", gpu_flag, "'gres' or 'gpus-per-node'")
    return str(gpu_flag)


def _master_port(rule: str, r: Mapping[str, Any]) -> int | None:
    port = r.get("master_port")
    port = None if port in (None, "") else read_int(rule, "master_port", port, 1024, "a port number 1024..65535")
    if port is not None and port > 65535:
        raise RequestError(rule, "master_port", port, "a port number 1024..65535")
    return port
