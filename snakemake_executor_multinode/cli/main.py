"""The `multinode` command: cluster sandbox, per-node torchrun launcher, job script preview."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path

from snakemake_executor_multinode import __version__


def _cluster_parser(sub: argparse._SubParsersAction) -> None:
    from snakemake_executor_multinode.contract.releases import DEFAULT as DEFAULT_RELEASE
    from snakemake_executor_multinode.contract.releases import NAMES as RELEASES
    from snakemake_executor_multinode.sandbox.releases import describe as describe_release
    from snakemake_executor_multinode.sandbox.spec import DEFAULT_DIR, PREEMPT_MODES, PREEMPTING

    cluster = sub.add_parser("cluster", help="a real local SLURM cluster of namespaced nodes (needs root)")
    actions = cluster.add_subparsers(dest="action", required=True)
    dir_help = f"state folder (default {DEFAULT_DIR}, or $MULTINODE_CLUSTER_DIR)"
    up = actions.add_parser("up", help="start the cluster (idempotent); returns once every node is idle")
    up.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=dir_help)
    up.add_argument("--nodes", type=int, default=3, help="number of slurmd nodes (default 3)")
    up.add_argument("--cpus", type=int, default=4, help="CPUs per node (default 4)")
    up.add_argument("--gpus", type=int, default=8, help="fake GPUs per node (default 8)")
    up.add_argument("--mem", type=int, default=64000, help="memory per node in MB (default 64000)")
    up.add_argument("--no-accounting", action="store_true", help="no MariaDB/slurmdbd: squeue only, no sacct")
    up.add_argument(
        "--slurm",
        default=DEFAULT_RELEASE,
        help="SLURM release: " + " or ".join(map(describe_release, RELEASES)),
    )
    up.add_argument(
        "--preemption",
        action="store_true",
        help=f"add a partition {PREEMPTING!r} over the same nodes whose jobs preempt the default partition's "
        "(PreemptType=preempt/partition_prio, PriorityTier)",
    )
    up.add_argument(
        "--grace-time",
        metavar="SECONDS",
        help="with --preemption: seconds between a preempted job's SIGTERM and its end (GraceTime; default 60)",
    )
    up.add_argument(
        "--preempt-mode",
        choices=PREEMPT_MODES,
        help="with --preemption: what ends a preempted job, PreemptMode=REQUEUE (the default: the same job runs "
        "again) or CANCEL",
    )
    for name, text in (
        ("down", "stop everything `up` started"),
        ("status", "show daemons and nodes"),
        ("env", 'print `export SLURM_CONF=...`: eval "$(multinode cluster env)"'),
    ):
        p = actions.add_parser(name, help=text)
        p.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=dir_help)


def _run_cluster(args: argparse.Namespace) -> int:
    from snakemake_executor_multinode.sandbox import cluster
    from snakemake_executor_multinode.sandbox.spec import ClusterError, ClusterSpec

    if args.action == "up":
        preemption: dict[str, object] = {}
        for flag, value in (("--grace-time", args.grace_time), ("--preempt-mode", args.preempt_mode)):
            if value is not None and not args.preemption:
                raise ClusterError(f"{flag} sets how the cluster preempts: it needs --preemption")
        if args.grace_time is not None:  # checked by the spec: a whole number of seconds, 0 or more
            preemption["grace_time"] = int(args.grace_time) if args.grace_time.isdigit() else args.grace_time
        if args.preempt_mode is not None:
            preemption["preempt_mode"] = args.preempt_mode
        spec = ClusterSpec(
            dir=args.dir.resolve(),
            nodes=args.nodes,
            cpus=args.cpus,
            gpus=args.gpus,
            mem_mb=args.mem,
            accounting=not args.no_accounting,
            slurm=args.slurm,
            preemption=args.preemption,
            **preemption,  # type: ignore[arg-type]
        )
        cluster.up(spec)
        return 0
    spec = ClusterSpec.load(args.dir.resolve()) or ClusterSpec(dir=args.dir.resolve())
    if args.action == "down":
        left = cluster.down(spec)
        if left:
            print("still running: " + ", ".join(left), file=sys.stderr)
            return 1
        return 0
    if args.action == "status":
        print(cluster.status(spec))
        return 0 if cluster.is_up(spec) else 3
    print(cluster.env_lines(spec), end="")
    return 0


# The commands that need Snakemake live in the adapter, which registers them under this entry point group: the core
# never imports the adapter (tests/unit/test_architecture.py).
SNAKEMAKE_COMMANDS = "snakemake_executor_multinode.snakemake_commands"


def _snakemake_command() -> Callable[[list[str]], int]:
    """`multinode check` and `multinode preview --rule` (the real Snakefile), as the adapter registered them."""
    found = entry_points(group=SNAKEMAKE_COMMANDS, name="check")
    if not found:
        raise SystemExit(
            "multinode check: the Snakemake adapter (snakemake_executor_plugin_multinode) is not installed; "
            "pip install snakemake-executor-plugin-multinode"
        )
    return next(iter(found)).load()  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    code = _before_argparse(argv)
    if code is not None:
        return code
    args = _parser().parse_args(argv)
    if args.command != "cluster":
        from snakemake_executor_multinode.contract.state_files import StateError

        try:
            return args.func(args)
        except StateError as err:  # damaged state under .snakemake/multinode that the command cannot go on with
            print(f"multinode {args.command}: {err}", file=sys.stderr)
            return 1
    from snakemake_executor_multinode.sandbox.spec import ClusterError

    try:
        return _run_cluster(args)
    except ClusterError as err:
        print(f"multinode cluster {args.action}: {err}", file=sys.stderr)
        return 1


def _before_argparse(argv: list[str]) -> int | None:
    """The commands run without the parser: those whose arguments are another program's (torchrun's, Snakemake's)
    and the job script's, which start with as few imports as they can. None: the parser's command."""
    # torchrun's own options must pass through untouched, so it is dispatched before argparse.
    if argv[:1] == ["torchrun"]:
        from snakemake_executor_multinode.launching import launcher

        if argv[1:2] not in (["-h"], ["--help"]) and launcher.outside_slurm(os.environ):
            from snakemake_executor_multinode.cli.local_run import main as local_main  # a job's environment, here

            return local_main(argv[1:])
        return launcher.main(argv[1:])
    # Every job's start line (the job script): without the parser's imports, a tenth of a second less per job.
    if len(argv) == 3 and argv[:2] == ["provenance", "--start"]:
        from snakemake_executor_multinode.watching.provenance import write_start

        return write_start(Path(argv[2]))
    # A run after a preemption: which job took the previous run's nodes (the job script, at a restart)
    if len(argv) == 2 and argv[0] == "preempted-by":
        from snakemake_executor_multinode.watching.preemptions import say_previous

        return say_previous(argv[1], os.environ)
    # The job script's question at its checkpoint: did a spare replace a node in this job (the node events' reader)?
    if argv[:1] == ["node-events"]:
        from snakemake_executor_multinode.contract.node_events import main as node_events_main

        return node_events_main(argv[1:])
    # check, and preview of a rule of the real Snakefile, take Snakemake's own arguments and need Snakemake: the adapter
    from snakemake_executor_multinode.cli.preview import uses_snakefile

    if argv[:1] == ["check"] or (argv[:1] == ["preview"] and uses_snakefile(argv[1:])):
        return _snakemake_command()(argv)
    return None


def _parser() -> argparse.ArgumentParser:
    """The commands argparse reads: every subcommand's parser."""
    parser = argparse.ArgumentParser(prog="multinode", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _cluster_parser(sub)
    sub.add_parser("torchrun", help="start one torchrun per node of the SLURM allocation (see --help)")
    sub.add_parser("check", help="plan a workflow's jobs and ask SLURM about them; submits nothing (see --help)")
    from snakemake_executor_multinode.cli.preview import add_parser as add_preview

    add_preview(sub)
    from snakemake_executor_multinode.cli.runs import (
        add_parsers as add_run_commands,
    )  # status, logs, cancel, report, clean

    add_run_commands(sub)  # status, logs, cancel, report, clean
    from snakemake_executor_multinode.cli.provenance import add_parser as add_provenance

    add_provenance(sub)
    return parser


if __name__ == "__main__":
    sys.exit(main())
