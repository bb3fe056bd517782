"""Thin wrappers over sbatch / sacct / squeue / scancel; their output parsed into JobState values."""

from __future__ import annotations

import math
import random
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from snakemake_executor_multinode.slurm.formats import array_tasks, epoch
from snakemake_executor_multinode.slurm.pacing import Pace
from snakemake_executor_multinode.slurm.reasons import NO_REASON

# States in which a job may still produce its outputs (a requeued job passes through several).
ACTIVE_STATES = {
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "RESIZING",
    "SUSPENDED",
    "CONFIGURING",
    "COMPLETING",
    "STAGE_OUT",
    "SIGNALING",
    "RESV_DEL_HOLD",
    "STOPPED",
}
SUCCESS_STATES = {"COMPLETED"}

Runner = Callable[..., subprocess.CompletedProcess]

# What SLURM's commands print while the controller (or slurmdbd) is restarting, failing over or overloaded: worth
# waiting for. Anything else (invalid account, bad request) is a permanent refusal and fails at once.
TRANSIENT = (
    "unable to contact slurm controller",
    "socket timed out",
    "unexpected message",
    "resource temporarily unavailable",
    "zero bytes were transmitted",
    "connection refused",
    "connection timed out",
    "communication connection failure",
    "slurm_persist_conn_open",
    "in standby mode",
    "timed out after",  # our own subprocess timeout
    "slurmdbd",  # sacct while slurmdbd is down
    "rate limit",  # rl_enable (23.02+): "RPC rate limit exceeded"
    "too many rpcs",
    "back off",
    "try again later",
)


def with_config_hint(message: str) -> str:
    """sbatch's "could not find a configuration source" means no SLURM_CONF here: say what to set (a run and
    `multinode check` both submit through sbatch, so both say it)."""
    if "configuration source" not in message:
        return message
    return (
        message
        + '\n(no SLURM configuration: set SLURM_CONF, or for the local sandbox run `eval "$(multinode cluster env)"`)'
    )


class SubmitError(RuntimeError):
    """sbatch refused the job; the message is sbatch's own."""


class QueryError(RuntimeError):
    """Neither sacct nor squeue answered: a reason to ask again later, never a job failure."""


class SlurmUnavailable(RuntimeError):
    """SLURM kept failing with transient errors for longer than the retry budget."""


JOB_KEY = re.compile(r"^\d+(_\d+)?$")  # a job id, or an array element's <array job id>_<task id>


def is_job_key(text: str) -> bool:
    return bool(JOB_KEY.match(text))


def job_order(key: str) -> tuple[int, int]:
    """Numeric order of job ids and array elements ("41" before "41_0" before "41_2" before "42")."""
    head, _, task = key.partition("_")
    return int(head), int(task) if task else -1


def is_transient(message: str) -> bool:
    text = message.lower()
    return any(marker in text for marker in TRANSIENT)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter for transient failures, for at most `total_seconds` per call."""

    total_seconds: float = 600.0
    first_delay: float = 1.0
    max_delay: float = 30.0

    def delays(self, rng: random.Random) -> Iterator[float]:
        delay = self.first_delay
        while True:
            yield delay * rng.uniform(0.5, 1.0)  # jitter: many clients do not retry in lockstep
            delay = min(delay * 2, self.max_delay)


@dataclass(frozen=True)
class JobState:
    jobid: str
    state: str
    exit_code: str = ""
    reason: str = ""
    nodes: str = ""
    restarts: int | None = None  # slurmctld's restart count (squeue); None where the answer came from sacct

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def succeeded(self) -> bool:
        return self.state in SUCCESS_STATES


@dataclass(frozen=True)
class Preemption:
    """slurmctld's notice that it preempts a running job: when it sent the job SIGTERM (squeue's PreemptTime) and
    when the job's grace time ends (its EndTime, moved to PreemptTime + GraceTime, or earlier with its time limit)."""

    notice: float  # epoch seconds
    ends: float | None  # epoch seconds; None when squeue gives no end

    @property
    def grace_s(self) -> float | None:
        return None if self.ends is None else max(self.ends - self.notice, 0.0)


@dataclass(frozen=True)
class Started:
    """A job that started on some nodes (squeue -w, sacct -N): a preempted run's preemptor is the first of them."""

    jobid: str
    start: float
    submit: float | None
    nodes: str


class SlurmClient:
    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        runner: Runner = subprocess.run,
        timeout: float = 30,
        retry: RetryPolicy = RetryPolicy(),
        notify: Callable[[str], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        pace: Pace | None = None,
    ) -> None:
        self.env = dict(env) if env is not None else None
        self.pace = pace  # sbatch calls per second (pacing.py); None: unpaced
        self.runner = runner
        self.timeout = timeout
        self.retry = retry
        self.notify = notify or (lambda msg: None)  # "waiting for SLURM ..." at most once a minute
        self.sleep = sleep
        self.clock = clock
        self.rng = random.Random()
        self._last_notice = -math.inf

    def _run(self, cmd: Sequence[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
        try:
            return self.runner(
                list(cmd),
                capture_output=True,
                text=True,
                env=self.env,
                cwd=cwd,
                timeout=self.timeout,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError as err:
            raise QueryError(f"{cmd[0]} not found: is SLURM's client installed and on PATH?") from err
        except subprocess.TimeoutExpired:
            # No answer in time is what a busy or restarting controller looks like: transient.
            return subprocess.CompletedProcess(list(cmd), 1, "", f"{cmd[0]}: timed out after {self.timeout:.0f} s")

    def _patiently(self, what: str, attempt: Callable[[], subprocess.CompletedProcess | None]) -> Any:
        """Call `attempt` until it returns a result that is not a transient failure, backing off in between.

        `attempt` returns None when it handled the outcome itself (e.g. found the job a lost reply submitted)."""
        start = self.clock()
        delays = self.retry.delays(self.rng)
        while True:
            proc = attempt()
            if proc is None or proc.returncode == 0 or not is_transient(proc.stderr or proc.stdout):
                return proc
            waited = self.clock() - start
            message = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no answer"]
            if waited >= self.retry.total_seconds:
                raise SlurmUnavailable(f"{what}: SLURM did not answer for {waited:.0f} s (the limit; {message[0]})")
            if self.clock() - self._last_notice >= 60:
                self._last_notice = self.clock()
                self.notify(
                    f"waiting for SLURM ({what}): {message[0]}; retrying for up to "
                    f"{self.retry.total_seconds - waited:.0f} s more"
                )
            self.sleep(next(delays))

    def submit(self, script: Path, cwd: Path, extra: Sequence[str] = (), name: str | None = None) -> str:
        """Submit and return the job id. Transient failures are retried; when `name` (the job name, unique to this
        submission) is given, a lost reply never becomes two jobs: before each retry, a job of that name is looked
        for and adopted."""
        tried = False
        found: list[str] = []

        def attempt() -> subprocess.CompletedProcess | None:
            nonlocal tried
            if tried and name:
                # %F: a job's id, or a job array's own id (its elements show as <id>_<task>)
                lookup = self._run(["squeue", "-h", "-t", "all", "-n", name, "-o", "%F"])
                if lookup.returncode != 0:
                    return lookup  # transient: ask again after the next delay, before submitting again
                if ids := [x for x in lookup.stdout.split() if x.isdigit()]:
                    found.append(ids[0])
                    return None
            tried = True
            if self.pace is not None:
                self.pace.take()
            return self._run(["sbatch", "--parsable", *extra, str(script)], cwd=cwd)

        try:
            proc = self._patiently("sbatch", attempt)
        except SlurmUnavailable as err:
            raise SubmitError(str(err)) from err
        except QueryError as err:
            raise SubmitError(str(err)) from err
        if proc is None:
            return found[0]
        if proc.returncode != 0:
            message = (proc.stderr or proc.stdout).strip().replace("sbatch: error: ", "")
            raise SubmitError(with_config_hint(message) or f"sbatch exited {proc.returncode}")
        jobid = proc.stdout.strip().split(";")[0]
        if not jobid.isdigit():
            raise SubmitError(f"sbatch printed no job id: {proc.stdout!r}")
        return jobid

    def test_only(self, script: Path, cwd: Path) -> str:
        """`sbatch --test-only`: would SLURM take this script as it stands? Queues nothing. Returns SLURM's answer
        ("Job N to start at ... in partition P"); a refusal raises SubmitError with the message a real submission
        would get. Transient failures are retried as for `submit`."""
        try:
            proc = self._patiently("sbatch --test-only", lambda: self._run(["sbatch", "--test-only", str(script)], cwd))
        except (SlurmUnavailable, QueryError) as err:
            raise SubmitError(str(err)) from err
        text = (proc.stderr + proc.stdout).strip()  # sbatch answers on stderr, success or not
        if proc.returncode != 0:
            message = with_config_hint(text.replace("sbatch: error: ", ""))
            raise SubmitError(message or f"sbatch --test-only exited {proc.returncode}")
        return text.removeprefix("sbatch: ")

    def version(self) -> str | None:
        """SLURM's release as its sbatch names it ("24.11.5"); None when sbatch does not answer. One attempt."""
        try:
            proc = self._run(["sbatch", "--version"])
        except QueryError:
            return None
        found = re.search(r"(\d+\.\d+(?:\.\d+)?)", proc.stdout) if proc.returncode == 0 else None
        return found[1] if found else None

    def show(self, kind: str) -> list[str]:
        """`scontrol -o show <kind>` (partition, node): one line per entity; [] when scontrol does not answer.
        One attempt: only messages are made from it."""
        try:
            proc = self._run(["scontrol", "-o", "show", kind])
        except QueryError:
            return []
        return proc.stdout.splitlines() if proc.returncode == 0 else []

    def associations(self, user: str) -> list[tuple[str, str]] | None:
        """(account, partition) of each of the user's associations in SLURM's accounting (partition "" for all);
        None when there is no accounting or it does not answer (one attempt: a run does not wait for slurmdbd)."""
        try:
            proc = self._run(
                ["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={user}", "format=account,partition"]
            )
        except QueryError:
            return None
        if proc.returncode != 0:
            return None
        rows = [line.split("|") for line in proc.stdout.splitlines() if line.strip()]
        return [(row[0], row[1] if len(row) > 1 else "") for row in rows]

    def query(self, jobids: Iterable[str]) -> dict[str, JobState]:
        """State of each job (one sacct call; squeue -t all when accounting is off or slurmdbd is down).

        Jobs neither knows are left out. One attempt: the status loop asks again next cycle, so a failure here
        (QueryError) only delays the answer and never fails a job."""
        ids = sorted(set(jobids), key=job_order)
        if not ids:
            return {}
        sacct = self._run(
            ["sacct", "-X", "-P", "-n", "-j", ",".join(ids), "-o", "JobIDRaw,State,ExitCode,Reason,NodeList,JobID"]
        )
        states = parse_sacct(sacct.stdout) if sacct.returncode == 0 else {}
        # SLURM 24.11's accounting keeps no reason for a pending job (a held one reads "None"; 22.05's says
        # JobHeldUser): slurmctld knows why it waits.
        unexplained = [j for j, s in states.items() if s.state == "PENDING" and s.reason in NO_REASON]
        missing = [j for j in ids if j not in states or j in unexplained]
        if not missing:
            return states
        # Accounting is off, down, or has not heard of a new job yet (slurmdbd lags slurmctld): ask slurmctld.
        # -r: an array's pending elements one per line (else collapsed into one <id>_[a-b] line)
        squeue = self._run(["squeue", "-h", "-r", "-t", "all", "-j", ",".join(missing), "-o", "%i|%T|%r|%N"])
        if squeue.returncode == 0:
            states |= parse_squeue(squeue.stdout)
            return states | self._unsplit([j for j in missing if j not in states])
        if sacct.returncode == 0:
            return states
        if "Invalid job id" in squeue.stderr:
            return {}  # finished longer ago than MinJobAge and no accounting: nothing knows it any more
        raise QueryError(f"sacct: {sacct.stderr.strip()} / squeue: {squeue.stderr.strip()}")

    def _unsplit(self, keys: Sequence[str]) -> dict[str, JobState]:
        """Array elements that have no record of their own: tasks that never started, of an array that ended as a
        whole (cancelled while pending: scancel, Ctrl-C, a failed dependency). SLURM keeps one record for them,
        <id>_[<tasks>]; each element it names takes its state. One sacct (squeue without accounting)."""
        arrays = sorted({k.split("_")[0] for k in keys if "_" in k}, key=int)
        if not arrays:
            return {}
        sacct = self._run(
            ["sacct", "-X", "-P", "-n", "-j", ",".join(arrays), "-o", "JobIDRaw,State,ExitCode,Reason,NodeList,JobID"]
        )
        rows = [(p[5], p[1], p[2], p[3]) for line in sacct.stdout.splitlines() if len(p := line.split("|")) >= 6]
        if sacct.returncode != 0 or not rows:
            # squeue names an ended array's record by its bare id (the task range is gone): it stands for every task
            # that has no record of its own
            squeue = self._run(["squeue", "-h", "-t", "all", "-j", ",".join(arrays), "-o", "%i|%T|%r"])
            rows = [(p[0], p[1], "", p[2]) for line in squeue.stdout.splitlines() if len(p := line.split("|")) >= 3]
        found: dict[str, JobState] = {}
        for jobid, state, exit_code, reason in rows:
            array, _, spec = jobid.partition("_")
            if spec and not spec.startswith("["):
                continue  # an element of its own
            tasks = set(array_tasks(spec)) if spec else None
            for key in keys:
                element_of, _, task = key.partition("_")
                if element_of == array and (tasks is None or int(task) in tasks):
                    found[key] = JobState(key, state.split()[0] if state else "UNKNOWN", exit_code, reason, "")
        return found

    def accounting(
        self, jobids: Iterable[str], fields: Sequence[str], steps: bool = False, patient: bool = False
    ) -> list[dict[str, str]]:
        """sacct's records of these jobs in one call: one {field: text} per line, in sacct's order. Every run of a
        requeued job is a line of its own (--duplicates: the earlier runs say REQUEUED); `steps` adds the job steps
        after their run's line. One attempt unless `patient` (then transient failures are retried, as for sbatch);
        QueryError when accounting does not answer (off, or slurmdbd down)."""
        ids = sorted(set(jobids), key=job_order)
        if not ids:
            return []
        cmd = ["sacct", "--duplicates", "-P", "-n", *([] if steps else ["-X"]), "-j", ",".join(ids)]
        cmd += ["-o", ",".join(fields)]
        try:
            proc = self._patiently("sacct", lambda: self._run(cmd)) if patient else self._run(cmd)
        except SlurmUnavailable as err:
            raise QueryError(str(err)) from err
        if proc.returncode != 0:
            raise QueryError(f"sacct: {(proc.stderr or proc.stdout).strip()}")
        return [dict(zip(fields, line.split("|"), strict=False)) for line in proc.stdout.splitlines() if line.strip()]

    def queue(self, jobids: Iterable[str], fields: Sequence[str]) -> list[dict[str, str]]:
        """squeue's view of these jobs in one call (-t all: finished ones too, until MinJobAge): one {field: text}
        per job, `fields` being squeue --Format names. slurmctld's word is current, where sacct's lags behind it
        by as long as slurmdbd takes. One attempt; QueryError when slurmctld does not answer."""
        ids = sorted(set(jobids), key=job_order)
        if not ids:
            return []
        # "Field:|": no padding, "|" after each value, so that values are split exactly (-o has no restart count)
        spec = ",".join(f"{name}:|" for name in fields)
        proc = self._run(["squeue", "-h", "-r", "-t", "all", "-j", ",".join(ids), "-O", spec])
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr:
                return []  # none of them is known any more
            raise QueryError(f"squeue: {proc.stderr.strip()}")
        return [dict(zip(fields, line.split("|"), strict=False)) for line in proc.stdout.splitlines() if line.strip()]

    def live(self, jobids: Iterable[str]) -> dict[str, JobState]:
        """slurmctld's current view of these jobs, with their restart counts (one squeue; sacct lags behind it).
        Jobs it no longer knows (older than MinJobAge) are left out; QueryError when it does not answer."""
        fields = ("JobID", "State", "Reason", "NodeList", "RestartCnt", "ArrayJobID", "ArrayTaskID")
        states = {}
        for row in self.queue(jobids, fields):
            jobid, restarts = queue_key(row), row.get("RestartCnt", "").strip()
            if is_job_key(jobid):
                states[jobid] = JobState(
                    jobid,
                    row.get("State", "").strip(),
                    "",
                    row.get("Reason", "").strip(),
                    row.get("NodeList", "").strip(),
                    int(restarts) if restarts.isdigit() else None,
                )
        return states

    def preemption(self, jobid: str) -> Preemption | None:
        """Whether slurmctld is preempting this running job (one squeue): its PreemptTime is set while it runs out
        its grace time (measured on 22.05 and 24.11: a preempted job's steps get SIGTERM, its batch shell nothing,
        until the grace time ends). None for a job that is not (a scancel's or the time limit's SIGTERM); QueryError
        when slurmctld does not answer."""
        rows = self.queue([jobid], ("JobID", "State", "PreemptTime", "EndTime"))
        row = next((r for r in rows if r.get("JobID", "").strip() == jobid), rows[0] if len(rows) == 1 else None)
        # SIGNALING: 24.11 shows a running job so while slurmctld delivers a signal (seen once in eight preemptions,
        # asked 20 ms after the SIGTERM); COMPLETING: the grace time is over
        if row is None or row.get("State", "").strip() not in ("RUNNING", "SIGNALING"):
            return None
        notice = epoch(row.get("PreemptTime", ""))
        return None if notice is None else Preemption(notice, epoch(row.get("EndTime", "")))

    def started_on(self, nodes: Sequence[str], since: float) -> list[Started]:
        """The jobs (anyone's) that started on any of these nodes at or after `since`, oldest start first: slurmctld's
        (squeue -w, jobs ended up to MinJobAge ago), and accounting's for those it forgot (sacct -N; none without
        accounting). Two queries at most, for any number of preempted runs. QueryError when neither answers."""
        found: dict[str, Started] = {}
        names = ",".join(sorted(set(nodes)))
        fields = ("JobID", "StartTime", "SubmitTime", "NodeList", "ArrayJobID", "ArrayTaskID")
        spec = ",".join(f"{name}:|" for name in fields)
        squeue = self._run(["squeue", "-h", "-a", "-t", "all", "-w", names, "-O", spec])
        for line in squeue.stdout.splitlines() if squeue.returncode == 0 else []:
            row = dict(zip(fields, line.split("|"), strict=False))
            start = epoch(row.get("StartTime", ""))
            if start is not None and start >= since:
                key = queue_key(row)
                found[key] = Started(key, start, epoch(row.get("SubmitTime", "")), row.get("NodeList", "").strip())
        window = datetime.fromtimestamp(since).strftime("%Y-%m-%dT%H:%M:%S")
        fields_sacct = "JobID,Start,Submit,NodeList"
        sacct = self._run(["sacct", "-X", "-a", "-n", "-P", "-N", names, "-S", window, "-E", "now", "-o", fields_sacct])
        for line in sacct.stdout.splitlines() if sacct.returncode == 0 else []:
            parts = line.split("|")
            start = epoch(parts[1]) if len(parts) >= 4 else None
            if start is not None and start >= since and is_job_key(parts[0]) and parts[0] not in found:
                found[parts[0]] = Started(parts[0], start, epoch(parts[2]), parts[3].strip())
        if squeue.returncode != 0 and sacct.returncode != 0:
            raise QueryError(f"squeue: {squeue.stderr.strip()} / sacct: {sacct.stderr.strip()}")
        return sorted(found.values(), key=lambda s: (s.start, job_order(s.jobid)))

    def named(self, jobids: Iterable[str]) -> dict[str, tuple[str, str]]:
        """slurmctld's (job name, state) of each job it knows (one squeue): whether a job id still belongs to the
        submission that got it, and its current state (sacct's lags). QueryError when slurmctld does not answer."""
        return {
            queue_key(row): (row.get("Name", "").strip(), row.get("State", "").strip())
            for row in self.queue(jobids, ("JobID", "Name", "State", "ArrayJobID", "ArrayTaskID"))
            if is_job_key(queue_key(row))
        }

    def step_names(self, jobids: Iterable[str]) -> dict[str, set[str]]:
        """The names of each job's running steps (one squeue -s): "batch", a launcher's "torchrun", ... A job without
        a step is left out. One attempt; QueryError when slurmctld does not answer."""
        ids = sorted(set(jobids), key=job_order)
        if not ids:
            return {}
        proc = self._run(["squeue", "-h", "-s", "-j", ",".join(ids), "-O", "StepId:|,StepName:|"])
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr:
                return {}
            raise QueryError(f"squeue: {proc.stderr.strip()}")
        found: dict[str, set[str]] = {}
        for line in proc.stdout.splitlines():
            step, _, rest = line.partition("|")
            job = step.strip().rsplit(".", 1)[0]
            if is_job_key(job):
                found.setdefault(job, set()).add(rest.split("|", 1)[0].strip())
        return found

    def signal_steps(self, jobids: Iterable[str], signal: str) -> None:
        """Send `signal` to every step of these jobs but their batch shells (scancel --signal; SLURM's rule without
        --full), waiting out a controller outage as `cancel` does."""
        ids = list(jobids)
        if ids:
            proc = self._patiently("scancel", lambda: self._run(["scancel", f"--signal={signal}", *ids]))
            if proc is not None and proc.returncode != 0 and "Invalid job id" not in proc.stderr:
                raise QueryError(f"scancel --signal={signal}: {proc.stderr.strip()}")

    def find_by_names(self, names: Iterable[str]) -> list[str]:
        """Ids of the jobs with these (unique) names: a submission whose sbatch reply never came."""
        proc = self._patiently(
            "squeue", lambda: self._run(["squeue", "-h", "-t", "all", "-n", ",".join(names), "-o", "%i"])
        )
        return [x for x in proc.stdout.split() if is_job_key(x)] if proc is not None and proc.returncode == 0 else []

    def cancel(self, jobids: Iterable[str]) -> None:
        """Cancel, waiting out a controller outage (bounded by the retry policy)."""
        ids = list(jobids)
        if ids:
            proc = self._patiently("scancel", lambda: self._run(["scancel", *ids]))
            if proc is not None and proc.returncode != 0 and "Invalid job id" not in proc.stderr:
                raise QueryError(f"scancel: {proc.stderr.strip()}")


def queue_key(row: dict[str, str]) -> str:
    """squeue -O's job: its id, or <array job id>_<task id> for an array element (whose JobID is the array's while
    it is pending)."""
    task = row.get("ArrayTaskID", "").strip()
    if task.isdigit():
        return f"{row.get('ArrayJobID', '').strip()}_{task}"
    return row.get("JobID", "").strip()


def parse_sacct(text: str) -> dict[str, JobState]:
    """JobIDRaw|State|ExitCode|Reason|NodeList[|JobID]: an array element is known by JobID (<array>_<task>)."""
    states: dict[str, JobState] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 5 or not parts[0].isdigit():
            continue
        jobid, state, exit_code, reason, nodes = parts[:5]
        if len(parts) > 5 and "_" in parts[5] and is_job_key(parts[5]):
            jobid = parts[5]
        # "CANCELLED by 0" -> CANCELLED; with requeues sacct may list a job more than once: the last row wins.
        states[jobid] = JobState(jobid, state.split()[0] if state else "UNKNOWN", exit_code, reason, nodes)
    return states


def parse_squeue(text: str) -> dict[str, JobState]:
    states: dict[str, JobState] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 4 or not is_job_key(parts[0]):
            continue
        states[parts[0]] = JobState(parts[0], parts[1], "", parts[2], parts[3])
    return states
