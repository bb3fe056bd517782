"""The launcher's resources: what a rule tells `multinode torchrun` (stall_timeout, on_stall, max_restarts,
on_straggler, straggler_factor, straggler_window, spare_nodes), and own_launcher (the command starts its ranks
itself, so none of them reaches a launcher of ours). Their names, defaults and checks, and the job script's
variables they become, live here and nowhere else in planning: a new launcher resource is a field, a reader and a
variable here, its variable's name in contract/protocol.py, the launcher's read of it and its row in
docs/resources.md. SLURM's resources are request.py's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.launching import straggler
from snakemake_executor_multinode.planning.resource_values import RequestError, given, read_int
from snakemake_executor_multinode.util.units import timespan_seconds

# The resources of this module (request.py's known resources include them).
NAMES = frozenset(
    {
        "stall_timeout",
        "on_stall",
        "max_restarts",
        "on_straggler",
        "straggler_factor",
        "straggler_window",
        "spare_nodes",
        "own_launcher",
    }
)
# Resources a profile may set for every rule that uses it (environment.py takes these keys; a rule's own wins).
PROFILE_RESOURCES = (
    "stall_timeout", "on_stall", "on_straggler", "straggler_factor", "straggler_window", "max_restarts",
)  # fmt: skip
# A multi-node `multinode torchrun` job with no stall_timeout of its own (rule or profile) gets the adaptive timeout
# (None here, protocol.STALL_AUTO in the job script): the training's own pace (launching/stall.py, adaptive_timeout).
ON_STALL = ("fail", "requeue")
# In-job restarts of a crashed or stalled training on the same nodes (launching/restarts.py), per run of the job.
DEFAULT_MAX_RESTARTS = 3
# The launcher's straggler check (launching/straggler.py, which owns its values): a node whose ranks are busy more
# than FACTOR times the other nodes' median per step for WINDOW seconds in a row is named; `replace` also swaps in a
# spare where one is left.
ON_STRAGGLER = straggler.ON_STRAGGLER
DEFAULT_STRAGGLER_FACTOR = straggler.DEFAULT_FACTOR
DEFAULT_STRAGGLER_WINDOW_S = int(straggler.DEFAULT_WINDOW_S)


@dataclass(frozen=True)
class LauncherResources:
    """The launcher's resources of one job, validated."""

    stall_timeout_s: int | None = 0  # the launcher's progress watchdog: seconds; None: the adaptive timeout; 0: off
    on_stall: str = "fail"  # fail | requeue (resumes from the last checkpoint), once no restart is left
    max_restarts: int = DEFAULT_MAX_RESTARTS  # in-job restarts on the same nodes (launching/restarts.py); 0: none
    on_straggler: str = "warn"  # warn | replace (a spare takes the slow node's place, where one is left)
    straggler_factor: float = DEFAULT_STRAGGLER_FACTOR  # > 1: how many times the other nodes' median busy time
    straggler_window_s: int = DEFAULT_STRAGGLER_WINDOW_S  # that long in a row before a node is named
    own_launcher: bool = False  # the command starts its ranks itself (srun, mpirun): no launcher check (launcher_use)
    # Nodes asked for beyond `nodes` (--no-kill): `multinode torchrun` trains on `nodes` of the allocation and
    # replaces a failed node with one of these in the same job (launching/spares.py); 0: none.
    spare_nodes: int = 0

    def variables(self, nodes: int, crash_loop_runs: int) -> dict[str, str]:
        """What `multinode torchrun` reads of the job's resources (and of the crash-loop setting, which the job
        script applies too); the job script exports each."""
        stall = protocol.STALL_AUTO if self.stall_timeout_s is None else str(self.stall_timeout_s)
        out = {
            protocol.STALL_TIMEOUT_VAR: stall,
            protocol.ON_STALL_VAR: self.on_stall,
            protocol.MAX_RESTARTS_VAR: str(self.max_restarts),
            protocol.CRASH_LOOP_RUNS_VAR: str(crash_loop_runs),
            protocol.ON_STRAGGLER_VAR: self.on_straggler,
            protocol.STRAGGLER_FACTOR_VAR: f"{self.straggler_factor:g}",
            protocol.STRAGGLER_WINDOW_VAR: str(self.straggler_window_s),
        }
        if self.spare_nodes:  # without spares the launcher trains on the whole allocation, as it always did
            out[protocol.TRAIN_NODES_VAR] = str(nodes)
        return out


def read_first(
    rule: str,
    r: Mapping[str, Any],
    profile: Mapping[str, Any],
    *,
    nodes: int,
    site_launcher: bool,
    warnings: list[str],
) -> LauncherResources:
    """own_launcher, stall_timeout and max_restarts of a rule's resources `r`, falling back to its environment
    profile's keys; `read_rest` reads the others. Two steps, around SLURM's resources (request.build_request): a rule
    with several bad values hears of the same one first as it always did. `site_launcher`: the command starts its
    ranks with a site's own launcher (--multinode-launchers), where no stall watchdog runs. A resource that has no
    effect is said in `warnings`, not dropped in silence."""
    own_launcher = _own_launcher(rule, r)
    watched = nodes > 1 and not own_launcher and not site_launcher
    stall_timeout_s = _stall_timeout(rule, r, profile, watched=watched)
    if site_launcher and stall_timeout_s:  # no watchdog runs in a site's launcher
        warnings.append(
            f"rule {rule!r}: stall_timeout has no effect: its command starts a --multinode-launchers command, not "
            "`multinode torchrun`, whose progress watchdog it sets"
        )
        stall_timeout_s = 0
    max_restarts = _max_restarts(rule, r, profile)
    if (site_launcher or own_launcher) and given(r, "max_restarts"):
        warnings.append(
            f"rule {rule!r}: max_restarts has no effect: its command starts its ranks itself "
            f"({'a --multinode-launchers command' if site_launcher else 'own_launcher'}), and only `multinode "
            "torchrun` restarts a training in the job"
        )
    return LauncherResources(stall_timeout_s=stall_timeout_s, max_restarts=max_restarts, own_launcher=own_launcher)


def read_rest(
    rule: str, r: Mapping[str, Any], profile: Mapping[str, Any], first: LauncherResources, *, nodes: int
) -> LauncherResources:
    """The launcher's resources `read_first` left, added to what it read (after SLURM's resources)."""
    return replace(
        first,
        on_stall=_on_stall(rule, r, profile),
        on_straggler=_on_straggler(rule, r, profile),
        straggler_factor=_straggler_factor(rule, r, profile),
        straggler_window_s=_straggler_window(rule, r, profile),
        spare_nodes=_spare_nodes(rule, r, nodes),
    )


def _where(r: Mapping[str, Any], key: str) -> str:
    """The name a refusal gives a setting: the rule's resource, or the environment profile's key it fell back to."""
    return key if key in r else f"env_profile {key}"


def _stall_timeout(rule: str, r: Mapping[str, Any], profile: Mapping[str, Any], watched: bool) -> int | None:
    """Seconds without progress before the launcher ends the step: the rule's, the profile's, or for a `watched` job
    (multi-node, started by `multinode torchrun`, whose watchdog it is) None, the adaptive timeout; a duration with
    its unit ('20m', '90s', '1h'), or 'off' / 0."""
    value = r.get("stall_timeout", profile.get("stall_timeout"))
    if value is None:
        return None if watched else 0
    if value in (0, "0", "off", "none", False):
        return 0
    allowed = "a duration with its unit, e.g. '20m', '90s' or '1h' (a bare number is ambiguous), or 'off'"
    return _duration(rule, _where(r, "stall_timeout"), value, allowed)


def _duration(rule: str, where: str, value: Any, allowed: str) -> int:
    """Whole seconds (at least 1) of a duration written with its unit ('20m', '90s', '1h')."""
    if isinstance(value, bool) or not isinstance(value, str) or not re.search(r"[A-Za-z]", value):
        raise RequestError(rule, where, value, allowed)
    try:
        seconds = timespan_seconds(value)
    except ValueError as err:
        raise RequestError(rule, where, value, allowed) from err
    if seconds <= 0:
        raise RequestError(rule, where, value, allowed)
    return max(1, round(seconds))


def _own_launcher(rule: str, r: Mapping[str, Any]) -> bool:
    value = r.get("own_launcher", False)
    # --set-resources hands over text
    read = {True: True, False: False, "True": True, "False": False, "true": True, "false": False}
    if isinstance(value, bool | str) and value in read:
        return read[value]
    raise RequestError(
        rule,
        "own_launcher",
        value,
        "True (the command starts its ranks on every node itself, e.g. with srun or mpirun) or False",
    )


def _max_restarts(rule: str, r: Mapping[str, Any], profile: Mapping[str, Any]) -> int:
    value = r.get("max_restarts", profile.get("max_restarts"))
    if value is None:
        return DEFAULT_MAX_RESTARTS
    allowed = (
        "an integer >= 0: how many times `multinode torchrun` starts a crashed or stalled training again on the same "
        "nodes in one run of the job (0: never)"
    )
    return read_int(rule, _where(r, "max_restarts"), value, 0, allowed)


def _on_stall(rule: str, r: Mapping[str, Any], profile: Mapping[str, Any]) -> str:
    value = r.get("on_stall", profile.get("on_stall", "fail"))
    if value not in ON_STALL:
        raise RequestError(rule, _where(r, "on_stall"), value, "'fail' or 'requeue' (resume from the last checkpoint)")
    return str(value)


def _on_straggler(rule: str, r: Mapping[str, Any], profile: Mapping[str, Any]) -> str:
    value = r.get("on_straggler", profile.get("on_straggler", "warn"))
    if value not in ON_STRAGGLER:
        allowed = "'warn' (name the slow node in the log and status) or 'replace' (also swap in a spare node)"
        raise RequestError(rule, _where(r, "on_straggler"), value, allowed)
    return str(value)


def _straggler_factor(rule: str, r: Mapping[str, Any], profile: Mapping[str, Any]) -> float:
    value = r.get("straggler_factor", profile.get("straggler_factor", DEFAULT_STRAGGLER_FACTOR))
    allowed = "a number above 1: how many times the other nodes' busy time per step, e.g. 1.5"
    try:  # --set-resources hands over text
        factor = float(value) if isinstance(value, int | float | str) and not isinstance(value, bool) else 0.0
    except ValueError as err:
        raise RequestError(rule, _where(r, "straggler_factor"), value, allowed) from err
    if not math.isfinite(factor) or factor <= 1:
        raise RequestError(rule, _where(r, "straggler_factor"), value, allowed)
    return factor


def _straggler_window(rule: str, r: Mapping[str, Any], profile: Mapping[str, Any]) -> int:
    value = r.get("straggler_window", profile.get("straggler_window"))
    if value is None:
        return DEFAULT_STRAGGLER_WINDOW_S
    allowed = "a duration with its unit, e.g. '2m' or '90s' (a bare number is ambiguous)"
    return _duration(rule, _where(r, "straggler_window"), value, allowed)


def _spare_nodes(rule: str, r: Mapping[str, Any], nodes: int) -> int:
    """Extra nodes the launcher may swap in for a failed one; a one-node job has no peer to keep training with a
    replacement (a requeue or retry moves it to another node anyway), so spares need nodes >= 2."""
    if not given(r, "spare_nodes"):
        return 0
    spares = read_int(rule, "spare_nodes", r["spare_nodes"], 0, "a non-negative integer (nodes kept for replacements)")
    if spares and nodes < 2:
        raise RequestError(
            rule,
            "spare_nodes",
            r["spare_nodes"],
            f"needs nodes >= 2 (this rule has nodes={nodes}): a spare replaces a failed node of a multi-node "
            "training in the same job; a one-node job is moved to another node by its requeue or retry instead",
        )
    return spares
