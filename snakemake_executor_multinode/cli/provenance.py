"""`multinode provenance PATH` prints how an output was made (its record, watching/provenance.py); `--diff A B` says
what differs between two outputs' records. `--start FILE` is the job script's: this run's start line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from snakemake_executor_multinode.contract.state_files import Damaged
from snakemake_executor_multinode.watching.provenance import diff, find, write_start


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("provenance", help="how an output was made: its job's code, config, environment and runs")
    p.add_argument("paths", nargs="*", help="an output file (with --diff: two)")
    p.add_argument("--diff", action="store_true", help="what differs between the records of two outputs")
    p.add_argument("-d", "--directory", type=Path, default=Path("."), help="Snakemake's working directory")
    p.add_argument("--start", metavar="FILE", help=argparse.SUPPRESS)  # the job script: this run's start line
    p.set_defaults(func=provenance_command)


def provenance_command(args: argparse.Namespace) -> int:
    if args.start:
        return write_start(Path(args.start))
    workdir = args.directory.resolve()
    wanted = 2 if args.diff else 1
    if len(args.paths) != wanted:
        print(f"multinode provenance: give {'two outputs with --diff' if args.diff else 'one output'}", file=sys.stderr)
        return 2
    records = []
    for path in args.paths:
        try:
            rec = find(workdir, path)
        except Damaged as err:
            print(
                f"multinode provenance: damaged state file {err}; no record for {path}: it is written again when "
                "its job runs again",
                file=sys.stderr,
            )
            return 1
        if rec is None:
            print(f"multinode provenance: no record for {path} (made by this plugin, in {workdir}?)", file=sys.stderr)
            return 1
        records.append(rec)
    if not args.diff:
        print(json.dumps(records[0], indent=1, sort_keys=True))
        return 0
    lines = diff(*records)
    print("\n".join(lines) if lines else "no difference in code, config, environment or nodes")
    return 0
