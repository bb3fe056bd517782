"""`multinode preview`: print the exact job script a rule's resources produce, without submitting anything.

    multinode preview --rule train nodes=2 gpus=8 cpus_per_task=64 runtime=20160 \\
        slurm_partition=gpu_A6000 slurm_account=my_account env_profile=infiniband \\
        -- multinode torchrun train.py

It calls the same planner as the executor (`plan.plan_job`), which also keeps every submitted script beside its
log, so a preview is the real thing. The plugin settings are the executor's `--multinode-*` ones, without the prefix.

    multinode preview --rule train [--wildcards NAME=VALUE,...] [SNAKEMAKE ARGS: -s Snakefile, targets, --config ...]

prints the script of that rule's job from the real Snakefile, as `snakemake --executor multinode` would submit it
(this form is chosen when no RESOURCE=VALUE item and no `--` is given).
"""

from __future__ import annotations

import argparse
import sys
import typing
from dataclasses import fields
from pathlib import Path

from snakemake_executor_multinode.planning import environment
from snakemake_executor_multinode.planning.plan import Planner, RuleJob, plan_job
from snakemake_executor_multinode.planning.preview import launch_preview
from snakemake_executor_multinode.planning.request import RequestError
from snakemake_executor_multinode.planning.settings import PlanningSettings, SettingsError, help_text

# Settings that shape the script (the others steer the executor's status loop).
SCRIPT_SETTINGS = (
    "account",
    "partition",
    "profile_file",
    "env_profile",
    "signal",
    "logdir",
    "max_requeues",
    "gpu_flag",
    "launchers",
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "preview",
        help="print the job script for given resources (submits nothing)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rule", default="rule", help="rule name (for the job name, comment and log folder)")
    p.add_argument("--wildcards", default="", help="wildcards as name=value,name=value")
    p.add_argument("--threads", type=int, default=1, help="the rule's threads")
    p.add_argument("--attempt", type=int, default=1)
    p.add_argument("--workdir", default=".", help="working directory of the job (default: here)")
    hints = typing.get_type_hints(PlanningSettings)
    for f in fields(PlanningSettings):
        if f.name in SCRIPT_SETTINGS:
            kind, flag = hints[f.name], f"--{f.name.replace('_', '-')}"
            text = f"{help_text(f)} (as --multinode-{flag[2:]})"
            if kind is bool:
                p.add_argument(flag, action="store_true", help=text)
            else:
                kind = kind if kind in (int, float) else str  # Optional[str]
                p.add_argument(flag, type=kind, default=f.default, choices=f.metadata.get("choices"), help=text)
    p.add_argument(
        "items",
        nargs="*",
        metavar="RESOURCE=VALUE [-- COMMAND]",
        help="rule resources, then -- and the shell command",
    )
    p.set_defaults(func=run)


def uses_snakefile(argv: list[str]) -> bool:
    """`multinode preview --rule NAME [SNAKEMAKE ARGS]` (a job of the real Snakefile, rendered by the adapter) rather
    than RESOURCE=VALUE items and `-- COMMAND`: an option only Snakemake knows, or --rule with neither (targets)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_parser(parser.add_subparsers(dest="command"))
    if "--" in argv or any(arg in ("-h", "--help") for arg in argv):
        return False
    known, unknown = parser.parse_known_args(["preview", *argv])
    if any(arg.startswith("-") for arg in unknown):
        return True
    return known.rule != "rule" and not any("=" in item for item in known.items)


def parse_items(items: list[str]) -> tuple[dict[str, str], str]:
    resources: dict[str, str] = {}
    command: list[str] = []
    for i, item in enumerate(items):
        if "=" not in item:
            command = items[i:]
            break
        key, value = item.split("=", 1)
        resources[key.strip()] = value
    return resources, " ".join(command) or "true"


def run(args: argparse.Namespace) -> int:
    resources, command = parse_items(args.items)
    wildcards = dict(w.split("=", 1) for w in args.wildcards.split(",") if "=" in w)
    settings = PlanningSettings(**{name: getattr(args, name) for name in SCRIPT_SETTINGS})
    try:
        planner = Planner(settings, Path(args.workdir).resolve(), run_id="preview")
        plan = plan_job(
            RuleJob(
                args.rule, resources, command, threads=args.threads, wildcards=wildcards, attempt=args.attempt,
                shellcmd=command,
            ),
            planner,
        )  # fmt: skip
    except (RequestError, SettingsError, environment.EnvProfileError) as err:
        print(f"multinode preview: {err}", file=sys.stderr)
        return 2
    for warning in plan.request.warnings:
        print(f"multinode preview: warning: {warning}", file=sys.stderr)
    sys.stdout.write(plan.script)
    if launch_lines := launch_preview(plan, planner.profiles, command):
        print(launch_lines, file=sys.stderr)
    return 0
