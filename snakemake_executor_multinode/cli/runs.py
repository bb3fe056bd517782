"""`multinode status | logs | cancel | report | clean`: look at a run (or a job's log; or stop the run, or clean up
after it) from its registry, without Snakemake.

A run is one Snakemake start with `--executor multinode`; its submissions are under
.snakemake/multinode/runs/<run>/ of the working directory. `--run latest` (the default) is the run that started
submitting last; a unique prefix of a run id is enough.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from snakemake_executor_multinode.contract.jobfiles import REPORTS_DIR, STATE_ROOT, StateFolders
from snakemake_executor_multinode.slurm.client import ACTIVE_STATES, QueryError, RetryPolicy, SlurmClient, job_order
from snakemake_executor_multinode.watching import cancelling, clean, logs, report, report_files, status_view

# An interactive command waits out a restarting controller for a minute, not the executor's ten.
RETRY = RetryPolicy(total_seconds=60)
CHECKPOINT_WAIT_S = 300.0  # `cancel --checkpoint`: the longest wait for a training's save before it is cancelled


RUN_HELP = "latest (default), or a run id (or a unique prefix)"


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """status, logs, cancel, report, clean: each command's parser, in the order `--help` lists them."""
    _status_parser(sub)
    _logs_parser(sub)
    _cancel_parser(sub)
    _report_parser(sub)
    _clean_parser(sub)


def _directory(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-d", "--directory", type=Path, default=Path.cwd(), help="Snakemake's working directory (default: here)"
    )


def _run_and_directory(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", default="latest", help=RUN_HELP)
    _directory(p)


def _status_parser(sub: argparse._SubParsersAction) -> None:
    status = sub.add_parser(
        "status", help="a run's jobs: state, nodes x GPUs, elapsed/limit, restarts, progress, log; GPU use per node"
    )
    _run_and_directory(status)
    status.add_argument("--all", action="store_true", help="every run of this folder, oldest first")
    status.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    status.add_argument("--interval", type=float, default=10.0, help="seconds between refreshes (default 10)")
    status.set_defaults(func=status_command)


def _logs_parser(sub: argparse._SubParsersAction) -> None:
    lg = sub.add_parser(
        "logs",
        help="a job's log, labelled [<node> rank<R>] by `multinode torchrun`; -f follows it until the job ends",
    )
    lg.add_argument(
        "job",
        nargs="?",
        metavar="JOB",
        help="a SLURM job id, a rule name or an output path of this folder's runs (default: the newest job)",
    )
    lg.add_argument("-f", "--follow", action="store_true", help="print lines as they come until the job ends")
    only = lg.add_mutually_exclusive_group()
    only.add_argument("--rank", type=int, metavar="R", help="only the lines of global rank R")
    only.add_argument("--node", metavar="N", help="only the lines of node N (host name): its ranks' and torchrun's")
    _directory(lg)
    lg.set_defaults(func=logs_command)


def _cancel_parser(sub: argparse._SubParsersAction) -> None:
    cancel = sub.add_parser("cancel", help="cancel a run's jobs that are still queued or running, and only those")
    _run_and_directory(cancel)
    cancel.add_argument(
        "--checkpoint",
        action="store_true",
        help="first ask the running trainings (multinode torchrun) to checkpoint, as at the time limit, and wait for "
        "them to end (the next snakemake resumes from that checkpoint); the other jobs are cancelled at once",
    )
    cancel.add_argument(
        "--wait",
        type=float,
        default=CHECKPOINT_WAIT_S,
        metavar="SECONDS",
        help=f"with --checkpoint: cancel a training that has not ended this long after the request (default "
        f"{CHECKPOINT_WAIT_S:.0f})",
    )
    cancel.set_defaults(func=cancel_command)


def _report_parser(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser("report", help=f"a run's efficiency report (written to {REPORTS_DIR}/)")
    _run_and_directory(rep)
    rep.add_argument(
        "--for",
        dest="outputs",
        nargs="+",
        metavar="OUTPUT",
        help="instead of a run: the jobs that made these outputs (the newest that succeeded, of any run)",
    )
    rep.add_argument("--chart", type=Path, metavar="SVG", help="also write where the allocation went as a bar chart")
    rep.add_argument("--html", type=Path, metavar="HTML", help="also write the report as one HTML page")
    rep.add_argument(
        "--provenance", type=Path, metavar="HTML", help="with --for: also write each output's provenance, one table"
    )
    rep.set_defaults(func=report_command)


def _clean_parser(sub: argparse._SubParsersAction) -> None:
    cl = sub.add_parser(
        "clean",
        help=f"remove what finished jobs left under {STATE_ROOT}/ (never a queued or running job's state)",
        description=clean.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cl.add_argument("--older-than", default="0", help="only jobs that ended this long ago: 30d, 12h, 90m (default 0)")
    cl.add_argument("--keep-failed", action="store_true", help="keep jobs no run saw succeed (to read their logs)")
    cl.add_argument("--dry-run", action="store_true", help="list what would be removed, with sizes; remove nothing")
    _directory(cl)
    cl.set_defaults(func=clean_command)


def _client() -> SlurmClient:
    return SlurmClient(retry=RETRY, notify=lambda msg: print(msg, file=sys.stderr))


def _unanswered(command: str, err: Exception) -> str:
    text = f"multinode {command}: SLURM did not answer: {err}"
    if "configuration source" in text:
        text += (
            '\n(no SLURM configuration: set SLURM_CONF, or for the local sandbox run `eval "$(multinode cluster env)"`)'
        )
    return text


def status_text(workdir: Path, which: str, every_run: bool, client: SlurmClient) -> str:
    """The table(s), from one SLURM query for every job shown."""
    table = status_view.run_table(workdir)
    chosen = list(table) if every_run else [status_view.resolve_run(table, which)]
    if every_run and not chosen:
        raise status_view.RunNotFound("no run has submitted a job from this folder")
    subs = [s for run in chosen for s in table[run]]
    views = status_view.slurm_views(client, [s.jobid for s in subs if s.jobid])
    preempted = status_view.preempted(client, subs)
    blocks = []
    for run in chosen:
        rows = status_view.rows_for(table[run], views, workdir, preempted)
        blocks.append(status_view.render(run, rows, workdir, started=status_view.run_started(table[run])))
    return "\n\n".join(blocks)


def status_command(args: argparse.Namespace) -> int:
    workdir = args.directory.resolve()
    client = _client()
    try:
        if not args.watch:
            print(status_text(workdir, args.run, args.all, client))
            return 0

        def show() -> str:
            try:
                return status_text(workdir, args.run, args.all, client)
            except QueryError as err:  # asked again at the next refresh
                return f"SLURM did not answer: {err}"

        status_view.watch(show, args.interval, lambda text: print(text, flush=True), sys.stdout.isatty())
    except status_view.RunNotFound as err:
        print(f"multinode status: {err}", file=sys.stderr)
        return 1
    except QueryError as err:
        print(_unanswered("status", err), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


def logs_command(args: argparse.Namespace) -> int:
    """Exit 2 when there is no such job or no log to print (one line on stderr naming what was looked for)."""
    workdir = args.directory.resolve()
    keep = logs.line_filter(args.rank, args.node)
    out = sys.stdout.buffer
    try:
        sub = status_view.find_job(workdir, args.job)
        if args.follow:
            logs.follow(sub, keep, out, _client())
        else:
            logs.show(sub, keep, out)
    except (status_view.JobNotFound, logs.NoLog) as err:
        print(f"multinode logs: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `multinode logs | head`
        return 0
    return 0


def cancel_command(args: argparse.Namespace) -> int:
    workdir = args.directory.resolve()
    client = _client()
    try:
        table = status_view.run_table(workdir)
        run = status_view.resolve_run(table, args.run)
    except status_view.RunNotFound as err:
        print(f"multinode cancel: {err}", file=sys.stderr)
        return 1
    subs = table[run]
    ids = {s.jobid for s in subs if s.jobid}
    # A submission whose sbatch reply never came is found by its name, which is unique to it.
    if names := [s.job_name for s in subs if s.jobid is None]:
        ids |= set(client.find_by_names(names))
    try:
        views = status_view.slurm_views(client, ids)
        active = sorted((j for j in ids if j in views and views[j].state in ACTIVE_STATES), key=job_order)
    except QueryError:
        active = sorted(ids, key=job_order)  # not known which still run: scancel of an ended job does no harm
    if not active:
        print(f"run {run}: no job queued or running ({len(ids)} job(s) ended)")
        return 0
    try:
        if args.checkpoint:
            return _cancel_checkpointing(workdir, run, active, client, args.wait)
        client.cancel(active)
    except QueryError as err:
        print(_unanswered("cancel", err), file=sys.stderr)
        return 1
    print(f"run {run}: cancelled SLURM job(s) {' '.join(active)}")
    return 0


def _cancel_checkpointing(workdir: Path, run: str, active: list[str], client: SlurmClient, wait_s: float) -> int:
    trainings = cancelling.training(client, active)
    if others := [j for j in active if j not in trainings]:
        client.cancel(others)
    done = cancelling.checkpoint_then_cancel(
        client, StateFolders(workdir).state, trainings, wait_s, lambda line: print(f"run {run}: {line}", flush=True),
        "multinode cancel --checkpoint",
    )  # fmt: skip
    done.cancelled[:0] = others
    for jobs, what in (
        (done.checkpointed, "checkpointed and ended (the next snakemake resumes from the checkpoint)"),
        (done.ended, "ended, without the checkpoint's exit code (see its log)"),
        (done.cancelled, "cancelled"),
    ):
        if jobs:
            print(f"run {run}: SLURM job(s) {' '.join(jobs)} {what}")
    return 0


def report_command(args: argparse.Namespace) -> int:
    """A run's report, written under REPORTS_DIR; or (--for) the report of the jobs that made some outputs, for a
    rule of the workflow to hand to Snakemake's report (--chart, --html, --provenance)."""
    workdir = args.directory.resolve()
    if args.provenance and not args.outputs:
        print("multinode report: --provenance needs --for OUTPUT...: the outputs to describe", file=sys.stderr)
        return 2
    try:
        if args.outputs:
            subs, missing = status_view.makers(workdir, args.outputs)
            if not subs:
                made = " ".join(args.outputs)
                print(f"multinode report: no job of the runs in {workdir} made {made}", file=sys.stderr)
                return 1
            if missing:
                print(f"multinode report: not made by a job of these runs: {' '.join(missing)}", file=sys.stderr)
            runs = ", ".join(dict.fromkeys(s.run_id for s in subs))
            # the outputs exist, so their jobs have ended: wait, as a run's end does, for accounting to record that
            result = report.collect(runs, subs, _client(), settle_seconds=report.SETTLE_SECONDS)
        else:
            table = status_view.run_table(workdir)
            run = status_view.resolve_run(table, args.run)
            result = report.collect(run, table[run], _client())
    except status_view.RunNotFound as err:
        print(f"multinode report: {err}", file=sys.stderr)
        return 1
    except QueryError as err:
        print(_unanswered("report", err) + "\n(the report needs sacct: SLURM's accounting)", file=sys.stderr)
        if not args.outputs:
            return 1
        # a workflow's report rule goes on: its files say that the figures are unknown, the provenance is local
        return _write_files(args, workdir, [], *_unknown(f"SLURM's accounting did not answer ({err})"))
    try:
        written = [] if args.outputs else list(report.write(result, workdir))  # a run's files are the run's, by its id
    except OSError as err:
        print(f"multinode report: cannot write the report: {err}", file=sys.stderr)
        return 1
    print(report.to_markdown(result), end="")
    return _write_files(
        args, workdir, written, lambda: report_files.ledger_chart(result), lambda: report_files.efficiency_html(result)
    )


def _unknown(why: str) -> tuple[Callable[[], str], Callable[[], str]]:
    return (lambda: report_files.unknown_chart(why)), (lambda: report_files.unknown_html(why))


def _write_files(
    args: argparse.Namespace, workdir: Path, written: list[Path], chart: Callable[[], str], html: Callable[[], str]
) -> int:
    """The files --chart, --html and --provenance ask for; 1 when one cannot be written."""
    files = (
        (args.chart, chart),
        (args.html, html),
        (args.provenance, lambda: report_files.provenance_html(workdir, args.outputs)),
    )
    try:
        for path, text in files:
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                report.write_text(path, text())
                written.append(path)
    except OSError as err:
        print(f"multinode report: cannot write {err.filename}: {err.strerror}", file=sys.stderr)
        return 1
    if written:
        print(f"\nwritten: {', '.join(map(str, written))}")
    return 0


def clean_command(args: argparse.Namespace) -> int:
    try:
        seconds = clean.older_than_seconds(args.older_than)
    except clean.CleanError as err:
        print(f"multinode clean: {err}", file=sys.stderr)
        return 2
    client = _client()

    def active(ids: list[str]) -> set[str] | None:
        try:
            return {j for j, state in client.live(ids).items() if state.active}
        except QueryError:
            return None

    workdir = args.directory.resolve()
    cleaning = clean.plan(workdir, seconds, args.keep_failed, active)
    if args.dry_run:
        for path, size in sorted(cleaning.remove.items()):
            shown = path.relative_to(workdir) if path.is_relative_to(workdir) else path
            print(f"{clean.size_text(size):>9}  {shown}")
    else:
        clean.apply(workdir, cleaning)
    kept = ", ".join(f"{n} {why}" for why, n in cleaning.kept.items()) or "none"
    print(
        f"multinode clean: {'would remove' if args.dry_run else 'removed'} {len(cleaning.remove)} file(s) and "
        f"folder(s), {clean.size_text(cleaning.size)} ({len(cleaning.removed_records)} job record(s)); kept jobs: "
        f"{kept}"
    )
    if cleaning.note:
        print(f"multinode clean: {cleaning.note}", file=sys.stderr)
    return 0
