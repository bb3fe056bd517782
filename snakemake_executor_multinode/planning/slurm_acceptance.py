"""Before the first submission: would SLURM take every planned job, and may the user charge the accounts named?

`ask_slurm(planned, client)` asks SLURM once per distinct resource shape (the #SBATCH lines without job name, comment
and log path, so the jobs of one rule that differ only in wildcards ask once) with `sbatch --test-only`, which
queues nothing and answers with the same refusal a real submission would get. When a job names an account and
SLURM keeps accounting, one `sacctmgr` query of the user's associations says whether the user can charge it (SLURM
itself only refuses a wrong account when it enforces associations). The default partition is read from the answer to a
job that names none ("... in partition P"); `scontrol show partition/node` is asked only when no answer names it,
and to turn a refusal into the field that caused it. Errors read like the request's own
(rule, field, value, what is allowed, SLURM's words); where no field can be named, SLURM's message is quoted.
"""

from __future__ import annotations

import os
import pwd
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from snakemake_executor_multinode.planning.plan import JobPlan
from snakemake_executor_multinode.planning.request import JobRequest, RequestError
from snakemake_executor_multinode.slurm.client import SlurmClient, SubmitError

# #SBATCH flags that differ between jobs of the same shape.
PER_JOB_FLAGS = ("--job-name", "--comment", "--output")
# Resources a plugin setting fills in when the job leaves them out: the error says where the value came from.
SETTING_OF = {"slurm_partition": "partition", "slurm_account": "account", "slurm_reservation": "reservation"}
# SLURM could not be asked at all (not configured, not installed, not answering): no verdict on the jobs.
_UNREACHABLE = (
    "configuration source",
    "is slurm's client installed",
    "did not answer for",
    "unable to contact slurm controller",
)
_UNKNOWN_OPTION = re.compile(r"(?:unrecognized|invalid|unknown) option '?(--?[\w-]+)")
_GRES_GPU = re.compile(r"gpu(?::([^:,(]+))?:(\d+)")
_KEY_VALUE = re.compile(r"(\w+)=(\S*)")
_RULE_PREFIX = re.compile(r"rule '([^']*)': (.*)", re.S)
_IN_PARTITION = re.compile(r" in partition (\S+)\s*$")  # the end of sbatch --test-only's answer


@dataclass(frozen=True)
class Planned:
    """One planned job, and which resources the job itself set (the others come from the plugin settings)."""

    plan: JobPlan
    given: frozenset[str] = frozenset()


@dataclass
class Report:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    default_partition: str | None = None  # asked only when a job names no partition
    unreachable: str | None = None  # why SLURM could not be asked; then nothing was checked against the cluster
    tests: int = 0  # sbatch --test-only calls
    slurm_version: str | None = None  # the release the checks ran against (sbatch --version)
    seconds: float = 0.0


def shape(plan: JobPlan) -> tuple[str, ...]:
    """The job's #SBATCH lines without those that name this one job: equal shape, equal answer from SLURM."""
    lines = (line for line in plan.script.splitlines() if line.startswith("#SBATCH "))
    return tuple(line for line in lines if line[len("#SBATCH ") :].split("=", 1)[0] not in PER_JOB_FLAGS)


def ask_slurm(
    planned: Sequence[Planned], client: SlurmClient, user: str | None = None, version: str | None = None
) -> Report:
    """Ask SLURM about every planned job before anything is submitted; nothing is queued. `version`: the release
    the session already asked for before planning ("" when sbatch did not answer); None: ask now."""
    start = time.monotonic()
    report = Report(slurm_version=(client.version() if version is None else version) or None)
    cluster = Cluster(client)
    _test_each_shape(planned, client, cluster, report)
    if report.unreachable is None:
        _check_accounts(planned, cluster, user or pwd.getpwuid(os.getuid()).pw_name, report)
        missing = list(dict.fromkeys(p.plan.request.rule for p in planned if not p.plan.request.partition))
        if missing:
            report.default_partition = report.default_partition or cluster.default_partition()
            which = f" {report.default_partition!r}" if report.default_partition else ""
            rules = ", ".join(repr(r) for r in missing)
            report.warnings.append(
                f"rule{'s' if len(missing) > 1 else ''} {rules}: no partition (resource slurm_partition or "
                f"--multinode-partition): SLURM uses its default partition{which}"
            )
    report.errors = merge_rules(report.errors)
    report.seconds = time.monotonic() - start
    return report


def _test_each_shape(planned: Sequence[Planned], client: SlurmClient, cluster: Cluster, report: Report) -> None:
    shapes: dict[tuple[str, ...], list[Planned]] = {}
    for p in planned:
        shapes.setdefault(shape(p.plan), []).append(p)
    with tempfile.TemporaryDirectory(prefix="multinode-preflight-") as tmp:
        for i, members in enumerate(shapes.values()):
            script = Path(tmp) / f"shape{i}.sbatch"  # .sh, .log, .first: job files' suffixes (JobFiles)
            fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # profiles may hold tokens
            with os.fdopen(fd, "w") as fh:
                fh.write(members[0].plan.script)
            report.tests += 1
            try:
                answer = client.test_only(script, cwd=members[0].plan.workdir)
            except SubmitError as err:
                if any(marker in str(err).lower() for marker in _UNREACHABLE):
                    report.unreachable = str(err)
                    return
                for p in _one_per_rule(members):
                    verdict = explain(p, str(err), cluster, report.slurm_version)
                    (report.errors if verdict.fatal else report.warnings).append(verdict.message)
                continue
            if not members[0].plan.request.partition and (named := _IN_PARTITION.search(answer)):
                report.default_partition = named.group(1)  # where SLURM puts a job that names none


def _check_accounts(planned: Sequence[Planned], cluster: Cluster, user: str, report: Report) -> None:
    for p in _one_per_rule(planned):
        said = any(e.startswith(f"rule {p.plan.request.rule!r}: resource slurm_account=") for e in report.errors)
        if not said and (problem := account_problem(p, cluster, user)):
            report.errors.append(problem)


def merge_rules(messages: list[str]) -> list[str]:
    """Messages that differ only in the rule they name (a setting wrong for every rule) become one."""
    tails: dict[str, list[str]] = {}
    for message in messages:
        match = _RULE_PREFIX.match(message)
        rule, tail = (match.group(1), match.group(2)) if match else ("", message)
        tails.setdefault(tail, []).append(rule)
    merged = []
    for tail, rules in tails.items():
        named = list(dict.fromkeys(r for r in rules if r))
        if not named:
            merged.append(tail)
        else:
            merged.append(f"rule{'s' if len(named) > 1 else ''} {', '.join(repr(r) for r in named)}: {tail}")
    return merged


@dataclass(frozen=True)
class Verdict:
    message: str
    fatal: bool = True


def _one_per_rule(planned: Iterable[Planned]) -> list[Planned]:
    seen: dict[str, Planned] = {}
    for p in planned:
        seen.setdefault(p.plan.request.rule, p)
    return list(seen.values())


# --- what the cluster has (asked only when needed, once) -----------------------------------------------------------


class Cluster:
    """Partitions and nodes as `scontrol -o show` lists them; None where SLURM did not answer."""

    def __init__(self, client: SlurmClient) -> None:
        self.client = client
        self._partitions: dict[str, dict[str, str]] | None = None
        self._nodes: list[dict[str, str]] | None = None
        self._associations: dict[str, list[tuple[str, str]] | None] = {}

    def partitions(self) -> dict[str, dict[str, str]]:
        if self._partitions is None:
            rows = [_fields(line) for line in self.client.show("partition")]
            self._partitions = {r["PartitionName"]: r for r in rows if "PartitionName" in r}
        return self._partitions

    def default_partition(self) -> str | None:
        return next((name for name, p in self.partitions().items() if p.get("Default") == "YES"), None)

    def nodes(self, partition: str | None) -> list[dict[str, str]]:
        if self._nodes is None:
            self._nodes = [r for r in (_fields(line) for line in self.client.show("node")) if "NodeName" in r]
        names = set((partition or self.default_partition() or "").split(","))
        return [n for n in self._nodes if names & set(n.get("Partitions", "").split(","))]

    def associations(self, user: str) -> list[tuple[str, str]] | None:
        if user not in self._associations:
            self._associations[user] = self.client.associations(user)
        return self._associations[user]


def _fields(line: str) -> dict[str, str]:
    return dict(_KEY_VALUE.findall(line))


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


# --- turning SLURM's answer into our field ---------------------------------------------------------------------------


def reason(message: str) -> str:
    """SLURM's reason for a refusal: the last line, without `sbatch: error:` / `allocation failure:`."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else message.strip()
    for prefix in ("sbatch: error: ", "allocation failure: ", "Batch job submission failed: "):
        last = last.removeprefix(prefix)
    return last


def explain(p: Planned, message: str, cluster: Cluster, version: str | None = None) -> Verdict:
    """SLURM refused `p`'s shape with `message`: name the field (and what the cluster allows) where we can."""
    req = p.plan.request
    why = reason(message)
    text = why.lower()
    if unknown := _UNKNOWN_OPTION.search(message):
        # An option of another SLURM release (24.11's --segment on 22.05, say): said now, not mid-run
        release = f"SLURM {version}" if version else "this cluster's SLURM"
        allowed = f"{release} has no option {unknown[1]} (an option of another release? `sbatch --help` lists them)"
        return Verdict(str(RequestError(req.rule, "slurm_extra", " ".join(req.slurm_extra), allowed)))
    partition = req.partition or cluster.default_partition()

    def bad(fieldname: str, value: object, allowed: str) -> Verdict:
        setting = SETTING_OF.get(fieldname) if fieldname not in p.given else None
        source = f"; set by --multinode-{setting}" if setting else ""
        return Verdict(str(RequestError(req.rule, fieldname, value, f"{allowed}{source} (SLURM: {why})")))

    if "invalid partition" in text or "no partition specified" in text:
        names = ", ".join(cluster.partitions()) or "unknown"
        if not req.partition:
            return bad("slurm_partition", None, f"the cluster has no default partition; partitions: {names}")
        return bad("slurm_partition", req.partition, f"no such partition; partitions: {names}")
    if "invalid account" in text:
        return bad("slurm_account", req.account, "not an account this user may charge (in this partition)")
    if "invalid qos" in text:
        return bad("qos", req.qos, "not a QOS this user may use")
    if "reservation" in text:
        return bad("slurm_reservation", req.reservation, "no such reservation, or not one this user may use")
    if "invalid feature" in text:
        return bad("constraint", req.constraint, "features no node of the partition has")
    if "invalid node name" in text:
        name = "nodelist" if req.nodelist else "exclude"
        return bad(name, req.nodelist or req.exclude, "names a node the cluster does not have")
    if "time limit" in text:
        limit = cluster.partitions().get(partition or "", {}).get("MaxTime")
        allowed = f"partition {partition!r} allows at most {limit}" if limit else "exceeds the partition's limit"
        return bad("runtime", req.runtime_min, f"{allowed} (runtime is in minutes)")
    if "gres" in text or "generic resource" in text:
        if found := fit_problem(req, cluster, partition):
            return bad(*found)
        return bad("gpu_type" if req.gpu_type else "gpus", req.gpu_type or req.gpus, "GPUs the nodes do not have")
    capacity = ("node count", "node configuration", "partition configuration", "memory", "processors", "cpu")
    if any(word in text for word in capacity):
        if found := fit_problem(req, cluster, partition):
            return bad(*found)
        if "node count" not in text:
            # The nodes as configured could run it: SLURM speaks of their present state (down, drained), and a real
            # submission would wait for them.
            return Verdict(
                f"rule {req.rule!r}: SLURM cannot place the job now ({_summary(req, partition)}): {why}", False
            )
    return Verdict(f"rule {req.rule!r}: SLURM refuses the job ({_summary(req, partition)}): {why}")


def fit_problem(req: JobRequest, cluster: Cluster, partition: str | None) -> tuple[str, object, str] | None:
    """The field that no (or too few) configured node(s) of the partition can satisfy, and what they have."""
    where = f"partition {partition!r}" if partition else "the default partition"
    info = cluster.partitions().get(partition or "", {})
    total, max_nodes = _int(info.get("TotalNodes")), _int(info.get("MaxNodes"))
    if max_nodes is not None and req.nodes > max_nodes:
        return "nodes", req.nodes, f"{where} allows at most {max_nodes} nodes per job"
    if total is not None and req.nodes > total:
        return "nodes", req.nodes, f"{where} has {total} node{'s' if total != 1 else ''}"
    nodes = cluster.nodes(partition)
    if not nodes:
        return None
    mem = req.mem_mb or (req.mem_mb_per_cpu or 0) * req.cpus_per_task
    mem_field = ("mem_mb", req.mem_mb) if req.mem_mb else ("mem_mb_per_cpu", req.mem_mb_per_cpu)
    gpu_unit = "GPUs" + (f" of type {req.gpu_type}" if req.gpu_type else "")
    # (field, its value, what one node needs, what a node has, unit)
    wants: list[tuple[str, object, int, Callable[[dict[str, str]], int], str]] = [
        ("gpus", req.gpus, req.gpus, lambda n: _gpus(n, req.gpu_type), gpu_unit),
        ("cpus_per_task", req.cpus_per_task, req.cpus_per_task, lambda n: _int(n.get("CPUTot")) or 0, "CPUs"),
        (*mem_field, mem, lambda n: _int(n.get("RealMemory")) or 0, "MB of memory"),
    ]
    for name, value, want, have, unit in wants:
        if want and max(have(n) for n in nodes) < want:
            if name == "gpus" and req.gpu_type and not any(_gpus(n, None) for n in nodes if _gpus(n, req.gpu_type)):
                types = sorted({t or "untyped" for n in nodes for t, _ in _GRES_GPU.findall(n.get("Gres", ""))})
                return "gpu_type", req.gpu_type, f"no node of {where} has it; GPU types: {', '.join(types) or 'none'}"
            most = max(have(n) for n in nodes)
            return name, value, f"the nodes of {where} have at most {most} {unit} each"
    fitting = [n for n in nodes if all(have(n) >= want for _, _, want, have, _ in wants if want)]
    if len(fitting) < req.nodes:
        each = ", ".join(f"{want} {unit}" for _, _, want, _, unit in wants if want)
        return "nodes", req.nodes, f"only {len(fitting)} node(s) of {where} have {each} each"
    return None


def _gpus(node: dict[str, str], gpu_type: str | None) -> int:
    return sum(int(n) for t, n in _GRES_GPU.findall(node.get("Gres", "")) if gpu_type is None or t == gpu_type)


def _summary(req: JobRequest, partition: str | None) -> str:
    parts = [f"nodes={req.nodes}", f"gpus={req.gpus}", f"cpus_per_task={req.cpus_per_task}"]
    parts += [f"mem_mb={req.mem_mb}"] if req.mem_mb else []
    parts += [f"partition {partition}"] if partition else []
    return ", ".join(parts)


# --- accounts ------------------------------------------------------------------------------------------------------


def account_problem(p: Planned, cluster: Cluster, user: str) -> str | None:
    """The job names an account the user has no association with (when SLURM keeps accounting and knows the user)."""
    req = p.plan.request
    if not req.account:
        return None
    rows = cluster.associations(user)
    if not rows:  # no accounting, sacctmgr failed, or accounting does not know the user: SLURM decides at submission
        return None
    source = "" if "slurm_account" in p.given else "; set by --multinode-account"
    partitions = {part for account, part in rows if account == req.account}
    if not partitions:
        accounts = ", ".join(sorted({account for account, _ in rows}))
        allowed = f"user {user!r} cannot charge it (SLURM accounting); accounts {user} can charge: {accounts}"
        return str(RequestError(req.rule, "slurm_account", req.account, allowed + source))
    if "" in partitions:
        return None
    partition = req.partition or cluster.default_partition()
    if partition and set(partition.split(",")) <= partitions:
        return None
    allowed = f"user {user!r} may charge it only in partition(s) {', '.join(sorted(partitions))}"
    return str(RequestError(req.rule, "slurm_account", req.account, f"{allowed}, not {partition}{source}"))
