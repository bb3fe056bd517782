"""Preemption as a running job meets it: SLURM's SIGTERM becomes the training's checkpoint request.

What SLURM does, measured on 22.05 and 24.11 (`multinode cluster up --preemption`, docs/further.md "Preemption"):
when a job of a higher PriorityTier (or QOS) takes a running job's nodes and the running job's partition (or QOS)
has a GraceTime, slurmctld sets the job's PreemptTime, moves its EndTime to PreemptTime + GraceTime, and sends
SIGCONT and SIGTERM to every step's task (with proctrack/cgroup the task alone, not its children), not to the batch
shell. When that end comes it sends SIGCONT and SIGTERM to the batch shell and every step (SIGKILL after KillWait)
and requeues the job (PreemptMode=REQUEUE: the same job id, its restart count raised, the run's accounting record
PREEMPTED) or ends it (CANCEL). The job's own `--signal` (USR2 before the time limit) is not sent, unless the site
sets SchedulerParameters=preempt_send_user_signal. A scancel's or the time limit's SIGTERM reaches the batch shell
and the steps at once, and the job has no PreemptTime.

So a step's task cannot tell a preemption from a scancel by the signal: each node's labeller (nodelog.py), the
launcher step's task, asks slurmctld (`ask`: one squeue) before it passes a SIGTERM on. A preemption becomes the
checkpoint signal to the workers (the rule's, USR2 by default: the contract's time-limit path, unchanged for the
script); the first node to learn of it writes the notice (`record`) for the job script, which then waits for SLURM
to end the run rather than ending the job itself (an early end would be no preemption to SLURM: never requeued),
and for the runs file, where the goodput ledger books the time from the notice on as `preempted`. Anything else,
and a second SIGTERM (the grace time's end, or a scancel during it), stops torchrun at once, as before.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.contract.jsonl import json_lines
from snakemake_executor_multinode.contract.state_files import Damaged, ignored, read_json
from snakemake_executor_multinode.slurm.client import Preemption, QueryError, SlurmClient

ASK_TIMEOUT_S = 10.0  # the question about a SIGTERM: slurmctld sent the signal just now, so it answers
EVENT = "preempted"  # the notice's (and the runs file's) event
CHECKPOINT_SIGNALS = ("USR2", "USR1")  # what a training may handle as the checkpoint request (the rule's signal)


def ask(env: Mapping[str, str], client: SlurmClient | None = None) -> Preemption | None:
    """Whether slurmctld is preempting this job now (one squeue, one attempt). QueryError when it does not answer."""
    job = env.get("SLURM_JOB_ID", "")
    if not job:
        return None
    client = client or SlurmClient(timeout=ASK_TIMEOUT_S)
    return client.preemption(job)


def checkpoint_signal(env: Mapping[str, str]) -> str:
    """The signal the training checkpoints on: the rule's (the job script exports its name), where it is USR1 or
    USR2; the contract's USR2 otherwise (a TERM or a number would stop torchrun's agent, which ignores only these)."""
    name = env.get(protocol.CHECKPOINT_SIGNAL_VAR, "").removeprefix("SIG")
    return name if name in CHECKPOINT_SIGNALS else CHECKPOINT_SIGNALS[0]


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")


def notice_line(env: Mapping[str, str], preemption: Preemption, node: str) -> dict[str, Any]:
    """The notice as the runs file keeps it (its "time", like the start and end lines', is SLURM's PreemptTime)."""
    restart = env.get("SLURM_RESTART_COUNT", "0")
    return {
        "event": EVENT,
        "job": env.get("SLURM_JOB_ID", ""),
        "restart": int(restart) if restart.isdigit() else 0,
        "time": _iso(preemption.notice),
        "ends": _iso(preemption.ends),
        "grace_s": None if preemption.grace_s is None else round(preemption.grace_s),
        "node": node,
    }


def record(env: Mapping[str, str], preemption: Preemption, node: str) -> str | None:
    """The notice for the job script ($MULTINODE_PREEMPT_NOTICE_FILE, whole or not at all; the first node wins) and,
    from the node that wrote it, for the runs file. Returns an error to log where a file could not be written (the
    job script then ends the job as for a scancel: nothing waits for SLURM's requeue), else None."""
    line = json.dumps(notice_line(env, preemption, node))
    path = env.get(protocol.PREEMPT_NOTICE_FILE_VAR, "")
    if not path:
        return None  # not run by the plugin's job script: the checkpoint signal is all there is to do
    target = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(line + "\n")
            os.link(tmp, target)  # atomic, and fails where another node's notice is there first
        finally:
            os.unlink(tmp)
    except FileExistsError:
        return None
    except OSError as err:
        return f"cannot write the preemption notice {path}: {err.strerror or err}"
    if runs := env.get(protocol.RUNS_FILE_VAR):
        try:
            with open(runs, "a") as fh:
                fh.write(line + "\n")
        except OSError as err:
            return f"cannot write the preemption to the runs file {runs}: {err.strerror or err}"
    return None


def read(env: Mapping[str, str]) -> dict[str, Any] | None:
    """This run's notice; None without one. A damaged one is said and stands as a notice of unknown time (the job
    script waits for SLURM on the file's existence alone)."""
    path = env.get(protocol.PREEMPT_NOTICE_FILE_VAR, "")
    if not path:
        return None
    try:
        found = read_json(Path(path))
    except FileNotFoundError:
        return None
    except Damaged as err:
        ignored(err, "the preemption is said without its times")
        return {"event": EVENT}
    return found if isinstance(found, dict) else {"event": EVENT}


def noticed(env: Mapping[str, str], checkpointed: bool, node: str) -> dict[str, Any] | None:
    """This run's notice, as a node's labeller wrote it; or, for a training that checkpointed on its own signal with
    none written, SLURM's answer now: a site with SchedulerParameters=preempt_send_user_signal preempts with the
    job's --signal (USR2) instead of SIGTERM, which no labeller asks about. One squeue, only then."""
    found = read(env)
    if found is not None or not checkpointed:
        return found
    try:
        preempting = ask(env)
    except QueryError:
        return None  # said as a checkpoint before the time limit: the job requeues itself
    if preempting is None:
        return None
    record(env, preempting, node)
    return read(env) or notice_line(env, preempting, node)


def _epoch(text: object) -> float | None:
    try:
        return datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return None


def save_seconds(metrics: Sequence[Any]) -> tuple[list[float], float | None]:
    """How long each save of the job took: its metrics' checkpoint_begin to checkpoint_end of the same step (the
    training's own `wall` clock), in the file's order; and when the last save began if it has not ended (a save
    under way), else None."""
    begun: dict[object, float] = {}
    took: list[float] = []
    for rec in metrics:
        if not isinstance(rec, dict) or not isinstance(wall := rec.get("wall", rec.get("time")), int | float):
            continue
        if not math.isfinite(wall):
            continue
        if rec.get("event") == "checkpoint_begin":
            begun[rec.get("step")] = float(wall)
        elif rec.get("event") == "checkpoint_end" and (start := begun.pop(rec.get("step"), None)) is not None:
            took.append(max(float(wall) - start, 0.0))
        elif rec.get("event") == "resume":
            begun.clear()  # a save an earlier run did not finish
    return took, max(begun.values(), default=None)


def verdict(notice: Mapping[str, Any], code: int, checkpointed: bool, env: Mapping[str, str], now: float) -> str:
    """The launcher's line on a preempted run: checkpointed in time, the grace time too short for the save, or a
    training that ended on the checkpoint signal without a checkpoint (it does not handle it)."""
    path = env.get(protocol.METRICS_FILE_VAR)
    metrics = json_lines(Path(path)) if path else []  # the training's metrics: its saves' times
    if checkpointed:
        took, _ = save_seconds(metrics)
        saved = f"; its save took {took[-1]:.1f} s" if took else ""
        return f"training checkpointed on preemption ({when(notice)}){saved}; SLURM ends the run at its grace time"
    ends = _epoch(notice.get("ends"))
    if ends is not None and now < ends - 1:
        return (
            f"preempted ({when(notice)}): the training ended with exit {code} before the grace time's end, without a "
            f"checkpoint: does it checkpoint on SIG{checkpoint_signal(env)} and write ${protocol.PREEMPT_FILE_VAR}? "
            "(docs/training-contract.md)"
        )
    return too_short(notice, metrics, now)


def when(notice: Mapping[str, Any]) -> str:
    """ "SLURM's SIGTERM at 05:47:18, grace time 10 s, to 05:47:28" (as much as the notice says)."""
    at, ends, grace = _epoch(notice.get("time")), _epoch(notice.get("ends")), notice.get("grace_s")
    said = "SLURM's preemption SIGTERM" + (f" at {_clock(at)}" if at is not None else "")
    if isinstance(grace, int | float):
        said += f", grace time {grace:.0f} s"
    return said + (f", to {_clock(ends)}" if ends is not None else "")


def _clock(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).strftime("%H:%M:%S")


def too_short(notice: Mapping[str, Any], metrics: Sequence[Any], now: float) -> str:
    """What the log says when the grace time ended before the training's checkpoint: the grace time SLURM gave, how
    long this job's saves took (its metrics), the save it cut short, and what to ask for."""
    took, under_way = save_seconds(metrics)
    grace = notice.get("grace_s")
    said = f"preempted: the grace time ended before the training's checkpoint ({when(notice)})"
    longest = max(took, default=0.0)
    if took:
        said += f"; this job's saves took {sum(took) / len(took):.1f} s on average, {longest:.1f} s at most"
        said += f" ({len(took)} save{'s' if len(took) > 1 else ''})"
    else:
        said += "; no finished save of this job is in its metrics (checkpoint_begin/checkpoint_end)"
    if under_way is not None:
        cut = max(now - under_way, 0.0)
        said += f"; the save begun at {_clock(under_way)} was still running {cut:.1f} s later, when SLURM ended the run"
        longest = max(longest, cut)
    if isinstance(grace, int | float) and took and grace < max(took):
        said += f": the grace time ({grace:.0f} s) is shorter than a save"
    said += "; the next run resumes from the last checkpoint the training finished"
    if longest > 0:
        enough = math.ceil(longest * 1.5 + 30)  # the save, headroom, a step to finish first and SLURM's slack
        said += f". Ask the cluster's admins for a GraceTime of at least {enough} s, or save faster"
    return said + " (docs/preemption.md)"
