"""SLURM's own text formats (slurm/formats.py): times, sizes, TRES lists, GPUs per node, array task ranges."""

from __future__ import annotations

import pytest

from snakemake_executor_multinode.slurm import formats


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0:13", 13), ("30:00", 1800), ("1:02:03", 3723), ("2-00:00:01", 172801), ("UNLIMITED", None), ("", None)],
)
def test_slurm_clock_times(text, seconds):
    assert formats.clock_to_seconds(text) == seconds


@pytest.mark.parametrize(("text", "gpus"), [("gres:gpu:8", 8), ("gres/gpu:a100:4", 4), ("N/A", 0), ("gpu:2", 2)])
def test_gpus_per_node_from_squeue(text, gpus):
    assert formats.gres_gpus(text) == gpus


@pytest.mark.parametrize(
    ("text", "seconds"), [("00:04.532", 4.532), ("01:02:03", 3723.0), ("1-00:00:01", 86401.0), ("", 0.0)]
)
def test_totalcpu(text, seconds):
    assert formats.cpu_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "mb"), [("221392K", 216.203125), ("500M", 500.0), ("4G", 4096.0), ("1.5T", 1572864.0), ("", None)]
)
def test_sizes_in_mib(text, mb):
    assert formats.size_mb(text) == mb


def test_slurm_clock_written_back():
    assert [formats.clock(s) for s in (None, 13, 3723, 172801)] == ["-", "0:00:13", "1:02:03", "2-0:00:01"]
    assert formats.clock_to_seconds(formats.clock(172801)) == 172801


def test_time_limits_in_minutes_and_tres_lists():
    assert formats.minutes_to_seconds("30") == 1800 and formats.minutes_to_seconds("UNLIMITED") is None
    assert formats.tres_map("billing=4,cpu=4,gres/gpu=4,mem=4G,node=2") == {
        "billing": "4", "cpu": "4", "gres/gpu": "4", "mem": "4G", "node": "2"
    }  # fmt: skip


def test_array_task_ranges():
    assert formats.array_tasks("[0-3,7%2]") == [0, 1, 2, 3, 7]


def test_sacct_times_are_local_iso_times_and_unknown_is_none():
    from datetime import datetime

    assert formats.epoch("2026-12-05T01:02:03") == datetime(2026, 12, 5, 1, 2, 3).timestamp()
    assert formats.epoch("Unknown") is None and formats.epoch("None") is None and formats.epoch("") is None


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("node[1-3,7],gpu[01-02]", ["node1", "node2", "node3", "node7", "gpu01", "gpu02"]),
        ("node1", ["node1"]),
        ("r[1-2]n[08-09]", ["r1n08", "r1n09", "r2n08", "r2n09"]),
        ("None assigned", []),
        ("", []),
    ],
)
def test_node_lists_expand_as_slurm_writes_them(text, names):
    assert formats.hostlist(text) == names
