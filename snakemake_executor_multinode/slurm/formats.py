"""SLURM's own text formats, read (and its clock written) in one place: times, sizes, TRES lists, GPUs per node and
array task ranges, as squeue and sacct print them. Pure functions: no command runs here (client.py runs them)."""

from __future__ import annotations

import re
from datetime import datetime

_SIZE = re.compile(r"^([0-9.]+)([KMGTP]?)$")


# --- times ------------------------------------------------------------------------------------------------------
def epoch(text: str) -> float | None:
    """sacct's Start, End or Submit (ISO local time, sacct's default format) as epoch seconds; None for Unknown,
    None (not started) or anything else."""
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        return None


def clock_to_seconds(text: str) -> int | None:
    """SLURM's [D-]HH:MM:SS, MM:SS or M:SS (squeue's TimeUsed, TimeLimit); None for UNLIMITED, NOT_SET."""
    text = text.strip()
    days = 0
    if "-" in text:
        day, _, text = text.partition("-")
        if not day.isdigit():
            return None
        days = int(day)
    parts = text.split(":")
    if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
        return None
    seconds = 0
    for p in parts:
        seconds = seconds * 60 + int(p)
    return days * 86400 + seconds


def clock(seconds: int | None) -> str:
    """Seconds as SLURM writes a time ([D-]H:MM:SS); "-" for none."""
    if seconds is None:
        return "-"
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def minutes_to_seconds(text: str) -> int | None:
    """sacct's TimelimitRaw: minutes, or UNLIMITED / Partition_Limit (None: no figure to compare with)."""
    return int(text) * 60 if text.strip().isdigit() else None


def cpu_seconds(text: str) -> float:
    """sacct's TotalCPU: [D-][HH:]MM:SS[.mmm] -> seconds (0 when empty)."""
    text = text.strip()
    if not text:
        return 0.0
    days = 0
    if "-" in text:
        day, _, text = text.partition("-")
        days = int(day)
    seconds = 0.0
    for part in text.split(":"):
        seconds = seconds * 60 + float(part)
    return days * 86400 + seconds


# --- sizes and resources ----------------------------------------------------------------------------------------
def size_mb(text: str) -> float | None:
    """sacct sizes (MaxRSS 221392K, TRES mem=4G, 500M; binary units) in MiB; None when empty or 0."""
    match = _SIZE.match(text.strip())
    if not match:
        return None
    number, unit = float(match[1]), match[2]
    if number <= 0:
        return None  # nothing sampled: no figure, not a job that used no memory
    return number * 1024 ** ("KMGTP".index(unit) - 1) if unit else number / 1024 / 1024  # no unit: bytes


def tres_map(text: str) -> dict[str, str]:
    """`billing=4,cpu=4,gres/gpu=4,mem=4G,node=2` -> {"cpu": "4", "gres/gpu": "4", ...}; typed GPUs
    (gres/gpu:a100=4) are counted in the plain gres/gpu entry too."""
    pairs = (item.partition("=") for item in text.split(",") if "=" in item)
    return {key: value for key, _, value in pairs}


def gres_gpus(text: str) -> int | None:
    """GPUs per node from squeue's tres-per-node: `gres:gpu:8`, `gres:gpu:a100:4`, `gpu:8`; N/A: none."""
    if not text or text in ("N/A", "(null)"):
        return 0
    for item in text.split(","):
        parts = item.replace("/", ":").split(":")
        if "gpu" in parts and parts[-1].isdigit():
            return int(parts[-1])
    return 0


# --- node lists -------------------------------------------------------------------------------------------------
def hostlist(text: str) -> list[str]:
    """SLURM's compact node list as names: "node[1-3,7],gpu[01-02]" -> node1 node2 node3 node7 gpu01 gpu02 (zero
    padding kept, several bracket groups in one name expanded in turn). "None assigned", "(null)", "": none."""
    text = text.strip()
    if not text or text in ("None assigned", "(null)", "None"):
        return []
    names: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text + ","):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            names += _expand(text[start:i])
            start = i + 1
    return [n for n in names if n]


def _expand(name: str) -> list[str]:
    head, sep, rest = name.partition("[")
    if not sep or "]" not in rest:
        return [name]
    inside, _, tail = rest.partition("]")
    out = []
    for part in inside.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return [name]  # not SLURM's form: the text as it is
        width = len(low)
        out += [f"{head}{n:0{width}d}{t}" for n in range(int(low), int(high or low) + 1) for t in _expand(tail)]
    return out


# --- job arrays -------------------------------------------------------------------------------------------------
def array_tasks(spec: str) -> list[int]:
    """The tasks of an array record's id: "[0-3,7]" -> 0, 1, 2, 3, 7 (a "%N" limit is dropped)."""
    tasks: list[int] = []
    for part in spec.strip("[]").split("%")[0].split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (high.isdigit() or not high):
            tasks += range(int(low), int(high or low) + 1)
    return tasks
