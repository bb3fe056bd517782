"""The plugin's settings are declared once, each by the stage that reads it, and composed by the session: the
request's defaults, `multinode preview`'s flags and Snakemake's `--multinode-*` options all read their defaults from
that declaration.
The tests that start processes: tests/process/planning/test_settings.py."""

from __future__ import annotations

from dataclasses import fields

from snakemake_executor_multinode.planning.request import DEFAULTS, JobRequest, build_request
from snakemake_executor_multinode.planning.settings import PlanningSettings
from snakemake_executor_multinode.session import Settings
from snakemake_executor_multinode.slurm.settings import SubmitSettings
from snakemake_executor_multinode.watching.settings import WatchSettings


def test_a_rule_without_settings_gets_the_declared_defaults():
    req = build_request("train", {"nodes": 2, "gpus": 1})
    assert (req.signal, req.gpu_flag, req.max_requeues) == (Settings.signal, Settings.gpu_flag, Settings.max_requeues)
    assert DEFAULTS == PlanningSettings()
    bare = JobRequest("x")
    assert (bare.gpu_flag, bare.max_requeues, bare.signal) == (
        Settings.gpu_flag,
        Settings.max_requeues,
        Settings.signal,
    )


def test_each_stage_declares_its_settings_and_the_session_composes_them_in_stage_order():
    stages = [f.name for stage in (PlanningSettings, SubmitSettings, WatchSettings) for f in fields(stage)]
    assert [f.name for f in fields(Settings)] == stages and len(set(stages)) == len(stages) > 20
    assert Settings().status_seconds == WatchSettings.status_seconds and Settings().submit_burst == 30


def test_snakemakes_options_are_made_from_the_declaration():
    from snakemake_executor_plugin_multinode import ExecutorSettings

    ours = {f.name: f.default for f in fields(Settings)}
    theirs = {f.name: f.default for f in fields(ExecutorSettings) if f.name in ours}
    assert theirs == ours
