"""One plan for the executor, `multinode preview` and `multinode check`: settings declared once, profiles chosen in
one place (environment.select), every error naming rule, field, value and what is allowed."""

from __future__ import annotations

from dataclasses import MISSING, fields, replace
from pathlib import Path

import pytest

from snakemake_executor_multinode.planning import environment
from snakemake_executor_multinode.planning.plan import Planner, RuleJob, plan_job
from snakemake_executor_multinode.planning.request import RequestError
from snakemake_executor_multinode.session import Settings, help_text
from snakemake_executor_plugin_multinode import ExecutorSettings


def plan(resources: dict, **settings):
    job = RuleJob("train", resources, "true", shellcmd="multinode torchrun train.py")  # it uses every node and GPU
    return plan_job(job, Planner(Settings(**settings), Path("/w"), "run1"))


def test_the_executors_options_are_the_core_settings_declared_once():
    ours = {f.name: (f.default, help_text(f)) for f in fields(Settings)}
    snakemakes = {f.name: (f.default, f.metadata["help"]) for f in fields(ExecutorSettings)}
    assert snakemakes == ours
    assert all(f.default is not MISSING and f.metadata["env_var"] for f in fields(ExecutorSettings))


def test_profiles_compose_left_to_right_and_the_request_carries_the_validated_selection():
    p = plan({"nodes": 2, "env_profile": " ethernet , debug "})
    assert p.request.env_profile == "ethernet,debug"
    assert "export NCCL_IB_DISABLE=1" in p.environment and "export NCCL_DEBUG=INFO" in p.environment


def test_an_unknown_profile_names_rule_field_value_and_the_defined_ones():
    with pytest.raises(RequestError) as err:
        plan({"env_profile": "fast-ib"})
    assert str(err.value) == (
        "rule 'train': resource env_profile='fast-ib' is invalid: a defined environment profile, or several "
        "comma-separated (applied left to right); defined: debug, ethernet, infiniband"
    )


def test_an_unknown_default_profile_setting_is_refused_before_any_job_is_planned():
    with pytest.raises(environment.EnvProfileError, match="--multinode-env-profile='nope': unknown"):
        Planner(Settings(env_profile="nope"), Path("/w"), "run1")


def test_settings_reach_the_request_and_the_script():
    p = plan({"gpus": 1}, account="acct", partition="gpu", reservation="maint", signal="USR2@300")
    assert (p.request.account, p.request.partition, p.request.reservation) == ("acct", "gpu", "maint")
    for line in ("#SBATCH --account=acct", "#SBATCH --reservation=maint", "#SBATCH --signal=USR2@300"):
        assert line in p.script.splitlines()


def test_unknown_resources_are_refused_unless_the_site_allows_them():
    with pytest.raises(RequestError, match="did you mean gpus"):
        plan({"gpus_per_node": 8})
    allowed = plan({"my_site_quota": 3}, allow_unknown_resources=True)
    assert any("my_site_quota" in w for w in allowed.request.warnings)


def test_the_job_name_is_unique_to_the_submission_and_paths_sit_beside_each_other():
    p = plan_job(RuleJob("train", {}, "true", attempt=2, key="7.2"), Planner(Settings(), Path("/w"), "run1"))
    assert p.job_name == "mn-run1-train-7.2" and f"--job-name={p.job_name}" in p.script
    assert p.script_path("55") == Path("/w/.snakemake/multinode/logs/rule_train/_/55.attempt2.sh")
    assert p.log_path("55") == p.script_path("55").with_suffix(".log")


def test_a_retry_avoids_the_nodes_earlier_attempts_failed_on_as_well_as_the_rules_own_exclude():
    planner = Planner(Settings(), Path("/w"), "r")
    planner.failed_on(("model.pt",), ("node2", "bad;name"))
    job = RuleJob(
        "train", {"nodes": 2, "exclude": "node7"}, "true", outputs=("model.pt",), shellcmd="multinode torchrun t.py"
    )
    assert plan_job(job, planner).request.exclude == "node7"  # a first attempt avoids nothing
    p = plan_job(replace(job, attempt=2), planner)
    assert p.request.exclude == "node7,node2"  # a name the launcher could not have written is dropped
    assert "#SBATCH --exclude=node7,node2" in p.script.splitlines()


def test_unsetting_a_key_no_profile_sets_stops_the_plan_naming_rule_file_profile_and_key(tmp_path):
    (tmp_path / "site.yaml").write_text("profiles:\n  site:\n    extends: ethernet\n    nccl: {hca: null}\n")
    with pytest.raises(RequestError) as err:
        plan({"env_profile": "site"}, profile_file=str(tmp_path / "site.yaml"))
    assert str(err.value) == (
        f"rule 'train': resource env_profile='site' is invalid: {tmp_path / 'site.yaml'}: profiles.site.nccl.hca: "
        "null unsets nccl.hca, but no profile before it in 'site' sets it"
    )
