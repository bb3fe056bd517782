"""job_facts() and the adapter methods built on it, on real Snakemake jobs.

Each workflow is planned the way `snakemake --executor multinode` plans it (Snakemake's API, our executor plugin,
the DAG built and post-processed, our Executor constructed, which validates the planned jobs); only Snakemake's
JobScheduler is replaced, by a stand-in that stops right after constructing the Executor, so nothing is submitted
and no SLURM is needed. A tiny storage plugin (written below; no storage plugin is installed here) makes storage
files real.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from snakemake.api import SnakemakeApi
from snakemake.exceptions import InputFunctionException, RuleException
from snakemake.logging import logger
from snakemake.settings.enums import Quietness
from snakemake.settings.types import DAGSettings, ExecutionSettings, OutputSettings, ResourceSettings
from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_storage_plugins.registry import StoragePluginRegistry

from snakemake_executor_multinode.session import RunReason
from snakemake_executor_plugin_multinode import ExecutorSettings
from snakemake_executor_plugin_multinode.facts import JobFacts, declared_nodes, job_facts, rerun_reason

STORAGE = "mnfacts"  # provider name of the test storage plugin
STORAGE_PLUGIN = f'''
from snakemake_interface_storage_plugins.storage_object import StorageObjectRead, StorageObjectWrite
from snakemake_interface_storage_plugins.storage_provider import (StorageProviderBase, StorageQueryValidationResult, )


class StorageProvider(StorageProviderBase):
    @classmethod
    def example_queries(cls):
        return []

    def rate_limiter_key(self, query, operation):
        return None

    def default_max_requests_per_second(self):
        return 100.0

    def use_rate_limiter(self):
        return False

    @classmethod
    def is_valid_query(cls, query):
        return StorageQueryValidationResult(query, query.startswith("{STORAGE}://"))


class StorageObject(StorageObjectRead, StorageObjectWrite):
    def local_suffix(self):
        return self.query.removeprefix("{STORAGE}://")

    async def inventory(self, cache):
        pass

    def get_inventory_parent(self):
        return None

    def cleanup(self):
        pass

    def exists(self):
        return False

    def mtime(self):
        return 0.0

    def size(self):
        return 0

    def retrieve_object(self):
        pass

    def store_object(self):
        pass

    def remove(self):
        pass
'''

KINDS = f"""
import os

rule all:
    input:
        "shell/x.txt", "script.txt", "run.txt", "notebook.txt", "wrapper.txt", "conda.txt", "container.txt",
        "envmodules.txt", "shadow.txt", "benchmark.txt", "touch.txt", "consumer.txt", "g2.txt", "from_storage.txt",
        "nodes.txt", "nodes_fn.txt", "nodes_set.txt", "tbd.txt", "raises.txt", "bad_placeholder.txt"

rule shell:
    output: "shell/{{sample}}.txt"
    log: "logs/shell/{{sample}}.log"
    threads: 2
    resources: mem_mb=100, gpus=1
    shell: "echo {{wildcards.sample}} > {{output}} 2> {{log}}"

rule script:
    output: "script.txt"
    script: "s.py"

rule run:
    output: "run.txt"
    run:
        open(output[0], "w").write("x")

rule notebook:
    output: "notebook.txt"
    notebook: "nb.py.ipynb"

rule wrapper:
    output: "wrapper.txt"
    wrapper: f"file://{{workflow.basedir}}/wrapper"

rule conda:
    output: "conda.txt"
    conda: "env.yaml"
    shell: "touch {{output}}"

rule container:
    output: "container.txt"
    container: "docker://alpine:3.19"
    shell: "touch {{output}}"

rule envmodules:
    output: "envmodules.txt"
    envmodules: "gcc/12"
    shell: "touch {{output}}"

rule shadow:
    output: "shadow.txt"
    shadow: "minimal"
    shell: "touch {{output}}"

rule benchmark:
    output: "benchmark.txt"
    benchmark: "benchmarks/b.tsv"
    shell: "touch {{output}}"

rule touch:
    output: touch("touch.txt")
    shell: "true"

rule producer:
    output: pipe("p.pipe")
    shell: "echo x > {{output}}"

rule consumer:
    input: "p.pipe"
    output: "consumer.txt"
    shell: "cat {{input}} > {{output}}"

rule g1:
    output: "g1.txt"
    group: "grp"
    shell: "touch {{output}}"

rule g2:
    input: "g1.txt"
    output: "g2.txt"
    group: "grp"
    shell: "touch {{output}}"

rule to_storage:
    output: storage.{STORAGE}("{STORAGE}://stored.txt")
    shell: "touch {{output}}"

rule from_storage:
    input: storage.{STORAGE}("{STORAGE}://stored.txt")
    output: "from_storage.txt"
    shell: "cp {{input}} {{output}}"

rule nodes:
    output: "nodes.txt"
    resources: nodes=3
    shell: "touch {{output}}"

rule nodes_fn:
    output: "nodes_fn.txt"
    resources: nodes=lambda wildcards, attempt: 2 * attempt
    shell: "touch {{output}}"

rule nodes_set:
    output: "nodes_set.txt"
    shell: "touch {{output}}"

rule tbd:
    input: "run.txt"
    output: "tbd.txt"
    resources: mem_mb=lambda wildcards, input: os.path.getsize(input[0])
    shell: "touch {{output}}"

rule raises:
    output: "raises.txt"
    resources: mem_mb=lambda wildcards: 1 // 0
    shell: "touch {{output}}"

rule bad_placeholder:
    output: "bad_placeholder.txt"
    shell: "echo {{params.nope}} > {{output}}"
"""


NOTEBOOK = json.dumps(
    {"nbformat": 4, "nbformat_minor": 5, "metadata": {"language_info": {"name": "python"}}, "cells": []}
)


class _Planned(Exception):
    """Raised by the JobScheduler stand-in once the Executor is constructed."""

    def __init__(self, workflow: Any, executor: Any) -> None:
        super().__init__("planned")
        self.workflow, self.executor = workflow, executor


class _SchedulerStandIn:
    """Snakemake's JobScheduler constructs the executor (which validates the planned jobs); we stop right there."""

    def __init__(self, workflow: Any, executor_plugin: Any, *args: Any, **kwargs: Any) -> None:
        raise _Planned(workflow, executor_plugin.executor(workflow, logger))


@dataclass
class Planned:
    workflow: Any
    executor: Any

    def job(self, rule: str) -> Any:
        (job,) = [j for j in self.workflow.dag.jobs if j.rule.name == rule]
        return job

    def groups(self) -> list[Any]:
        return [j for j in self.workflow.dag.get_jobs_or_groups() if j.is_group()]


def plan(workdir: Path, snakefile: str, files: dict[str, str] | None = None, **resource_settings: Any) -> Planned:
    """Plan `snakefile` in `workdir` as `snakemake --executor multinode --jobs 10 --cores 4` would."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "Snakefile").write_text(textwrap.dedent(snakefile))
    for name, text in (files or {}).items():
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text(text)
    cwd = os.getcwd()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("snakemake.workflow.JobScheduler", _SchedulerStandIn)
            with SnakemakeApi(OutputSettings(quiet={Quietness.ALL}, enable_file_logging=False)) as api:
                workflow_api = api.workflow(
                    resource_settings=ResourceSettings(cores=4, nodes=10, **resource_settings),
                    snakefile=workdir / "Snakefile",
                    workdir=workdir,
                )
                try:
                    workflow_api.dag(DAGSettings()).execute_workflow(
                        executor="multinode",
                        executor_settings=ExecutorSettings(),
                        execution_settings=ExecutionSettings(lock=False),
                    )
                except _Planned as planned:
                    return Planned(planned.workflow, planned.executor)
        raise AssertionError("Snakemake never constructed the executor")
    finally:
        os.chdir(cwd)


@pytest.fixture(scope="module")
def storage_plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Register a minimal local storage plugin, as if `snakemake-storage-plugin-mnfacts` were installed."""
    name = f"snakemake_storage_plugin_{STORAGE}"
    path = tmp_path_factory.mktemp("plugin") / f"{name}.py"
    path.write_text(STORAGE_PLUGIN)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # StorageProviderBase finds StorageObject through sys.modules
    spec.loader.exec_module(module)
    registry = StoragePluginRegistry()
    registry.register_plugin(name, module)
    yield
    registry.plugins.pop(STORAGE, None)
    sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory, storage_plugin: None) -> Iterator[Planned]:
    planned = plan(
        tmp_path_factory.mktemp("kinds"),
        KINDS,
        files={"env.yaml": "dependencies: []\n", "s.py": "", "nb.py.ipynb": NOTEBOOK, "wrapper/wrapper.py": ""},
        resources={"nodes": 1},  # --resources nodes=1
        overwrite_resources={"nodes_set": {"nodes": 2}},  # --set-resources nodes_set:nodes=2
    )
    yield planned
    # Stop the executor's status thread without waiting: it started before __post_init__ set our 0.5 s interval, so
    # it may sleep Snakemake's default 10 s before it sees this (RemoteExecutor.shutdown() would wait for it).
    with planned.executor.lock:
        planned.executor.wait = False


def test_plain_shell_job_runs_directly(kinds: Planned) -> None:
    job = kinds.job("shell")
    facts = job_facts(job)
    assert facts == JobFacts(
        name="shell",
        is_group=False,
        wildcards={"sample": "x"},
        threads=2,
        attempt=1,
        resources=facts.resources,
        declared_nodes=None,
        shellcmd="echo x > shell/x.txt 2> logs/shell/x.log",
        outputs=("shell/x.txt",),
        logs=("logs/shell/x.log",),
        inner_snakemake_reason=None,
    )
    assert facts.resources["mem_mb"] == 100 and facts.resources["gpus"] == 1
    assert not any(k.startswith("_") for k in facts.resources)
    assert not facts.needs_inner_snakemake
    assert kinds.executor.runs_directly(job_facts(job))
    assert kinds.executor.command_for(job, job_facts(job)).splitlines() == [
        "set -euo pipefail",
        "rm -rf -- shell/x.txt",
        "mkdir -p -- logs/shell shell",
        "echo x > shell/x.txt 2> logs/shell/x.log",
    ]
    req = kinds.executor.plan_for(job, job_facts(job)).request
    assert (req.rule, req.threads, req.gpus, req.wildcards) == ("shell", 2, 1, (("sample", "x"),))


@pytest.mark.parametrize(
    "rule,reason",
    [
        ("script", "script rule"),
        ("run", "run: block"),
        ("notebook", "notebook rule"),
        ("wrapper", "wrapper rule"),
        ("all", "rule without an action"),
        ("conda", "conda environment"),
        ("container", "container image"),
        ("envmodules", "environment modules"),
        ("shadow", "shadow directory (minimal)"),
        ("benchmark", "benchmark file"),
        ("touch", "touch output touch.txt"),
        ("producer", "pipe file p.pipe"),
        ("to_storage", f"storage file .snakemake/storage/{STORAGE}/stored.txt"),
        ("from_storage", f"storage file .snakemake/storage/{STORAGE}/stored.txt"),
    ],
)
def test_jobs_that_need_snakemake_inside(kinds: Planned, rule: str, reason: str) -> None:
    job = kinds.job(rule)
    facts = job_facts(job)
    assert facts.inner_snakemake_reason == reason
    assert facts.needs_inner_snakemake and not facts.is_group and facts.name == rule
    assert not kinds.executor.runs_directly(job_facts(job))
    if facts.shellcmd is None:
        assert job.shellcmd is None


def test_inner_snakemake_command_and_setting(kinds: Planned, monkeypatch: pytest.MonkeyPatch) -> None:
    executor = kinds.executor
    # Snakemake makes the inner command's temporary folder under ./.snakemake: run where the workflow is, as a run
    monkeypatch.chdir(executor.workdir)
    command = executor.command_for(kinds.job("conda"), job_facts(kinds.job("conda")))
    assert "--target-jobs" in command and "conda:" in command  # Snakemake's own `--mode remote` command
    settings = executor.settings
    executor.settings = dataclasses.replace(settings, inner_snakemake=True)  # --multinode-inner-snakemake
    try:
        assert not executor.runs_directly(job_facts(kinds.job("shell")))
        assert "--target-jobs" in executor.command_for(kinds.job("shell"), job_facts(kinds.job("shell")))
    finally:
        executor.settings = settings


def test_group_jobs(kinds: Planned) -> None:
    groups = {frozenset(job.rule.name for job in group.jobs): group for group in kinds.groups()}
    assert set(groups) == {frozenset({"producer", "consumer"}), frozenset({"g1", "g2"})}
    for rules, group in groups.items():
        facts = job_facts(group)
        assert facts.is_group and facts.needs_inner_snakemake
        assert facts.inner_snakemake_reason == "group job"
        assert facts.name == f"group_{group.name}" and all(r in facts.name for r in rules)
        assert facts.wildcards == {} and facts.shellcmd is None and facts.declared_nodes is None
        assert facts.threads >= 1 and facts.attempt == 1
        assert not kinds.executor.runs_directly(job_facts(group))
    assert job_facts(groups[frozenset({"g1", "g2"})]).outputs == ("g2.txt",)
    assert job_facts(groups[frozenset({"producer", "consumer"})]).outputs == ("consumer.txt",)


def test_declared_nodes_capped_by_global_resources(kinds: Planned) -> None:
    job = kinds.job("nodes")
    assert job.resources["nodes"] == 1  # --resources nodes=1 capped the job ...
    assert job_facts(job).declared_nodes == 3  # ... but the rule asked for 3
    warning = "rule 'nodes' asks for nodes=3 but gets 1"
    req = kinds.executor.plan_for(job, job_facts(job)).request
    assert req.nodes == 1
    assert any(w.startswith(warning) for w in req.warnings)
    # the Executor already warned while validating the planned jobs, before any submission
    assert any(w.startswith(warning) for w in kinds.executor.session._said)


def test_declared_nodes_other_forms(kinds: Planned) -> None:
    assert job_facts(kinds.job("nodes_fn")).declared_nodes is None  # a function of wildcards/attempt
    assert job_facts(kinds.job("nodes_set")).declared_nodes == 2  # --set-resources
    assert job_facts(kinds.job("shell")).declared_nodes is None  # not asked for
    assert declared_nodes(type("R", (), {"resources": {"nodes": 4}})()) == 4  # a plain int


def test_validation_skips_jobs_it_cannot_evaluate_yet(kinds: Planned) -> None:
    """The three jobs below were planned and the Executor was constructed anyway (the `kinds` fixture)."""
    # a resource depending on input that does not exist yet is <TBD>, not an exception
    assert str(kinds.job("tbd").resources["mem_mb"]) == "<TBD>"
    # a resource function that raises: InputFunctionException, a WorkflowError
    with pytest.raises(InputFunctionException) as err:
        kinds.job("raises").resources  # noqa: B018
    assert isinstance(err.value, WorkflowError)
    with pytest.raises(WorkflowError):
        job_facts(kinds.job("raises"))
    # an unknown placeholder in a shell command: RuleException (not a WorkflowError)
    with pytest.raises(RuleException):
        job_facts(kinds.job("bad_placeholder"))


@pytest.mark.parametrize(
    ("resources", "shell", "error"),
    [
        ("nodes=0", "touch {output}", r"rule 'bad': resource nodes=0 is invalid"),
        (
            'nodes=2, on_straggler="evict"',
            "multinode torchrun train.py",
            r"rule 'bad': resource on_straggler='evict' is invalid: 'warn' .* 'replace'",
        ),
    ],
    ids=["nodes", "on_straggler"],
)
def test_bad_resources_stop_the_run_before_submission(tmp_path: Path, resources: str, shell: str, error: str) -> None:
    snakefile = f"""
        rule all:
            input: "a.txt"

        rule bad:
            output: "a.txt"
            resources: {resources}
            shell: "{shell}"
        """
    with pytest.raises(WorkflowError, match=error):
        plan(tmp_path, snakefile)


class _Renamed:
    """A real job on which a Snakemake release renamed one attribute."""

    def __init__(self, job: Any, missing: str) -> None:
        self._job, self._missing = job, missing

    def __getattr__(self, name: str) -> Any:
        if name == self._missing:
            raise AttributeError(f"'Job' object has no attribute {name!r}")
        return getattr(self._job, name)


@pytest.mark.parametrize(
    "missing",
    ["conda_env_spec", "container_img_url", "env_modules", "benchmark", "is_shell", "wildcards_dict", "rule"],
)
def test_a_renamed_attribute_raises(kinds: Planned, missing: str) -> None:
    job = kinds.job("shell")
    assert job_facts(job).inner_snakemake_reason is None
    with pytest.raises(AttributeError, match=missing):
        job_facts(_Renamed(job, missing))
    with pytest.raises(AttributeError, match=missing):
        kinds.executor.runs_directly(job_facts(_Renamed(job, missing)))


MADE = """
configfile: "config.yaml"

rule all:
    input: "out.txt"

rule make:
    input: expand("in_{n}.txt", n=config["inputs"])
    output: "out.txt"
    params: greeting=config["greeting"]
    shell: "CMD"
"""
MADE_CMD = "cat {input} > {output}; echo {params.greeting} >> {output}"


@pytest.mark.parametrize(
    "change,changed",
    [
        ("params", ("changed params",)),
        ("code", ("changed code",)),
        ("input set", ("a changed set of input files",)),
        ("input file", ("updated input files",)),
        ("params and code", ("changed code", "changed params")),
    ],
)
def test_rerun_reason_names_what_snakemake_found_changed(tmp_path: Path, change: str, changed: tuple[str, ...]) -> None:
    """A job made by an earlier run, then run again because something it was made from changed: rerun_reason says
    what (reattach then submits it anew, and its log names the change); the job was not forced."""
    for name in ("in_a.txt", "in_b.txt"):
        (tmp_path / name).write_text(f"{name}\n")
        os.utime(tmp_path / name, (1_000_000_000, 1_000_000_000))  # older than any output
    (tmp_path / "config.yaml").write_text("inputs: [a]\ngreeting: hello\n")
    (tmp_path / "Snakefile").write_text(MADE.replace("CMD", MADE_CMD))
    made = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1"], cwd=tmp_path, capture_output=True, text=True
    )
    assert made.returncode == 0 and (tmp_path / "out.txt").exists(), made.stderr
    config, cmd = {"inputs": "[a]", "greeting": "hello"}, MADE_CMD
    if "params" in change:
        config["greeting"] = "hi"
    if "code" in change:
        cmd = MADE_CMD.replace("echo", "printf '%s\\\\n'")
    if change == "input set":
        config["inputs"] = "[a, b]"
    if change == "input file":  # newer than the output, and other content (a mere touch is not a change)
        (tmp_path / "in_a.txt").write_text("in_a.txt, second edition\n")
        later = (tmp_path / "out.txt").stat().st_mtime + 60
        os.utime(tmp_path / "in_a.txt", (later, later))
    (tmp_path / "config.yaml").write_text("".join(f"{k}: {v}\n" for k, v in config.items()))
    planned = plan(tmp_path, MADE.replace("CMD", cmd))
    try:
        assert planned.workflow.dag.needrun(planned.job("make"))
        assert rerun_reason(planned.job("make")) == RunReason(forced=False, changed=changed, incomplete_jobids=())
    finally:
        with planned.executor.lock:
            planned.executor.wait = False


def test_resources_are_known_unless_one_waits_for_input_the_run_makes():
    """Snakemake's main process shows such a resource as <TBD>; tmpdir always is, and the plan never reads it."""

    def facts(resources: dict[str, Any]) -> JobFacts:
        return JobFacts("r", False, {}, 1, 1, resources, None, "true", (), (), None)

    assert facts({"nodes": 2, "tmpdir": "<TBD>"}).resources_known
    assert not facts({"nodes": 2, "mem_mb": "<TBD>"}).resources_known
