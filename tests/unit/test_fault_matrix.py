"""The matrix of features and faults (tests/fault_matrix.py) covers every pair of values with the fewest cases, never
an impossible one, and the committed result file (rendered into docs/evidence.md) holds exactly its cases."""

from __future__ import annotations

import itertools
import json

from tests import fault_matrix as fm
from tests.helpers import REPO


def test_the_cases_cover_every_possible_pair_of_values_and_only_possible_ones():
    cases = fm.cases()
    pairs = fm.all_pairs()
    assert fm.covered(cases) >= pairs, sorted(pairs - fm.covered(cases), key=str)
    assert all(fm.allowed(c.values()) for c in cases)
    # every pair of parameters contributes all its value pairs but the impossible ones
    for a, b in itertools.combinations(fm.PARAMETERS, 2):
        for x, y in itertools.product(fm.PARAMETERS[a], fm.PARAMETERS[b]):
            assert (((a, x), (b, y)) in pairs) == fm.allowed({a: x, b: y}), (a, x, b, y)
    assert ((("event", fm.NODE_DEATH), ("node_check", fm.FAILING_CHECK))) not in pairs
    assert ((("event", fm.CHECK_FAILS), ("node_check", "default"))) not in pairs


def test_the_fewest_cases_all_pairs_allows_and_the_same_ones_every_time():
    cases = fm.cases()
    # each event meets both values of every feature: at least 2 cases per event
    assert len(cases) == 2 * len(fm.EVENTS)
    assert fm.cases() == cases
    assert [c.name for c in cases] == [f"case{i:02d}" for i in range(1, len(cases) + 1)]


def test_the_documented_outcomes_follow_the_features_that_decide_them():
    by_event: dict[str, list[fm.Case]] = {}
    for case in fm.cases():
        by_event.setdefault(case.event, []).append(case)
    for case in by_event[fm.ADMIN_REQUEUE]:  # max-requeues counts the job's own requeues only
        assert fm.expected(case) == fm.Outcome(0, 1, requeued=True, replaced=False, excluded=False)
    for case in by_event[fm.HUNG_RANK]:  # one rank per node: no majority among the stacks, no node to replace
        assert not fm.expected(case).replaced
        assert fm.expected(case).restarted == (case.max_restarts > 0)  # restarted in the job while one is left
    for case in by_event[fm.CRASHED_RANK]:  # a spare first, then an in-job restart, then the retry
        outcome = fm.expected(case)
        assert outcome.restarted == (case.spare_nodes == 0 and case.max_restarts > 0)
        assert outcome.rc == 0 or not (outcome.replaced or outcome.restarted)
    for case in by_event[fm.NODE_DEATH] + by_event[fm.CHECK_FAILS]:  # a lost or failed node is never restarted
        assert not fm.expected(case).restarted
    for case in by_event[fm.STRAGGLER]:  # a warning never fails nor requeues the job
        outcome = fm.expected(case)
        assert (outcome.rc, outcome.jobs, outcome.requeued) == (0, 1, False)
        assert outcome.replaced == (case.on_straggler == "replace" and case.spare_nodes > 0)
    for case in fm.cases():
        outcome = fm.expected(case)
        assert outcome.jobs == 1 or case.retries > 0  # a new job is Snakemake's retry
        assert not outcome.excluded or case.event in (fm.NODE_DEATH, fm.CRASHED_RANK, fm.CHECK_FAILS)


def test_the_committed_result_file_holds_every_case_as_the_generator_makes_it():
    result = json.loads((REPO / "benchmarks" / "results-matrix.json").read_text())
    ran = [{k: row[k] for k in ("case", *fm.PARAMETERS, "expected")} for row in result["cases"]]
    assert ran == list(fm.rows(fm.cases())), "run the matrix again (MULTINODE_MATRIX_RESULT) and render.py"
    assert result["cases_run"] == result["cases_passed"] == len(ran)
    assert all(row["got"] == row["expected"] for row in result["cases"])
