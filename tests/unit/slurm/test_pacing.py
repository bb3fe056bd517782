"""sbatch calls are paced: a burst, then a steady rate; the time waited is counted."""

from __future__ import annotations

import pytest

from snakemake_executor_multinode.session import Session, Settings, SettingsError
from snakemake_executor_multinode.slurm.pacing import Pace
from tests.helpers import Clock


def test_a_burst_goes_at_once_then_calls_come_at_the_rate():
    clock = Clock()
    pace = Pace(rate=10, burst=3, clock=clock, sleep=clock.sleep)
    times = []
    for _ in range(7):
        pace.take()
        times.append(round(clock.now, 3))
    assert times == [0, 0, 0, 0.1, 0.2, 0.3, 0.4]
    assert pace.waited == pytest.approx(0.4)


def test_an_idle_bucket_fills_up_to_its_burst_only():
    clock = Clock()
    pace = Pace(rate=2, burst=2, clock=clock, sleep=clock.sleep)
    clock.now = 100.0  # a long pause: two tokens, not two hundred
    for _ in range(3):
        pace.take()
    assert clock.now == pytest.approx(100.5)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (Settings(submit_rate=0), r"--multinode-submit-rate=0: more than 0 sbatch calls per second"),
        (Settings(submit_rate=-2.5), r"--multinode-submit-rate=-2.5: more than 0"),
        (Settings(submit_burst=0), r"--multinode-submit-burst=0: 1 or more sbatch calls"),
    ],
)
def test_a_pace_of_zero_or_below_is_refused_naming_the_option(tmp_path, settings, message):
    with pytest.raises(SettingsError, match=message):
        Session(settings, tmp_path)
    assert not (tmp_path / ".snakemake").exists()  # before anything is written
