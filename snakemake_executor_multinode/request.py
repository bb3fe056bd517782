"""Rule resources -> a validated JobRequest. Every bad-input error is raised here, before anything is submitted.

Every resource key is known, mapped or refused (docs/resources.md has the table):
- ours: nodes, gpus (PER NODE), gpu_type, gpu_flag, cpus_per_task, mem_mb_per_cpu, slurm_partition, slurm_account,
  slurm_reservation, qos, constraint, nodelist, exclude, signal, env_profile, master_port, slurm_extra; names shared
  with the official SLURM plugin mean the same there, so profiles carry over;
- Snakemake's own (mem, mem_mb, mem_mib, disk*, runtime, tmpdir, threads, and every key starting with "_");
- the official SLURM plugin's that mean something else here are mapped (gpu = GPUs per JOB, gpu_model, gres,
  cpus_per_gpu, tasks == nodes, tasks_per_node == 1) or refused with what to use instead (mpi, tasks, clusters, ...);
- anything else is an error naming close matches, unless Defaults.allow_unknown_resources.

Durations and sizes are read with Snakemake's own rules (snakemake/resources.py `Resource.parse_human_friendly`,
which uses humanfriendly's parse_timespan/parse_size), re-implemented here because this package imports neither
Snakemake nor humanfriendly: a value `multinode preview` accepts means what Snakemake makes of it.
"""

from __future__ import annotations

import difflib
import math
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


# --- resource keys ---------------------------------------------------------------------------------------------

# Snakemake's own (snakemake 9.27 resources.py: the sized resources mem/disk with their _mb/_mib forms, which
# Snakemake expands into all three, runtime, tmpdir from --default-resources, and the internal _cores/_nodes; any key
# starting with "_" is Snakemake's). Only mem* and runtime mean something to SLURM here.
SNAKEMAKE_RESOURCES = frozenset(
    {"mem", "mem_mb", "mem_mib", "disk", "disk_mb", "disk_mib", "runtime", "tmpdir", "threads", "_cores", "_nodes"}
)
# This plugin's resources (README, "The rule interface").
OWN_RESOURCES = frozenset(
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


def _one_task(per_node: Any = "N") -> str:
    return (
        "the launcher runs one task (one torchrun) per node; for "
        f"{per_node} processes per node set gpus={per_node} (torchrun starts one per GPU) or pass "
        f"--nproc_per_node={per_node} to `multinode torchrun`"
    )


# --- sbatch's options (slurm 22.05) ----------------------------------------------------------------------------

# sbatch 22.05's getopt_long table: long name -> argument ("required", "optional" or "none"). Read off the binary
# (`sbatch --a` .. `--z` list every option through getopt's "ambiguous" message; `--NAME` / `--NAME=x` tell the
# argument kind); tests/test_request.py compares it with the installed sbatch where there is one.
SBATCH_LONG_OPTIONS: dict[str, str] = {
    **dict.fromkeys(
        "account acctg-freq array batch bb bbf begin chdir cluster cluster-constraint clusters comment constraint "
        "container context core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot "
        "dependency distribution error exclude export export-file extra-node-info gid gpu-bind gpu-freq gpus "
        "gpus-per-node gpus-per-socket gpus-per-task gres gres-flags hint input job-name kill-on-invalid-dep licenses "
        "mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus network nodefile nodelist nodes "
        "ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket ntasks-per-tres open-mode output "
        "partition power prefer priority profile qos reservation signal sockets-per-node switches tasks-per-node "
        "thread-spec threads-per-core time time-min tmp uid wait-all-nodes wckey wrap".split(),
        "required",
    ),
    **dict.fromkeys("exclusive get-user-env nice no-kill propagate".split(), "optional"),
    **dict.fromkeys(
        "contiguous help hold ignore-pbs no-requeue overcommit oversubscribe parsable quiet reboot requeue "
        "spread-job test-only usage use-min-nodes verbose version wait".split(),
        "none",
    ),
}
# sbatch 22.05's short options -> long name; a short option takes an argument iff its long one requires one
# (-k, --no-kill[=on|off], takes none).
SBATCH_SHORT_OPTIONS: dict[str, str] = {
    "a": "array",
    "A": "account",
    "b": "begin",
    "B": "extra-node-info",
    "c": "cpus-per-task",
    "C": "constraint",
    "d": "dependency",
    "D": "chdir",
    "e": "error",
    "F": "nodefile",
    "G": "gpus",
    "h": "help",
    "H": "hold",
    "i": "input",
    "J": "job-name",
    "k": "no-kill",
    "L": "licenses",
    "m": "distribution",
    "M": "clusters",
    "n": "ntasks",
    "N": "nodes",
    "o": "output",
    "O": "overcommit",
    "p": "partition",
    "q": "qos",
    "Q": "quiet",
    "s": "oversubscribe",
    "S": "core-spec",
    "t": "time",
    "v": "verbose",
    "V": "version",
    "w": "nodelist",
    "W": "wait",
    "x": "exclude",
}

_SUBMISSION = "the plugin submits with sbatch --parsable and reads the job id back"
_TASKS = "(tasks)"  # owner of the task-count flags: the message says how to get N processes per node instead
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
    "--requeue": "requeueing is set by --multinode-max-requeues (0: never)",
    "--no-requeue": "requeueing is set by --multinode-max-requeues (0: never)",
}


def _resolve_long(given: str) -> str:
    """getopt_long's rule: an exact name, else a prefix of exactly one name; an ambiguous prefix is an error."""
    if given in SBATCH_LONG_OPTIONS:
        return given
    candidates = [name for name in SBATCH_LONG_OPTIONS if name.startswith(given)]
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise ValueError(f"--{given} is ambiguous to sbatch: " + ", ".join(f"--{c}" for c in sorted(candidates)))
    close = difflib.get_close_matches(given, SBATCH_LONG_OPTIONS, n=3)
    hint = f"; did you mean {' or '.join('--' + c for c in close)}?" if close else ""
    raise ValueError(f"--{given} is not an sbatch option (sbatch 22.05){hint}")


def parse_sbatch_flags(text: str) -> list[tuple[str, str, str | None]]:
    """Read sbatch flags the way sbatch does (getopt_long): unique prefixes of long options, bundled short options,
    values after '=' or in the next word. Returns (as written, long name, value or None) per option; ValueError for
    what sbatch would refuse, for words that are not options (sbatch would take the first as the script) and for
    control characters (a newline would end the #SBATCH line)."""
    bad = next((c for c in text if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise ValueError(f"control character {bad!r}: it must be one line of sbatch flags")
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise ValueError(f"must be shell-style flags ({err})") from err
    options: list[tuple[str, str, str | None]] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--" or word == "-" or not word.startswith("-"):
            raise ValueError(
                f"{word!r} is not an option: only sbatch flags may follow (sbatch reads a word as the script)"
            )
        if word.startswith("--"):
            given, sep, value = word[2:].partition("=")
            name = _resolve_long(given)
            kind = SBATCH_LONG_OPTIONS[name]
            if sep and kind == "none":
                raise ValueError(f"--{name} takes no value")
            if not sep and kind == "required":
                if i == len(words):
                    raise ValueError(f"--{name} needs a value")
                value, sep = words[i], "="
                i += 1
            options.append((f"--{given}", name, value if sep else None))
            continue
        if len(word) > 2 and word[1:].partition("=")[0] in SBATCH_LONG_OPTIONS:
            long = word[1:].partition("=")[0]
            raise ValueError(f"sbatch reads {word} as -{word[1]} {word[2:]}; write --{long} (two dashes)")
        j = 1
        while j < len(word):
            letter = word[j]
            j += 1
            if letter not in SBATCH_SHORT_OPTIONS:
                raise ValueError(f"-{letter} is not an sbatch option (sbatch 22.05)")
            name = SBATCH_SHORT_OPTIONS[letter]
            if SBATCH_LONG_OPTIONS[name] != "required":
                options.append((f"-{letter}", name, None))
                continue
            if j < len(word):
                value = word[j:]
            elif i < len(words):
                value = words[i]
                i += 1
            else:
                raise ValueError(f"-{letter} (--{name}) needs a value")
            options.append((f"-{letter}", name, value))
            break
    return options


def _slurm_extra(rule: str, value: Any) -> tuple[str, ...]:
    """slurm_extra -> canonical `--long[=value]` words, after refusing what sbatch would refuse and every flag the
    plugin manages."""
    if value is None or value == "":
        return ()
    try:
        options = parse_sbatch_flags(str(value))
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


# --- Snakemake's duration and size rules ------------------------------------------------------------------------

# humanfriendly.time_units (what Snakemake's runtime parsing uses): unit word -> seconds
_TIME_UNITS = {
    **dict.fromkeys(("ns", "nanosecond", "nanoseconds"), 1e-9),
    **dict.fromkeys(("us", "microsecond", "microseconds"), 1e-6),
    **dict.fromkeys(("ms", "millisecond", "milliseconds"), 1e-3),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hour", "hours"), 60 * 60),
    **dict.fromkeys(("d", "day", "days"), 60 * 60 * 24),
    **dict.fromkeys(("w", "week", "weeks"), 60 * 60 * 24 * 7),
    **dict.fromkeys(("y", "year", "years"), 60 * 60 * 24 * 7 * 52),
}
# humanfriendly.disk_size_units: (decimal symbol, decimal name, binary symbol, binary name, power)
_SIZE_UNITS = [
    ("kb", "kilobyte", "kib", "kibibyte", 1),
    ("mb", "megabyte", "mib", "mebibyte", 2),
    ("gb", "gigabyte", "gib", "gibibyte", 3),
    ("tb", "terabyte", "tib", "tebibyte", 4),
    ("pb", "petabyte", "pib", "pebibyte", 5),
    ("eb", "exabyte", "eib", "exbibyte", 6),
    ("zb", "zettabyte", "zib", "zebibyte", 7),
    ("yb", "yottabyte", "yib", "yobibyte", 8),
]
_NUMBER = re.compile(r"(\d+(?:\.\d+)?)")
# SLURM's own time forms, which Snakemake refuses: only to say what to write instead
_SLURM_TIME = re.compile(r"^(?:(?P<d>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$")


def _tokenize(text: str) -> list[int | float | str]:
    """humanfriendly.text.tokenize: numbers and the words between them."""
    tokens: list[int | float | str] = []
    for token in _NUMBER.split(text):
        token = token.strip()
        if re.match(r"\d+\.\d+", token):
            tokens.append(float(token))
        elif token.isdigit():
            tokens.append(int(token))
        elif token:
            tokens.append(token)
    return tokens


def _timespan_seconds(text: str) -> float:
    """humanfriendly.parse_timespan: a number (seconds) or one number and one unit."""
    tokens = _tokenize(text)
    if tokens and not isinstance(tokens[0], str):
        if len(tokens) == 1:
            return float(tokens[0])
        if len(tokens) == 2 and isinstance(tokens[1], str) and tokens[1].lower() in _TIME_UNITS:
            return float(tokens[0]) * _TIME_UNITS[tokens[1].lower()]
    raise ValueError(text)


def _size_bytes(text: str) -> int:
    """humanfriendly.parse_size (decimal, as Snakemake calls it): a number (bytes) or one number and one unit."""
    tokens = _tokenize(text)
    if tokens and not isinstance(tokens[0], str):
        number = tokens[0]
        unit = tokens[1].lower() if len(tokens) == 2 and isinstance(tokens[1], str) else ""
        if len(tokens) == 1 or unit.startswith("b"):
            return int(number)
        if unit:
            unit = unit.rstrip("s")
            for dec_symbol, dec_name, bin_symbol, bin_name, power in _SIZE_UNITS:
                if unit in (bin_symbol, bin_name):
                    return int(number * 1024**power)
                if unit in (dec_symbol, dec_name) or unit.startswith(dec_symbol[0]):
                    return int(number * 1000**power)
    raise ValueError(text)


def _runtime(value: Any) -> tuple[int, str | None]:
    """Minutes, as Snakemake 9.27 reads a runtime (Resource.parse_human_friendly), and a note when a string without
    a unit was read as seconds."""
    if isinstance(value, bool):
        raise ValueError(value)
    note = None
    if isinstance(value, int | float):
        minutes = round(value)  # Snakemake rounds floats (to even)
    else:
        text = str(value).strip("'\"")
        if text.isdecimal():
            minutes = int(text)
        else:
            seconds = _timespan_seconds(text)
            minutes = max(int(round(seconds) / 60), 1)
            if len(_tokenize(text)) == 1:
                note = f"runtime {value!r} has no unit and is not a whole number: Snakemake reads it as seconds"
    if minutes < 1:
        raise ValueError(value)
    return minutes, note


def parse_runtime(value: Any) -> int:
    """Minutes from a runtime resource, exactly as Snakemake reads it: an int/float (minutes, floats rounded), a
    string of digits (minutes), or humanfriendly's timespan: one number and one unit ('2h', '1.5d', '2 days',
    '90min', '45s': whole minutes rounded down, at least 1). A positive result or ValueError. Snakemake refuses
    SLURM's '1-12:00:00' and compound '1h30m', and so does this."""
    return _runtime(value)[0]


def parse_mem_mb(value: Any) -> int:
    """MB from a mem resource, exactly as Snakemake reads it: a number (MB), a string of digits (MB), or a size with a
    unit ('8GB', '8 GiB', '500M': decimal unless the unit says 'iB'), rounded up to whole MB, at least 1."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int | float):
        mb = round(value)
    else:
        text = str(value).strip("'\"")
        mb = int(text) if text.isdecimal() else max(math.ceil(_size_bytes(text) / 1e6), 1)
    if mb < 1:
        raise ValueError(value)
    return mb


def mib_to_mb(mib: int) -> int:
    """Snakemake's mem_mib -> mem_mb (snakemake.common.mib_to_mb)."""
    return int(math.floor(mib / 0.95367431640625))


def _runtime_hint(value: Any) -> str:
    text = str(value).strip().strip("'\"")
    minutes = None
    if m := _SLURM_TIME.match(text):
        a, b, c = (int(x) if x is not None else None for x in m.group("a", "b", "c"))
        if m.group("d"):
            minutes = int(m.group("d")) * 1440 + a * 60 + (b or 0) + ((c or 0) + 59) // 60
        elif c is not None:
            minutes = a * 60 + b + (c + 59) // 60
        elif b is not None:
            minutes = a + (b + 59) // 60
        what = "SLURM's time form"
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)\s*([A-Za-z]+)", text)
        if len(parts) > 1 and re.fullmatch(r"(?:\s*\d+(?:\.\d+)?\s*[A-Za-z]+)+\s*", text):
            if all(u.lower() in _TIME_UNITS for _, u in parts):
                minutes = math.ceil(sum(float(n) * _TIME_UNITS[u.lower()] for n, u in parts) / 60)
        what = "more than one unit"
    if not minutes:
        return ""
    hours = f" or '{minutes // 60}h'" if minutes % 60 == 0 else ""
    return f"; {text!r} is {what}, which Snakemake refuses: write {minutes}{hours}"


# --- validation helpers ------------------------------------------------------------------------------------------

_SIGNAL = re.compile(r"^(?:[BR]:)?(?:SIG)?[A-Z][A-Z0-9]*(?:@\d+)?$|^(?:[BR]:)?\d+(?:@\d+)?$")
_HOSTLIST = re.compile(r"^[A-Za-z0-9_.,\[\]\-]+$")
_NAME = re.compile(r"^[A-Za-z0-9_.:+\-]+$")
_NAMES = re.compile(r"^[A-Za-z0-9_.:+\-]+(?:,[A-Za-z0-9_.:+\-]+)*$")
_GPU_TYPE = re.compile(r"^[A-Za-z0-9_.\-]+$")
_GRES_GPU = re.compile(r"^gpu(?::(?P<type>[A-Za-z0-9_.\-]+))?(?::(?P<count>\d+))?$")
_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.,&|\[\]()*:!\-]+$")


@dataclass(frozen=True)
class Defaults:
    """Plugin settings that fill in what a rule leaves out."""

    account: str | None = None
    partition: str | None = None
    reservation: str | None = None
    signal: str | None = "USR2@120"
    gpu_flag: str = "gres"  # or "gpus-per-node"
    max_requeues: int = 3  # 0: never requeue (sbatch --no-requeue)
    allow_unknown_resources: bool = False  # True: unknown keys are ignored, with one warning


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
    reservation: str | None = None
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


def _given(r: Mapping[str, Any], key: str) -> bool:
    return r.get(key) not in (None, "")


def _check_keys(rule: str, r: Mapping[str, Any], defaults: Defaults, warnings: list[str]) -> None:
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
    if _given(r, "gpus"):
        per_node["gpus"] = _int(rule, "gpus", r["gpus"], 0, "a non-negative integer (GPUs PER NODE)")
    if _given(r, "gpu"):
        total = _int(
            rule, "gpu", r["gpu"], 0, "a non-negative integer (GPUs for the whole job, as in the official SLURM plugin)"
        )
        if total % nodes:
            raise RequestError(
                rule,
                "gpu",
                r["gpu"],
                f"gpu is GPUs for the whole job (the official plugin's meaning) and must split evenly over "
                f"nodes={nodes}; use a multiple of {nodes}, or gpus=N (GPUs per node)",
            )
        per_node["gpu"] = total // nodes
        if nodes > 1 and total:
            warnings.append(
                f"rule {rule!r}: gpu={total} is per job (official plugin's meaning) -> gpus={total // nodes} per node "
                f"on {nodes} nodes"
            )
    types: dict[str, str] = {}
    if _given(r, "gres"):
        m = _GRES_GPU.match(str(r["gres"]).strip())
        if not m:
            raise RequestError(
                rule,
                "gres",
                r["gres"],
                "only GPUs: gpu, gpu:N or gpu:TYPE:N (N GPUs per node, as --gres counts); other generic resources "
                "are not supported (the plugin writes --gres itself); request node features with constraint",
            )
        gtype, count = m.group("type"), m.group("count")
        if gtype and gtype.isdigit() and count is None:
            gtype, count = None, gtype
        per_node["gres"] = int(count) if count is not None else 1
        if gtype:
            types["gres"] = gtype
    for key in ("gpu_type", "gpu_model"):
        value = _text(rule, key, r.get(key), _GPU_TYPE, "a GPU type as in gres, e.g. a100: letters, digits and _ . -")
        if value:
            types[key] = value
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
        (first, t_first), *rest = types.items()
        second = next(k for k, v in rest if v != t_first)
        raise RequestError(rule, second, r[second], f"disagrees with {first}={r[first]!r}: give the GPU type once")
    if "gpu_model" in types and not per_node:
        raise RequestError(
            rule,
            "gpu_model",
            r["gpu_model"],
            "a GPU model needs a GPU count: gpu=N (GPUs for the whole job) or gpus=N (per node)",
        )
    gpus = next(iter(per_node.values()), 0)
    return gpus, next(iter(types.values()), None)


def _tasks(rule: str, r: Mapping[str, Any], nodes: int) -> None:
    """One task (one torchrun) per node: tasks == nodes and tasks_per_node == 1 are no-ops, the rest is refused."""
    if _given(r, "tasks"):
        tasks = _int(rule, "tasks", r["tasks"], 1, f"a positive integer equal to nodes={nodes}; {_one_task()}")
        if tasks != nodes:
            per_node = tasks // nodes if tasks % nodes == 0 else "N"
            raise RequestError(
                rule, "tasks", r["tasks"], f"must equal nodes={nodes} or be left out: {_one_task(per_node)}"
            )
    if _given(r, "tasks_per_node"):
        tpn = _int(rule, "tasks_per_node", r["tasks_per_node"], 1, f"1; {_one_task()}")
        if tpn != 1:
            raise RequestError(rule, "tasks_per_node", r["tasks_per_node"], f"must be 1 or left out: {_one_task(tpn)}")
    if _given(r, "tasks_per_gpu"):
        tpg = _int(rule, "tasks_per_gpu", r["tasks_per_gpu"], -(2**31), "an integer")
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
            "itself; drop mpi (and srun/mpirun from the command)",
        )


def _mem_mb(rule: str, r: Mapping[str, Any]) -> int | None:
    """mem_mb; else mem_mib or mem as Snakemake converts them (the executor always sees mem_mb; a preview may not)."""
    mem_mb = r.get("mem_mb")
    if mem_mb not in (None, "", 0):
        return _int(rule, "mem_mb", mem_mb, 1, "a positive integer (MB per node); for a unit use mem, e.g. mem='8GB'")
    mib = r.get("mem_mib")
    if mib not in (None, "", 0):
        return mib_to_mb(_int(rule, "mem_mib", mib, 1, "a positive integer (MiB per node)"))
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
    defaults: Defaults = Defaults(),
    env_profile: str | None = None,
    declared_nodes: int | None = None,
) -> JobRequest:
    """Validate one job's resources. `env_profile` is the job's environment profile selection, already validated
    by environment.select (environment.py owns profiles). `declared_nodes` is what the rule itself asked for, when
    known: Snakemake's --resources nodes=N silently caps a job's nodes, and the user should hear of it."""
    r = dict(resources)
    warnings: list[str] = []
    _check_keys(rule, r, defaults, warnings)
    nodes = _int(rule, "nodes", r.get("nodes", 1), 1, "a positive integer (number of nodes)")
    if isinstance(declared_nodes, int) and declared_nodes > nodes:
        warnings.append(
            f"rule {rule!r} asks for nodes={declared_nodes} but gets {nodes}: Snakemake's "
            f"--resources nodes=... caps every job; raise it or drop it to run on {declared_nodes}"
        )
    _tasks(rule, r, nodes)
    gpus, gpu_type = _gpus(rule, r, nodes, warnings)
    default_cpus = max(threads, gpus, 1)
    if _given(r, "cpus_per_gpu"):
        # official meaning: CPUs per GPU; 0 or less: not set. One task holds all of a node's GPUs.
        per_gpu = _int(rule, "cpus_per_gpu", r["cpus_per_gpu"], -(2**31), "an integer (CPUs per GPU)")
        if per_gpu > 0 and gpus:
            default_cpus = per_gpu * gpus
            if _given(r, "cpus_per_task"):
                cpt = _int(rule, "cpus_per_task", r["cpus_per_task"], 1, "a positive integer (CPUs per node)")
                if cpt != default_cpus:
                    raise RequestError(
                        rule,
                        "cpus_per_gpu",
                        r["cpus_per_gpu"],
                        f"cpus_per_gpu={per_gpu} x gpus={gpus} is cpus_per_task={default_cpus} (one task per node), "
                        f"but cpus_per_task={cpt}: give one of them",
                    )
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
    mem_mb = _mem_mb(rule, r)
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
            runtime_min, note = _runtime(runtime)
        except ValueError as err:
            raise RequestError(
                rule,
                "runtime",
                runtime,
                "minutes (int) or a duration as Snakemake reads it: one number and one unit, e.g. '90', '2h', "
                f"'1.5d', '2 days', '30min'{_runtime_hint(runtime)}",
            ) from err
        if note:
            warnings.append(f"rule {rule!r}: {note} -> {runtime_min} min")
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
        gpu_type=gpu_type,
        gpu_flag=gpu_flag,
        cpus_per_task=cpus,
        threads=threads,
        mem_mb=None if mem_cpu else mem_mb,
        mem_mb_per_cpu=mem_cpu,
        runtime_min=runtime_min,
        partition=_text(
            rule,
            "slurm_partition",
            r.get("slurm_partition", defaults.partition),
            _NAMES,
            f"{name}; several: comma-separated",
        ),
        account=_text(rule, "slurm_account", r.get("slurm_account", defaults.account), _NAME, name),
        qos=_text(rule, "qos", r.get("qos"), _NAME, name),
        reservation=_text(rule, "slurm_reservation", r.get("slurm_reservation", defaults.reservation), _NAME, name),
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
