"""`multinode preview`: print the exact job script a rule's resources produce, without submitting anything.

    multinode preview --rule train nodes=2 gpus=8 cpus_per_task=64 runtime=20160 \\
        slurm_partition=gpu_A6000 slurm_account=my_account env_profile=infiniband \\
        -- multinode torchrun train.py

It runs the same validation and the same renderer as the executor (which also writes every submitted script beside
its log), so a preview is the real thing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import environment, jobscript
from .request import Defaults, RequestError, build_request


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
    p.add_argument("--env-profiles", help="YAML environment profile file (as --multinode-env-profiles)")
    p.add_argument("--account", help="default account (as --multinode-account)")
    p.add_argument("--partition", help="default partition (as --multinode-partition)")
    p.add_argument("--signal", default="USR2@120", help="default signal (as --multinode-signal)")
    p.add_argument("--max-requeues", type=int, default=3)
    p.add_argument("--logdir", default=".snakemake/multinode/logs")
    p.add_argument("--workdir", default=".", help="working directory of the job (default: here)")
    p.add_argument(
        "items", nargs="*", metavar="RESOURCE=VALUE [-- COMMAND]", help="rule resources, then -- and the shell command"
    )
    p.set_defaults(func=run)


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
    try:
        profiles = environment.load_profiles(args.env_profiles)
        defaults = Defaults(
            account=args.account,
            partition=args.partition,
            signal=args.signal,
            env_profile=profiles.default,
            max_requeues=args.max_requeues,
        )
        req = build_request(
            args.rule,
            resources,
            threads=args.threads,
            wildcards=wildcards,
            attempt=args.attempt,
            defaults=defaults,
            known_profiles=profiles.names,
        )
        env_lines = environment.render_lines(environment.resolve(profiles, req.env_profile))
    except (RequestError, environment.EnvProfileError) as err:
        print(f"multinode preview: {err}", file=sys.stderr)
        return 2
    workdir = Path(args.workdir).resolve()
    ctx = jobscript.ScriptContext(
        command=command,
        workdir=workdir,
        log_dir=jobscript.log_dir_for(Path(args.logdir), req),
        state_dir=workdir / ".snakemake" / "multinode" / "state",
        job_name=f"mn-preview-{req.rule}",
    )
    sys.stdout.write(jobscript.render(req, ctx, env_lines))
    return 0
