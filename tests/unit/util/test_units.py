"""Durations and sizes as Snakemake writes them, read into SLURM's minutes and MB."""

from __future__ import annotations

import pytest

from snakemake_executor_multinode.util.units import mib_to_mb, parse_mem_mb, read_runtime, runtime_hint


@pytest.mark.parametrize(
    "value, minutes", [(90, 90), ("90", 90), ("2h", 120), ("1.5d", 2160), ("2 days", 2880), ("30min", 30)]
)
def test_a_runtime_is_read_in_minutes(value, minutes):
    assert read_runtime(value)[0] == minutes


def test_seconds_become_whole_minutes_as_snakemake_reads_them_rounded_down_and_at_least_one():
    assert [read_runtime(v)[0] for v in ("90s", "150s", "45s")] == [1, 2, 1]


def test_slurms_own_time_form_is_refused_with_what_to_write_instead():
    with pytest.raises(ValueError):
        read_runtime("1-12:00:00")
    assert "write 2160 or '36h'" in runtime_hint("1-12:00:00")


@pytest.mark.parametrize("value, mb", [(1000, 1000), ("4G", 4000), ("4GB", 4000), ("2T", 2_000_000), ("512MiB", 537)])
def test_a_size_is_read_in_mb(value, mb):
    assert parse_mem_mb(value) == mb


def test_nonsense_is_refused():
    for bad in ("x", "abc"):
        with pytest.raises(ValueError):
            parse_mem_mb(bad)
        with pytest.raises(ValueError):
            read_runtime(bad)


def test_mib_become_mb_as_snakemake_converts_them():
    assert [mib_to_mb(1024), mib_to_mb(1)] == [1073, 1]
