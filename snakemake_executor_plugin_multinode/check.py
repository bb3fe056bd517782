"""`multinode check [SNAKEMAKE ARGS]` and `multinode preview --rule NAME [SNAKEMAKE ARGS]`: submit nothing.

Both take what a user gives `snakemake` (Snakefile, targets, --workflow-profile, --config, --set-resources,
--multinode-* settings ...), read it with Snakemake's own argument parser and run Snakemake as
`snakemake --executor multinode` would, up to the construction of our Executor: the DAG is built exactly as for the
run. There, instead of the first submission, `check` plans every job that goes to SLURM with the executor's own
`plan_known_jobs` and asks SLURM about them (Session.ask_slurm: `sbatch --test-only`, which queues nothing), and
`preview` renders one job's script with the executor's `plan_for`, its inner Snakemake command formatted for real.
This module imports Snakemake; cli.py loads it only for these two commands.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from snakemake_executor_multinode.session import JobRequest, Report, duration
from snakemake_executor_plugin_multinode import Executor, KnownJobs
from snakemake_executor_plugin_multinode.facts import job_facts

CHECK_USAGE = """usage: multinode check [SNAKEMAKE ARGS...]

Plan every job that `snakemake --executor multinode SNAKEMAKE ARGS...` would run and ask SLURM whether it would
take them (one `sbatch --test-only` per resource shape, and the account), without submitting anything. Prints one
line per rule (nodes x GPUs, partition, time limit, environment profile), then warnings and errors; exits 1 on any
error, with the message a real run would give. SNAKEMAKE ARGS are Snakemake's own: -s Snakefile, targets,
--workflow-profile, --config, --set-resources, --multinode-* settings, ... (-n is accepted and changes nothing).
"""


class _Stop(BaseException):
    """Carries the result out of Snakemake once our Executor is built. A BaseException, so that Snakemake's
    `except Exception` (which prints an error and carries on) lets it through."""

    def __init__(self, value: Any) -> None:
        super().__init__("multinode: planned")
        self.value = value


@dataclass
class Inspection:
    reached: bool  # Snakemake built our Executor (else it stopped earlier and said why)
    value: Any = None


def inspect(argv: Sequence[str], task: Callable[[Executor], Any]) -> Inspection:
    """Run Snakemake on `argv` as `snakemake --executor multinode` would, until it constructs our Executor; then call
    `task(executor)` where the executor would validate its planned jobs, and stop: nothing is submitted."""
    from snakemake.cli import args_to_api, parse_args
    from snakemake.settings.enums import Quietness
    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

    try:
        parser, args = parse_args(list(argv))
    except Exception as err:  # what `snakemake` would print with a Python stack under it
        print(f"multinode: the Snakemake arguments are not valid: {type(err).__name__}: {err}", file=sys.stderr)
        return Inspection(False)
    args.executor = "multinode"
    args.dryrun = args.touch = False  # `-n` out of habit: nothing runs anyway
    args.nolock = True  # reads only: never waits for a running Snakemake's lock, never leaves one
    args.jobs = args.jobs or sys.maxsize  # remote execution wants --jobs; it changes no plan
    args.quiet = set(args.quiet or ()) | {Quietness.HOST, Quietness.PROGRESS, Quietness.RULES, Quietness.REASON}

    class Inspector(Executor):
        def _validate_planned_jobs(self) -> None:
            try:
                value = task(self)
            finally:
                with self.lock:
                    self.wait = False  # the status thread ends
                if self._tmpdir is not None:  # made by formatting an inner Snakemake command
                    shutil.rmtree(self._tmpdir, ignore_errors=True)
                try:
                    self.session.registry.folder.rmdir()  # this run submitted nothing: no record of it
                except OSError:
                    pass
            raise _Stop(value)

    plugin = ExecutorPluginRegistry().get_plugin("multinode")
    original, plugin.executor = plugin.executor, Inspector
    try:
        args_to_api(args, parser)
    except _Stop as stop:
        return Inspection(True, stop.value)
    finally:
        plugin.executor = original
    return Inspection(False)


# --- multinode check -------------------------------------------------------------------------------------------


@dataclass
class Checked:
    known: KnownJobs
    report: Report  # its warnings begin with the plans' own


def _plan_and_ask_slurm(executor: Executor) -> Checked:
    known = executor.plan_known_jobs(stop_at_error=False)
    return Checked(known, executor.session.ask_slurm([p for _, p in known.planned]))


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def describe(req: JobRequest, default_partition: str | None) -> str:
    """One job as the check line shows it: `2 nodes x 8 GPUs, partition gpu_A6000, 14d, env infiniband`."""
    nodes = f"{req.nodes} node{'s' if req.nodes != 1 else ''}"
    size = f"{nodes} x {req.gpus} GPU{'s' if req.gpus != 1 else ''}" if req.gpus else f"{nodes}, no GPU"
    if req.partition:
        partition = f"partition {req.partition}"
    else:
        partition = f"partition {default_partition} (default)" if default_partition else "the default partition"
    time = duration(req.runtime_min * 60) if req.runtime_min else "the partition's time limit"
    parts = [size, partition, time, f"env {req.env_profile or 'none'}"]
    return ", ".join(parts + ([f"account {req.account}"] if req.account else []))


def check_lines(checked: Checked) -> list[str]:
    """One line per rule (per distinct resource summary when a rule's jobs differ), then the rules planned later."""
    by_rule: dict[str, dict[str, int]] = {}
    for _, p in checked.known.planned:
        summaries = by_rule.setdefault(p.plan.request.rule, {})
        text = describe(p.plan.request, checked.report.default_partition)
        summaries[text] = summaries.get(text, 0) + 1
    lines = []
    for rule, summaries in by_rule.items():
        total = sum(summaries.values())
        for text, n in summaries.items():
            count = f" ({_count(n, 'job')})" if len(summaries) == 1 else f" ({n} of {total} jobs)"
            lines.append(f"{rule}{count if total > 1 else ''}: {text}")
    for rule, why in dict(reversed(checked.known.later)).items():
        lines.append(f"{rule}: planned when submitted: {why}")
    return lines


def run_check(argv: Sequence[str]) -> int:
    outcome = inspect(argv, _plan_and_ask_slurm)
    if not outcome.reached:
        return 1  # Snakemake said why (a Snakefile error, missing input, a bad option ...)
    checked: Checked = outcome.value
    known, report = checked.known, checked.report
    if not known.planned and not known.later and not known.errors:
        print("multinode check: nothing to be done (no job would be submitted)")
        return 0
    for line in check_lines(checked):
        print(line)
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    errors = known.errors + report.errors
    if report.unreachable:
        errors.append(
            f"SLURM could not be asked, so the jobs were not checked against the cluster: {report.unreachable}"
        )
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    verdict = f"{_count(len(errors), 'error')}" if errors else "OK"
    print(
        f"multinode check: {verdict}; {_count(len(known.planned), 'job')} planned, SLURM "
        f"{report.slurm_version or '(version unknown)'} asked about "
        f"{_count(report.tests, 'resource shape')} (sbatch --test-only, {report.seconds:.2f} s); nothing submitted"
    )
    return 1 if errors else 0


# --- multinode preview --rule NAME [SNAKEMAKE ARGS] --------------------------------------------------------------


@dataclass
class Preview:
    script: str | None
    messages: list[str]
    launch: str = ""  # the launcher's per-node step, for a job that runs `multinode torchrun` (on stderr)


def _preview(rule: str, wildcards: dict[str, str]) -> Callable[[Executor], Preview]:
    def task(executor: Executor) -> Preview:
        from snakemake_interface_common.exceptions import WorkflowError

        dag = executor.workflow.dag
        rules = sorted(r.name for r in executor.workflow.rules)
        if rule not in rules:
            return Preview(None, [f"rule {rule!r} is not in the workflow; rules: {', '.join(rules)}"])
        jobs = [
            j
            for j in dag.needrun_jobs()
            if j.rule.name == rule and all(str(j.wildcards_dict.get(k)) == v for k, v in wildcards.items())
        ]
        if not jobs:
            wanted = f" with wildcards {','.join(f'{k}={v}' for k, v in wildcards.items())}" if wildcards else ""
            return Preview(
                None,
                [
                    f"rule {rule!r}: no job{wanted} to run: its outputs are up to date (add --forcerun {rule}) "
                    "or no target needs them (name one of its outputs as the target)"
                ],
            )
        jobs.sort(key=lambda j: sorted((str(k), str(v)) for k, v in j.wildcards_dict.items()))
        job, notes = jobs[0], []
        if job.is_local:
            return Preview(None, [f"rule {rule!r} runs where Snakemake runs (localrules, or no action): no job script"])
        if len(jobs) > 1:
            which = ",".join(f"{k}={v}" for k, v in job.wildcards_dict.items())
            notes.append(f"rule {rule!r} has {len(jobs)} jobs in this run; this is {which} (choose with --wildcards)")
        unit = dag.get_job_group(job) or job
        if unit is not job:
            notes.append(f"rule {rule!r} runs in group job {unit.name}: this is the group's script")
        facts = job_facts(unit)
        if not facts.resources_known:
            return Preview(None, [f"rule {rule!r}: its resources depend on input that the run makes: no script yet"])
        try:
            plan = executor.plan_for(unit, facts)  # the real command: inner Snakemake formatted as at submission
        except WorkflowError as err:
            return Preview(None, [str(err)])
        launch = executor.session.launch_preview(plan, facts.shellcmd)  # `multinode torchrun`'s step
        return Preview(plan.script, notes + [f"warning: {w}" for w in plan.request.warnings], launch)

    return task


def run_preview(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="multinode preview", allow_abbrev=False, add_help=False)
    parser.add_argument("--rule", required=True)
    parser.add_argument("--wildcards", default="")
    ours, rest = parser.parse_known_args(list(argv))
    wildcards = dict(w.split("=", 1) for w in ours.wildcards.split(",") if "=" in w)
    outcome = inspect(rest, _preview(ours.rule, wildcards))
    if not outcome.reached:
        return 1
    preview: Preview = outcome.value
    for message in preview.messages:
        print(f"multinode preview: {message}", file=sys.stderr)
    if preview.script is None:
        return 2
    sys.stdout.write(preview.script)
    if preview.launch:
        print(preview.launch, file=sys.stderr)
    return 0


def main(argv: Sequence[str]) -> int:
    """`argv`: ["check", ...] or ["preview", ...] (cli.py dispatches here)."""
    command, rest = argv[0], list(argv[1:])
    if command == "check":
        if rest[:1] in (["-h"], ["--help"]):
            print(CHECK_USAGE, end="")
            return 0
        return run_check(rest)
    return run_preview(rest)
