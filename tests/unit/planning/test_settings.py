"""The plugin's settings are declared once: the request's defaults, `multinode preview`'s flags and Snakemake's
`--multinode-*` options all read their defaults from that declaration."""

from __future__ import annotations

from dataclasses import fields

from snakemake_executor_multinode.planning.request import DEFAULTS, JobRequest, build_request
from snakemake_executor_multinode.planning.settings import Settings


def test_a_rule_without_settings_gets_the_declared_defaults():
    req = build_request("train", {"nodes": 2, "gpus": 1})
    assert (req.signal, req.gpu_flag, req.max_requeues) == (Settings.signal, Settings.gpu_flag, Settings.max_requeues)
    assert DEFAULTS == Settings()
    bare = JobRequest("x")
    assert (bare.gpu_flag, bare.max_requeues, bare.signal) == (
        Settings.gpu_flag,
        Settings.max_requeues,
        Settings.signal,
    )


def test_snakemakes_options_are_made_from_the_declaration():
    from snakemake_executor_plugin_multinode import ExecutorSettings

    ours = {f.name: f.default for f in fields(Settings)}
    theirs = {f.name: f.default for f in fields(ExecutorSettings) if f.name in ours}
    assert theirs == ours
