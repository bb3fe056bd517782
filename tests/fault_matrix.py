"""The matrix of features and faults (issue 53, part 4): which cases run, and how each must end.

Eight features a rule or a run sets meet seven faults a training meets. The full product is 2^8 x 7 = 1,792 runs;
`cases()` covers every PAIR of values instead (an all-pairs set), made by a small deterministic greedy algorithm:
each new case is the one that covers the most pairs not yet covered, built value by value. Invalid combinations are
constraints, never cases: a failed node check happens only under the site check that fails on one node, and that
check fails a node in every case it runs in, so it goes only with the failed node check.

`expected(case)` says how a case ends, derived from the documentation alone (docs/further.md, docs/reliability.md,
docs/training-contract.md): Snakemake's exit code, how many SLURM jobs ran (a Snakemake retry is a new job), whether
the job was requeued, whether a spare replaced a node, whether the retry left a node out. The cluster test
(tests/cluster/test_matrix_cluster.py) runs every case and holds it to this; tests/unit/test_fault_matrix.py holds
the generator to covering every pair. Pure: no SLURM, no Snakemake.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass

# The events, as the test injects them (tests/cluster/test_matrix_cluster.py: `inject`)
TIME_LIMIT = "time-limit signal"  # scancel --signal=USR2 to the job's steps, as SLURM's --signal=USR2@T sends it
ADMIN_REQUEUE = "admin requeue"  # scontrol requeue <job>
NODE_DEATH = "node death"  # the non-head training node's slurmd and every process of its namespace SIGKILLed
HUNG_RANK = "hung rank"  # the non-head node's rank SIGSTOPped
CRASHED_RANK = "crashed rank"  # the non-head node's rank SIGKILLed
STRAGGLER = "warned straggler"  # the non-head node's rank stopped 80% of the time (SIGSTOP/SIGCONT by pid)
CHECK_FAILS = "failed node check"  # the site's node check command fails on the second node of the check step
EVENTS = (TIME_LIMIT, ADMIN_REQUEUE, NODE_DEATH, HUNG_RANK, CRASHED_RANK, STRAGGLER, CHECK_FAILS)

FAILING_CHECK = "fails on one node"
# Each feature and its values; the first value is the default where the feature has one.
FEATURES: dict[str, tuple[object, ...]] = {
    "spare_nodes": (0, 1),  # resource
    "on_straggler": ("warn", "replace"),  # resource
    "node_check": ("default", FAILING_CHECK),  # the environment profile's node_check
    "on_stall": ("fail", "requeue"),  # resource
    "max_restarts": (3, 0),  # resource: in-job restarts of a crashed or stalled training
    "max_requeues": (3, 0),  # --multinode-max-requeues
    "retries": (0, 1),  # Snakemake's --retries
    "trackers": ("off", "on"),  # TensorBoard, W&B offline and MLflow (file store) through training/tracking.py
}
PARAMETERS: dict[str, tuple[object, ...]] = {"event": EVENTS, **FEATURES}


def allowed(values: Mapping[str, object]) -> bool:
    """A (partial) case is possible: the failed node check happens exactly under the failing site check."""
    if "event" in values and "node_check" in values:
        return (values["event"] == CHECK_FAILS) == (values["node_check"] == FAILING_CHECK)
    return True


Pair = tuple[tuple[str, object], tuple[str, object]]


def pairs_of(values: Mapping[str, object]) -> set[Pair]:
    """Every pair of (parameter, value) a case holds, in PARAMETERS' order."""
    names = [n for n in PARAMETERS if n in values]
    return {((a, values[a]), (b, values[b])) for a, b in itertools.combinations(names, 2)}


def all_pairs() -> set[Pair]:
    """Every pair of values of two parameters that some allowed case can hold."""
    found: set[Pair] = set()
    for a, b in itertools.combinations(PARAMETERS, 2):
        for x, y in itertools.product(PARAMETERS[a], PARAMETERS[b]):
            if allowed({a: x, b: y}):
                found.add(((a, x), (b, y)))
    return found


def _complete(seed: Pair, uncovered: set[Pair]) -> dict[str, object]:
    """A case from one uncovered pair: every other parameter, in order, takes the allowed value that covers the most
    uncovered pairs with the values chosen so far (the first such value on a tie)."""
    chosen: dict[str, object] = dict(seed)
    for name, choices in PARAMETERS.items():
        if name in chosen:
            continue
        best, gain = None, -1
        for value in choices:
            trial = {**chosen, name: value}
            if not allowed(trial):
                continue
            new = len({p for p in pairs_of(trial) if (name, value) in p} & uncovered)
            if new > gain:
                best, gain = value, new
        chosen[name] = best
    return {n: chosen[n] for n in PARAMETERS}


def _order(pair: Pair) -> tuple[int, ...]:
    (a, x), (b, y) = pair
    names = list(PARAMETERS)
    return (names.index(a), PARAMETERS[a].index(x), names.index(b), PARAMETERS[b].index(y))


def greedy_cases() -> list[dict[str, object]]:
    """The all-pairs set: while a pair is uncovered, the case (completed from each uncovered pair in turn) that
    covers the most uncovered pairs, the first on a tie. Deterministic: the same cases, in the same order, always."""
    uncovered = all_pairs()
    cases: list[dict[str, object]] = []
    while uncovered:
        best, gain = None, -1
        for seed in sorted(uncovered, key=_order):
            case = _complete(seed, uncovered)
            if (new := len(pairs_of(case) & uncovered)) > gain:
                best, gain = case, new
        assert best is not None
        cases.append(best)
        uncovered -= pairs_of(best)
    return cases


@dataclass(frozen=True)
class Case:
    number: int
    event: str
    spare_nodes: int
    on_straggler: str
    node_check: str
    on_stall: str
    max_restarts: int
    max_requeues: int
    retries: int
    trackers: str

    @property
    def name(self) -> str:
        return f"case{self.number:02d}"

    def values(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if k != "number"}


@functools.cache
def _cases() -> tuple[Case, ...]:
    return tuple(Case(i, **c) for i, c in enumerate(greedy_cases(), start=1))  # type: ignore[arg-type]


def cases() -> list[Case]:
    """The all-pairs cases, numbered (made once: about a second)."""
    return list(_cases())


@dataclass(frozen=True)
class Outcome:
    """How a case ends. `jobs`: SLURM jobs (a Snakemake retry is a new job); `requeued`: a job ran again as the same
    SLURM job; `replaced`: a spare took a node's place in the job; `restarted`: the training started again on the
    same nodes in the job; `excluded`: the retry left the failed node out."""

    rc: int
    jobs: int
    requeued: bool
    replaced: bool
    excluded: bool
    restarted: bool = False

    def describe(self) -> str:
        how = ["rc 0" if self.rc == 0 else f"fails (rc {self.rc})"]
        how += ["requeued, same job"] if self.requeued else []
        how += ["a spare replaces the node, same job"] if self.replaced else []
        how += ["restarted on the same nodes, same job"] if self.restarted else []
        if self.jobs > 1:
            how += ["retried as a new job" + (" without the node" if self.excluded else "")]
        return "; ".join(how)


def expected(case: Case) -> Outcome:
    """How the documentation says the case ends.

    - time-limit signal: the training checkpoints and writes the preempt file; the job requeues itself, at most
      max-requeues times; with 0 it ends with exit 85 and --retries resumes (training-contract.md 1; further.md
      "Checkpoint before the time limit"). A job requeues itself unless a spare REPLACED a node in it: a warned
      straggler is no replacement (further.md "Spare nodes", "Stragglers").
    - admin requeue: news, not a failure: the job's next run resumes (reliability.md, first row); admin requeues do
      not count against max-requeues (further.md, --multinode-max-requeues).
    - node death, crashed rank, failed node check: the failure names the node; with a spare left the spare takes its
      place in the same job (a spare first, restarts.md); a crashed rank on a node that still answers is else
      restarted on the same nodes while max_restarts allows (restarts.md "In-job restarts"); otherwise the job fails
      naming the node and the retry excludes it (further.md "Spare nodes", "Node check"; reliability.md, "a node's
      rank fails, or a node dies"). A dead node or a failed check is never restarted.
    - hung rank: the stall watchdog ends the step after stall_timeout. With one rank per node the stacks have no
      majority, so no node is named and a spare does not help: the training is restarted in the job while
      max_restarts allows (restarts.md), else on_stall decides (reliability.md "Stalls"): fail ends the job with
      exit 87 (--retries runs it again, no node left out); requeue requeues it like the time-limit signal, within
      max-requeues (else exit 85).
    - warned straggler: named, the training goes on; with on_straggler replace and a spare, the spare takes its place
      in the same job (further.md "Stragglers").
    """
    requeued = replaced = restarted = failed = named = False
    if case.event == TIME_LIMIT:
        requeued = case.max_requeues > 0
        failed = not requeued
    elif case.event == ADMIN_REQUEUE:
        requeued = True
    elif case.event in (NODE_DEATH, CRASHED_RANK, CHECK_FAILS):
        replaced = case.spare_nodes > 0
        restarted = case.event == CRASHED_RANK and not replaced and case.max_restarts > 0
        failed = named = not (replaced or restarted)
    elif case.event == HUNG_RANK:
        restarted = case.max_restarts > 0
        requeued = not restarted and case.on_stall == "requeue" and case.max_requeues > 0
        failed = not (restarted or requeued)
    elif case.event == STRAGGLER:
        replaced = case.on_straggler == "replace" and case.spare_nodes > 0
    retried = failed and case.retries > 0
    return Outcome(
        rc=1 if failed and not retried else 0,
        jobs=2 if retried else 1,
        requeued=requeued,
        replaced=replaced,
        excluded=retried and named,
        restarted=restarted,
    )


def covered(chosen: Sequence[Case]) -> set[Pair]:
    return set().union(*(pairs_of(c.values()) for c in chosen)) if chosen else set()


def rows(chosen: Sequence[Case]) -> Iterator[dict[str, object]]:
    """Each case with its expected outcome, as the result file holds them."""
    for case in chosen:
        yield {"case": case.name, **case.values(), "expected": asdict(expected(case))}
