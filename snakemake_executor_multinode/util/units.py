"""Durations and sizes read with Snakemake's own rules (snakemake/resources.py `Resource.parse_human_friendly`, which
uses humanfriendly's parse_timespan/parse_size), re-implemented because the core imports neither Snakemake nor
humanfriendly: a value `multinode preview` accepts means what Snakemake makes of it. tests/unit/planning/test_request.py
compares them with Snakemake's on a table and on random strings.
"""

from __future__ import annotations

import math
import re
from typing import Any

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


def timespan_seconds(text: str) -> float:
    """Seconds of a duration as Snakemake writes them ('90s', '20m', '1.5h')."""
    return _timespan_seconds(text.strip().strip("'\""))


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


def read_runtime(value: Any) -> tuple[int, str | None]:
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
    return read_runtime(value)[0]


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


def runtime_hint(value: Any) -> str:
    text = str(value).strip().strip("'\"")
    minutes = None
    if m := _SLURM_TIME.match(text):
        a = int(m.group("a"))
        b, c = (int(x) if x is not None else None for x in m.group("b", "c"))
        if m.group("d"):
            minutes = int(m.group("d")) * 1440 + a * 60 + (b or 0) + ((c or 0) + 59) // 60
        elif c is not None:
            minutes = a * 60 + (b or 0) + (c + 59) // 60  # c matches only after b
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
