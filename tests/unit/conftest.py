"""The fast tier's guard: a test here starts no process and opens no socket (those are in tests/process/, in the file
of the same name). Every test this tier runs is watched from its setup to its teardown (tests/helpers.py: watch);
a start is stopped where it happens and fails the test, also where the code under test swallows the exception."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

from tests.helpers import watch

UNIT = Path(__file__).resolve().parent
WATCHED = pytest.StashKey[list[str]]()  # what the test's watch saw


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    if UNIT not in item.path.parents:  # pytest calls this hook of every conftest for every test
        return (yield)
    with watch() as seen:
        item.stash[WATCHED] = seen
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, object, object]:
    report = yield
    seen = item.stash.get(WATCHED, [])
    if seen and isinstance(report, pytest.TestReport):
        started = "\n".join(f"  {what}" for what in seen)
        said = f"\n\n{report.longreprtext}" if report.failed else ""
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} ({call.when}) started a process or used a socket:\n{started}\n"
            "tests/unit is the fast tier: such a test belongs in tests/process/, in the file of the same name "
            f"(CONTRIBUTING.md, 'Tests and checks').{said}"
        )
        seen.clear()  # said once, in the phase that did it
    return report
