"""What Snakemake is told when a job fails: SLURM's verdict, the log, and the failing rank's last lines.

torchrun's root-cause summary names the rank that failed first; its labelled lines (contract/logline.py) are in the
failing node's file beside the job log (launching/nodelog.py). The message quotes them, then the end of the job log
(the launcher's verdict); the job log's end alone when no node is named or no node file holds its lines.
"""

from __future__ import annotations

from pathlib import Path

from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.contract.logline import failing_rank_lines
from snakemake_executor_multinode.watching.job_status import Outcome
from snakemake_executor_multinode.watching.progress import read_tail


def failure_message(jobid: str, outcome: Outcome, log: Path | None) -> str:
    tail = _failure_lines(log, outcome.failed_node) if log else ""
    return f"SLURM job {jobid} failed: {outcome.describe()}; log: {log}{tail} "


def _last_lines(log: Path, count: int = 12) -> str:
    """The end of the job's log (the failing rank's last words), indented."""
    tail = read_tail(log, 16384)
    lines = tail.decode(errors="replace").splitlines()[-count:] if tail else []
    return "\nlast lines of the log:\n" + "\n".join(f"    {line}" for line in lines) if lines else ""


def _failure_lines(log: Path, node: str | None) -> str:
    """The failing rank's last lines from the newest node file of the failing node, then the job log's end."""
    ours = sorted(
        JobFiles.from_log(log).node_outs(node) if node else (),
        key=lambda p: p.stat().st_mtime,
    )
    if not ours or node is None:
        return _last_lines(log)
    tail = read_tail(ours[-1], 65536)
    if tail is None:
        return _last_lines(log)
    who, lines = failing_rank_lines(tail.decode(errors="replace"), node, 10)
    if not lines:
        return _last_lines(log)
    quoted = "\n".join(f"    {line}" for line in lines)
    return f"\nlast lines of {who} ({ours[-1]}):\n{quoted}" + _last_lines(log, 5)
