"""Notice finished jobs within a second without loading slurmctld.

The job script writes its exit code into an exit marker (contract/jobfiles.py) when it ends, so each status cycle is
a few stat() calls on the shared filesystem. A slow batched sweep (one sacct, or squeue when accounting is off)
catches jobs that die without writing a marker: cancelled, killed at the time limit, lost with their node, never
started.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from snakemake_executor_multinode.contract.jobfiles import (
    CRASH_MARKER,
    EXIT_MARKER,
    FAILED_NODE_MARKER,
    MARKERS,
    PREEMPT_NOTICE_MARKER,
    REQUEUE_MARKER,
    STALL_MARKER,
    marker,
)
from snakemake_executor_multinode.contract.protocol import EXIT_CODE_CHANGED, EXIT_CRASH_LOOP, EXIT_PREEMPTED
from snakemake_executor_multinode.contract.state_files import Damaged, ignored, marker_text
from snakemake_executor_multinode.launching import preemption
from snakemake_executor_multinode.slurm import reasons
from snakemake_executor_multinode.slurm.client import JobState, QueryError, SlurmClient

# States of a job that SLURM has put back into the queue after a run ended.
REQUEUED_STATES = {"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "PENDING"}
# A run's state in accounting that SLURM may follow with a requeue of the job (PreemptMode=REQUEUE).
PREEMPTED_STATES = {"PREEMPTED"}
# What the job_status does instead of believing a damaged marker (contract/state_files.py).
_INSTEAD = {
    EXIT_MARKER: "how the job ended is asked of SLURM (the next sweep)",
    FAILED_NODE_MARKER: "no node is blamed for the failure",
    REQUEUE_MARKER: "the requeue is not reported",
    STALL_MARKER: "the failure is reported without the watchdog's verdict",
    PREEMPT_NOTICE_MARKER: "the requeue is reported without the preemption",
    CRASH_MARKER: "the failure is reported without the crash loop's count",
}
UNKNOWN_SWEEPS = 3  # sweeps in a row in which SLURM does not know a job before it counts as lost
# A run ended by SLURM's SIGTERM (exit 128 + 15: scancel, the time limit, preemption) whose job slurmctld still shows
# COMPLETING is reported once SLURM names how it ended (CANCELLED, TIMEOUT, ...), which it does a moment after the
# job script's exit marker, or after this long. Any other failure (a dead node's job stays COMPLETING until
# SlurmdTimeout, minutes) is reported at once.
SIGTERM_EXIT = 143
COMPLETING_WAIT_S = 5.0


@dataclass(frozen=True)
class Outcome:
    jobid: str
    finished: bool
    success: bool = False
    exit_code: int | None = None
    state: JobState | None = None
    failed_node: str | None = None
    note: str | None = None  # news of a job still running, e.g. "requeued (...), restart 2"
    stalled: str | None = None  # the progress watchdog's verdict (launching/stall.py), when it ended the job
    crashes: str | None = None  # "<runs> <exit>" of a crash loop the job script ended (EXIT_CRASH_LOOP)

    def describe(self) -> str:
        parts = [self.stalled] if self.stalled else []
        if self.state is not None:
            parts.append(f"SLURM state {self.state.state}")
            if self.state.reason not in reasons.NO_REASON:
                parts.append(f"reason {self.state.reason}")
            if self.state.exit_code:
                parts.append(f"exit code {self.state.exit_code}")
            if self.state.nodes and self.state.nodes not in ("None assigned", "(null)"):
                parts.append(f"nodes {self.state.nodes}")
        if self.exit_code is not None:
            parts.append(f"job script exit {self.exit_code}")
            if self.exit_code == EXIT_PREEMPTED:
                parts.append("(checkpointed and not requeued: a rerun or --retries resumes from the checkpoint)")
            if self.exit_code == EXIT_CODE_CHANGED:
                parts.append("(a restart found the code changed since submission and did not resume: see the log)")
            if self.exit_code == EXIT_CRASH_LOOP and self.crashes:
                runs, _, last = self.crashes.partition(" ")
                parts.append(f"(a crash loop: {runs} runs in a row failed soon after their start, the last with exit "
                             f"{last}; not run again: see the log)")  # fmt: skip
        if self.failed_node:
            parts.append(f"failing node {self.failed_node}")
        if self.finished and self.note:
            parts.append(self.note)
        return ", ".join(parts) or "unknown"


class JobStatus:
    def __init__(
        self,
        state_dir: Path,
        client: SlurmClient,
        sweep_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state_dir = state_dir
        self.client = client
        self.sweep_seconds = sweep_seconds
        self.clock = clock
        self._last_sweep = clock()
        self.query_failures = 0
        self._stale: dict[str, str] = {}  # job -> exit marker text of a run SLURM requeued since
        self._noted: dict[str, str] = {}  # job -> requeue marker text already reported
        self._unknown: dict[str, int] = {}  # job -> sweeps in a row in which SLURM did not know it
        self._names: dict[str, str] = {}  # job -> its job name, unique to the submission (expect())
        self._completing: dict[str, float] = {}  # job -> when its failed run was first seen COMPLETING
        self._present: set[str] | None = None  # the state folder's names during a cycle (None: read the files)

    def expect(self, jobid: str, job_name: str) -> None:
        """Markers of `jobid` count only when the job of this name wrote them. A job id repeats when a cluster's
        state is rebuilt: a marker an earlier job of the same id left in the state folder is not this job's."""
        self._names[jobid] = job_name

    def marker(self, jobid: str) -> Path:
        return marker(self.state_dir, jobid, EXIT_MARKER)

    def _read(self, jobid: str, suffix: str) -> str | None:
        path = marker(self.state_dir, jobid, suffix)
        if self._present is not None and path.name not in self._present:
            return None  # not in this cycle's listing: no open() per running job
        try:
            return marker_text(path, suffix)
        except FileNotFoundError:
            return None
        except Damaged as err:
            ignored(err, _INSTEAD.get(suffix, "the marker is left out"))
            return None

    def _list(self) -> set[str] | None:
        """The state folder's names, one listing per cycle: a cycle's cost does not grow with the running jobs."""
        try:
            return set(os.listdir(self.state_dir))
        except FileNotFoundError:
            return set()
        except OSError:
            return None  # read each marker instead

    def _from_marker(self, jobid: str, fresh: bool = False) -> Outcome | None:
        if fresh:
            self._present = None
        text = self._read(jobid, EXIT_MARKER)
        if text is None or self._stale.get(jobid) == text:
            return None  # none yet, or the marker of a run that SLURM has requeued since
        words = text.split()
        expected = self._names.get(jobid)
        if expected is not None and len(words) > 2 and words[2] != expected:
            if expected.startswith(words[2]):  # the name cut short: the marker is damaged, not another job's
                why = f"cut short (it names job {words[2]!r}, the start of {expected!r})"
                ignored(Damaged(self.marker(jobid), why), _INSTEAD[EXIT_MARKER])
            return None  # another job's, of the same id
        word = words[0] if words else ""
        code = int(word) if word.lstrip("-").isdigit() else 1
        return Outcome(
            jobid, True, code == 0, code, failed_node=self._read(jobid, FAILED_NODE_MARKER),
            stalled=self._read(jobid, STALL_MARKER), crashes=self._read(jobid, CRASH_MARKER),
        )  # fmt: skip

    def _requeue_note(self, jobid: str) -> str | None:
        """The job's own requeue (after a pre-time-limit checkpoint), once per restart."""
        text = self._read(jobid, REQUEUE_MARKER)
        if text is None or self._noted.get(jobid) == text:
            return None
        self._noted[jobid] = text
        restart, _, why = text.partition(" ")
        return f"requeued ({why}), restart {restart}"

    def _preempted(self, jobid: str) -> str | None:
        """The run's preemption notice (launching/preemption.py), said; None without one (or once the next run has
        removed it)."""
        text = self._read(jobid, PREEMPT_NOTICE_MARKER)
        if text is None:
            return None
        try:
            notice = json.loads(text)
        except ValueError:
            notice = None
        return preemption.when(notice if isinstance(notice, dict) else {})

    def _judge_failed_run(self, jobid: str, ended: Outcome, state: JobState | None, answered: bool) -> Outcome:
        """A run ended with an error. Did the job end (a failure), or does SLURM run it again (preemption,
        `scontrol requeue`, a node failure with requeue)? slurmctld decides, by the restart count: sacct lags."""
        text = self._read(jobid, EXIT_MARKER) or ""
        words = text.split()
        restart = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
        try:
            live = self.client.live([jobid]).get(jobid)
        except QueryError:
            # Without slurmctld's word a requeue cannot be told from a failure (seen under load: squeue timed out,
            # sacct did not know the job yet, and a failure went out without SLURM's state): ask again next cycle.
            return Outcome(jobid, False, state=state)
        if live is not None:
            if (live.restarts or 0) > restart or live.state in REQUEUED_STATES:
                self._stale[jobid] = text
                why = f"the run ended with exit {ended.exit_code}; SLURM state {live.state}"
                if (preempted := self._preempted(jobid)) is not None:
                    done = "checkpointed" if ended.exit_code == EXIT_PREEMPTED else f"exit {ended.exit_code}"
                    why = f"preempted: {preempted}; {done}"
                return Outcome(jobid, False, state=live, note=f"requeued ({why}), restart {restart + 1}")
            # RUNNING: the EXIT trap wrote the marker before the shell ended; ask again next cycle. COMPLETING with
            # this run's restart count is final: a requeue raises the count at once (checked above; measured: a
            # `scontrol requeue` shows COMPLETING with the count raised). Waiting on COMPLETING would wait for a
            # dead node's cleanup, that is SlurmdTimeout (minutes).
            if live.active and not (live.state == "COMPLETING" and live.restarts is not None):
                return Outcome(jobid, False, state=live)
            if live.state == "COMPLETING" and ended.exit_code == SIGTERM_EXIT and (state is None or state.active):
                first = self._completing.setdefault(jobid, self.clock())
                if self.clock() - first < COMPLETING_WAIT_S:
                    return Outcome(jobid, False, state=live)  # SLURM names the end in a moment
            return replace(ended, state=state if state is not None and not state.active else live)  # sacct lags
        if not answered or (state is not None and state.active):
            return Outcome(jobid, False, state=state)  # neither source is sure yet: never a failure on a guess
        return replace(ended, state=state)

    def poll(self, jobids: Iterable[str], force_sweep: bool = False) -> dict[str, Outcome]:
        """Outcome of every job given; `finished=False` for those still pending or running (or requeued)."""
        ids = list(jobids)
        self._present = self._list()
        try:
            return self._poll(ids, force_sweep)
        finally:
            self._present = None  # reads outside a cycle look at the files themselves

    def _poll(self, ids: list[str], force_sweep: bool) -> dict[str, Outcome]:
        outcomes = {j: o for j in ids if (o := self._from_marker(j)) is not None}
        failed = [j for j, o in outcomes.items() if not o.success]
        unknown = [j for j in ids if j not in outcomes]
        due = force_sweep or self.clock() - self._last_sweep >= self.sweep_seconds
        ask = failed + (unknown if due else [])
        states: dict[str, JobState] = {}
        answered = False
        if ask:
            try:
                states = self.client.query(ask)
                answered = True
                self.query_failures = 0
                if due:
                    self._last_sweep = self.clock()
            except QueryError:
                # Asked again next cycle; a query failure never fails a job.
                self.query_failures += 1
        for jobid in failed:
            outcomes[jobid] = self._judge_failed_run(jobid, outcomes[jobid], states.get(jobid), answered)
        for jobid in unknown:
            state = states.get(jobid)
            if answered and due and state is None:
                # Neither sacct nor squeue knows it: lost when slurmctld lost its newest state, or purged. A few
                # sweeps of that (never one: a job is briefly unknown to sacct) and it is a failure, not a hang.
                self._unknown[jobid] = self._unknown.get(jobid, 0) + 1
                if self._unknown[jobid] >= UNKNOWN_SWEEPS and self._from_marker(jobid, fresh=True) is None:
                    outcomes[jobid] = Outcome(
                        jobid, True, False, note=f"SLURM has no record of the job ({UNKNOWN_SWEEPS} sweeps)"
                    )
                    continue
            elif state is not None:
                self._unknown.pop(jobid, None)
            if (
                state is not None
                and state.state == "PENDING"
                and (why := reasons.explain(state.reason))
                and why.hopeless
            ):
                note = f"it can never start: {reasons.say(state.reason, jobid)}"
                outcomes[jobid] = Outcome(jobid, True, False, state=state, note=note)
            elif state is None or state.active:
                outcomes[jobid] = Outcome(jobid, False, state=state, note=self._requeue_note(jobid))
            elif (late := self._from_marker(jobid, fresh=True)) is not None:  # ended between the listing and the query
                outcomes[jobid] = Outcome(jobid, True, late.success, late.exit_code, state, late.failed_node)
            elif state.state in PREEMPTED_STATES and (held := self._still_held(jobid, state)) is not None:
                outcomes[jobid] = held
            else:
                outcomes[jobid] = Outcome(jobid, True, state.succeeded, None, state)
        return outcomes

    def _still_held(self, jobid: str, state: JobState) -> Outcome | None:
        """Accounting says a run was preempted: under PreemptMode=REQUEUE slurmctld holds the job (requeued, its run
        still completing, or running again), whose job script may not have written its marker yet (a training that
        its grace time's end stops takes seconds); under CANCEL the job has ended. slurmctld decides (sacct lags);
        None: ended. A query that fails asks again next cycle, never a failure on a guess."""
        try:
            live = self.client.live([jobid]).get(jobid)
        except QueryError:
            return Outcome(jobid, False, state=state)
        if live is not None and live.active:
            return Outcome(jobid, False, state=live)
        return None

    def forget(self, jobid: str) -> None:
        self._stale.pop(jobid, None)
        self._noted.pop(jobid, None)
        self._unknown.pop(jobid, None)
        self._names.pop(jobid, None)
        self._completing.pop(jobid, None)
        for suffix in MARKERS:
            marker(self.state_dir, jobid, suffix).unlink(missing_ok=True)
