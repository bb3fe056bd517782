"""What reading any one resource needs: the refusal (RequestError) and the readers of a count and of a given value,
shared by SLURM's resources (request.py) and the launcher's (launcher_resources.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class RequestError(ValueError):
    """Bad input in a rule's resources or the plugin settings; names rule, field, value and what is allowed.
    `message` replaces the usual sentence for a refusal of the job as a whole (what its command would leave idle,
    a directive that cannot work), which says its own why and fix."""

    def __init__(self, rule: str, fieldname: str, value: Any, allowed: str = "", *, message: str = "") -> None:
        self.rule, self.field, self.value, self.allowed = rule, fieldname, value, allowed
        super().__init__(message or f"rule {rule!r}: resource {fieldname}={value!r} is invalid: {allowed}")


def read_int(rule: str, name: str, value: Any, low: int, allowed: str) -> int:
    """An integer of at least `low`; --set-resources hands over text, a YAML profile may hand over 2.0."""
    if isinstance(value, bool):
        raise RequestError(rule, name, value, allowed)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or value < low:
        raise RequestError(rule, name, value, allowed)
    return value


def given(r: Mapping[str, Any], key: str) -> bool:
    return r.get(key) not in (None, "")
