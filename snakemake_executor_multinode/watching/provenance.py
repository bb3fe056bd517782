"""Every output says how it was made: one provenance record per job, written when the run sees the job end.

Two halves. At submission (`submission`), what the plan knows: rule, wildcards, the command, the job script's hash,
the code (snapshot digest, git commit, hash of the uncommitted changes; or the hashes of the files the command names),
the resolved environment profile (values of secret-looking variables are never written), the container image, the
submitting side's Snakemake and plugin, the run id the job's every run logs its curves under ($MULTINODE_RUN_ID).
In the job (`multinode provenance --start FILE`, one line per run of the job:
the first, each requeue, each SLURM restart): job id, restart count, nodes, this node's GPUs (where nvidia-smi
answers), the job environment's Python, torch, NCCL, ColossalAI, Snakemake and plugin versions (read from package
metadata: no torch import), and the container image's digest (podman); the job script's EXIT trap adds the run's
end and exit code. `finish` joins both halves into the record of every output of the job, written atomically and
readable by its owner only, under .snakemake/multinode/provenance/.

`multinode provenance PATH` prints an output's record; `--diff A B` says what differs between two outputs' records
(the command: cli/provenance.py).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snakemake_executor_multinode import __version__
from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.contract.jobfiles import PROVENANCE_DIR
from snakemake_executor_multinode.contract.jsonl import json_lines
from snakemake_executor_multinode.contract.state_files import Damaged, ignored, read_json
from snakemake_executor_multinode.util.private_files import StateWriteError, write_private

SECRET = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY|AUTH", re.I)
REDACTED = "<redacted>"
PACKAGES = ("torch", "colossalai", "snakemake", "snakemake-executor-plugin-multinode", "numpy", "transformers")
NCCL_PACKAGES = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")


class ProvenanceError(OSError):
    """A record that could not be written: the job's bookkeeping fails, loudly."""


def redacted(profile: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved environment profile with the value of every secret-looking variable replaced (never written)."""

    def clean(key: str, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: clean(str(k), v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(key, v) for v in value]
        return REDACTED if SECRET.search(key) else value

    return {k: clean(str(k), v) for k, v in profile.items()}


def submission(
    *,
    rule: str,
    wildcards: Mapping[str, str],
    command: str,
    script: str,
    code: Mapping[str, Any],
    environment: Mapping[str, Any],
    outputs: Sequence[str],
    inherited_versions: bool = False,
    run_id: str = "",
) -> dict[str, Any]:
    """What the plan knows of a job when it is submitted. inherited_versions: the job runs in this (the submitting)
    side's environment and reads no versions itself (the plan's versions_in_job), so the record holds these."""
    container = environment.get("container") or {}
    return {
        "rule": rule,
        "wildcards": dict(wildcards),
        "outputs": list(outputs),
        "run_id": run_id,  # $MULTINODE_RUN_ID: the trackers' experiment (W&B run id, MLflow tag, TensorBoard folder)
        "command": command,
        "job_script_sha256": hashlib.sha256(script.encode()).hexdigest(),
        "code": dict(code),
        "environment": redacted(environment),
        "container": {"image": container.get("image")} if isinstance(container, Mapping) and container else None,
        "submitted": {
            "time": _now(),
            "host": socket.gethostname(),
            "snakemake": _version("snakemake"),
            "plugin": __version__,
        },
        **({"versions": dict(versions()), "versions_from": "the submitting side (the job inherits its environment)"}
           if inherited_versions else {}),
    }  # fmt: skip


def save_submission(workdir: Path, job_name: str, record: Mapping[str, Any]) -> None:
    _write(workdir / PROVENANCE_DIR / "jobs" / f"{job_name}.json", record)


def finish(workdir: Path, job_name: str, runs_file: Path | None, ended: Mapping[str, Any]) -> dict[str, Any] | None:
    """The job's whole record (its submission half and every run's lines), written for each of its outputs;
    None for a job submitted before records were kept, or whose submission half is damaged (said, and left out:
    the job's result stands). ProvenanceError when it cannot be written."""
    path = workdir / PROVENANCE_DIR / "jobs" / f"{job_name}.json"
    try:
        record = _record(path)
    except FileNotFoundError:
        return None
    except Damaged as err:
        ignored(err, f"the outputs of job {job_name} get no provenance record (the job's result stands)")
        return None
    record["runs"] = _runs(runs_file)
    record["ended"] = dict(ended)
    for output in record["outputs"]:
        _write(record_path(workdir, output), record)
    return record


def _record(path: Path) -> dict[str, Any]:
    """A provenance record (a job's or an output's); FileNotFoundError, or Damaged when it is no record of ours."""
    record = read_json(path)
    outputs = record.get("outputs") if isinstance(record, dict) else None
    if not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs):
        raise Damaged(path, "not a provenance record (no list of outputs)")
    return record


def record_path(workdir: Path, output: str) -> Path:
    key = hashlib.sha256(os.path.normpath(output).encode()).hexdigest()[:32]
    return workdir / PROVENANCE_DIR / "outputs" / f"{key}.json"


def find(workdir: Path, output: str) -> dict[str, Any] | None:
    """The record of an output (a path relative to the working directory, or absolute inside it); None when there
    is none, Damaged when its file is cut short, garbage or another user's."""
    path = Path(output)
    if path.is_absolute():
        try:
            path = path.resolve().relative_to(workdir.resolve())
        except ValueError:
            return None
    try:
        return _record(record_path(workdir, str(path)))
    except FileNotFoundError:
        return None


# What --diff compares, by theme: (label, keys into the record)
THEMES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("code", ("code",)),
    ("config", ("rule", "wildcards", "command", "job_script_sha256")),
    ("environment", ("environment", "container", "versions")),
    ("nodes", ("nodes", "gpus")),
)


def diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """What differs between two records, theme by theme: one line per differing leaf."""
    fa, fb = _flat(_comparable(a)), _flat(_comparable(b))
    lines = []
    for theme, keys in THEMES:
        for key in sorted(set(fa) | set(fb)):
            if key.split(".")[0] in keys and fa.get(key) != fb.get(key):
                lines.append(f"{theme}: {key}: {fa.get(key, '-')!r} -> {fb.get(key, '-')!r}")
    return lines


def _comparable(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record with its runs' versions, nodes and GPUs lifted out (of the last run): what made the output."""
    starts = [r for r in record.get("runs", []) if r.get("event") == "start"]
    last = starts[-1] if starts else {}
    found = last.get("versions") or record.get("versions")
    return {**record, "versions": found, "nodes": last.get("nodes"), "gpus": last.get("gpus")}


@dataclass(frozen=True)
class Summary:
    """A record in a few words (a row of the report's provenance table)."""

    rule: str  # with its wildcards
    jobs: str  # the SLURM job(s) of its runs, with the number of runs
    nodes: str  # of the last run
    code: str
    versions: str  # of the last run (or the submitting side's, when the job inherited its environment)
    ended: str


VERSION_LABELS = {"snakemake-executor-plugin-multinode": "plugin"}


def summary(record: Mapping[str, Any]) -> Summary:
    wildcards = record.get("wildcards") or {}
    starts = [r for r in record.get("runs", []) if r.get("event") == "start"]
    jobs = list(dict.fromkeys(str(r.get("job")) for r in starts))
    code = record.get("code") or {}
    if code.get("snapshot"):
        text = f"snapshot {str(code['snapshot'])[:12]}"
        text += f", commit {str(code['commit'])[:12]}" if code.get("commit") else ""
        text += f" + uncommitted changes {str(code['uncommitted'])[:12]}" if code.get("uncommitted") else ""
    else:
        text = f"{len(code.get('files') or {})} file(s) the command names, hashed"
    found = _comparable(record)
    versions = ", ".join(f"{VERSION_LABELS.get(k, k)} {v}" for k, v in (found["versions"] or {}).items() if v)
    image = (record.get("container") or {}).get("image")
    ended = record.get("ended") or {}
    named = ", ".join(f"{k}={v}" for k, v in wildcards.items())
    return Summary(
        rule=record.get("rule", "?") + (f" ({named})" if named else ""),
        jobs=f"{', '.join(jobs) or '-'} ({len(starts)} run(s))",
        nodes=str(found["nodes"] or "-"),
        code=text,
        versions=versions + (f"; container {image}" if image else ""),
        ended=f"{ended.get('state', '-')} {ended.get('time', '')}".strip(),
    )


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out |= _flat(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    return {prefix: obj}


# --- in the job -------------------------------------------------------------------------------------------------
@functools.cache  # the same in one process: a run records them for each job it submits
def versions() -> dict[str, str | None]:
    """The job environment's versions, from package metadata (nothing is imported)."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        found[name] = _version(name)
    found["nccl"] = next((v for n in NCCL_PACKAGES if (v := _version(n))), None)
    return found


def gpus() -> list[str]:
    """This node's GPUs as nvidia-smi names them ("NVIDIA H200, GPU-<uuid>"); [] where it does not answer."""
    try:
        proc = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,uuid", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()] if proc.returncode == 0 else []


def container_digest(env: Mapping[str, str]) -> str | None:
    if env.get(protocol.CONTAINER_RUNTIME_VAR) != "podman" or not env.get(protocol.CONTAINER_IMAGE_VAR):
        return None
    try:
        proc = subprocess.run(
            ["podman", "image", "inspect", "--format", "{{.Digest}}", env[protocol.CONTAINER_IMAGE_VAR]],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def start_line(env: Mapping[str, str]) -> dict[str, Any]:
    return {
        "event": "start",
        "job": env.get("SLURM_JOB_ID"),
        "restart": int(env.get("SLURM_RESTART_COUNT") or 0),
        "nodes": env.get("SLURM_JOB_NODELIST"),
        "train_nodes": int(env[protocol.NODES_VAR]) if env.get(protocol.NODES_VAR, "").isdigit() else None,
        "host": socket.gethostname(),
        "time": _now(),
        "gpus": gpus(),
        "versions": versions(),
        "container_digest": container_digest(env),
    }


def _runs(path: Path | None) -> list[dict[str, Any]]:
    return [line for line in json_lines(path) if isinstance(line, dict)] if path is not None else []


def _write(path: Path, record: Mapping[str, Any]) -> None:
    """Atomically (a reader never sees half), readable by the owner only (records name hosts, paths, commands)."""
    try:
        path.parent.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # provenance/: owner only, as its files
        path.parent.mkdir(exist_ok=True, mode=0o700)
        write_private(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    except StateWriteError as err:  # names the file (and, on a full disk, the bytes needed and free)
        raise ProvenanceError(f"the provenance record: {err}") from err
    except OSError as err:
        raise ProvenanceError(f"cannot write the provenance record {path}: {err}") from err


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def write_start(path: Path) -> int:
    """This run's start line, appended to the job's runs file."""
    line = json.dumps(start_line(os.environ), sort_keys=True)
    with open(path, "a") as fh:
        fh.write(line + "\n")
    return 0
