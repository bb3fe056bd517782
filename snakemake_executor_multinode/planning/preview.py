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
import re
import shlex
import sys
import typing
from dataclasses import fields
from pathlib import Path

from snakemake_executor_multinode.contract import container_spec
from snakemake_executor_multinode.launching import launcher
from snakemake_executor_multinode.planning import environment, launcher_use
from snakemake_executor_multinode.planning.plan import JobPlan, Planner, RuleJob
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
        site_launcher = launcher_use.site_launcher(command, planner.launchers)  # as Session.plan decides it
        plan = planner.plan(
            RuleJob(
                args.rule, resources, command, threads=args.threads, wildcards=wildcards, attempt=args.attempt,
                site_launcher=site_launcher,
            )
        )  # fmt: skip
        launcher_use.refuse_idle(plan.request, command, None, planner.launchers)
    except (RequestError, SettingsError, environment.EnvProfileError) as err:
        print(f"multinode preview: {err}", file=sys.stderr)
        return 2
    for warning in plan.request.warnings:
        print(f"multinode preview: warning: {warning}", file=sys.stderr)
    sys.stdout.write(plan.script)
    if launch_lines := launch_preview(plan, planner.profiles, command):
        print(launch_lines, file=sys.stderr)
    return 0


_TORCHRUN = re.compile(r"\bmultinode\s+torchrun\s+(?P<args>.*)$", re.MULTILINE)
_SHELL_OPS = {";", "&&", "||", "|", ">", ">>", "2>", "&", "<"}
PLACEHOLDER_PORT = 1  # replaced by $MASTER_PORT in the text: the port is the job's


def launch_preview(plan: JobPlan, profiles: environment.ProfileSet, command: str | None) -> str:
    """For a job whose command (the rule's shell) runs `multinode torchrun`: the srun step the launcher starts,
    built by the launcher's own `launcher.plan` (container wrapping included), with placeholder allocation values.
    Empty otherwise. Printed on stderr: stdout stays exactly the script the run submits."""
    found = _TORCHRUN.search(command or "")
    if found is None:
        return ""
    try:
        words = shlex.split(found["args"], comments=True)
    except ValueError:
        return ""
    cut = next((i for i, w in enumerate(words) if w in _SHELL_OPS), len(words))
    opts, script = launcher.split_torchrun_args(words[:cut])
    req = plan.request
    nodes = tuple(f"<node{i + 1}>" for i in range(req.nodes))
    alloc = launcher.Allocation("<jobid>", nodes, req.gpus, req.cpus_per_task, "$MASTER_ADDR", PLACEHOLDER_PORT)
    box = container_spec.parse(environment.resolve(profiles, req.env_profile).get("container"), "container")
    try:
        argv = launcher.srun_command(alloc, opts, script, box=box)
    except SystemExit as refused:  # what the launcher would refuse in the job
        return f"# multinode torchrun would refuse this command: {refused}"
    at = argv.index("bash")
    task = argv[at + 2].replace(f"--master_port={PLACEHOLDER_PORT}", "--master_port=$MASTER_PORT")
    where = f"in {container_spec.describe(box)}" if box else "without a container"
    return "\n".join(
        [
            f"# ==== `multinode torchrun`'s step, as the launcher starts it in the job ({where}); not part of the",
            "# script. Placeholders: <nodeN>, $MASTER_ADDR, $MASTER_PORT (the job's); paths are the job's workdir.",
            *spares_note(req.nodes, req.spare_nodes),
            f'{shlex.join(argv[:at])} bash -c "$TASK" multinode-agent',
            "# TASK, the line each node's shell runs:",
            task,
        ]
    )


def spares_note(nodes: int, spares: int) -> list[str]:
    """What the preview says of a job with spare nodes: the step trains on `nodes` of the allocation's."""
    if not spares:
        return []
    return [
        f"# {spares} spare node(s) beyond the {nodes} the step trains on (--nodelist=<the first {nodes} not known "
        "bad>); a failed node is replaced by a spare in the same job, the training relaunched from its checkpoint"
    ]
