"""Thin wrappers over sbatch / sacct / squeue / scancel; their output parsed into JobState values."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

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


class SubmitError(RuntimeError):
    """sbatch refused the job; the message is sbatch's own."""


class QueryError(RuntimeError):
    """Neither sacct nor squeue answered: a reason to ask again later, never a job failure."""


@dataclass(frozen=True)
class JobState:
    jobid: str
    state: str
    exit_code: str = ""
    reason: str = ""
    nodes: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def succeeded(self) -> bool:
        return self.state in SUCCESS_STATES


class SlurmClient:
    def __init__(
        self, env: Mapping[str, str] | None = None, runner: Runner = subprocess.run, timeout: float = 30
    ) -> None:
        self.env = dict(env) if env is not None else None
        self.runner = runner
        self.timeout = timeout

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
        except subprocess.TimeoutExpired as err:
            raise QueryError(f"{cmd[0]} timed out after {self.timeout:.0f} s") from err

    def submit(self, script: Path, cwd: Path, extra: Sequence[str] = ()) -> str:
        try:
            proc = self._run(["sbatch", "--parsable", *extra, str(script)], cwd=cwd)
        except QueryError as err:
            raise SubmitError(str(err)) from err
        if proc.returncode != 0:
            message = (proc.stderr or proc.stdout).strip().replace("sbatch: error: ", "")
            if "configuration source" in message:
                message += (
                    "\n(no SLURM configuration: set SLURM_CONF, or for the local sandbox run "
                    '`eval "$(multinode cluster env)"`)'
                )
            raise SubmitError(message or f"sbatch exited {proc.returncode}")
        jobid = proc.stdout.strip().split(";")[0]
        if not jobid.isdigit():
            raise SubmitError(f"sbatch printed no job id: {proc.stdout!r}")
        return jobid

    def query(self, jobids: Iterable[str]) -> dict[str, JobState]:
        """State of each job (one sacct call; squeue -t all when accounting is off or slurmdbd is down).

        Jobs neither knows are left out."""
        ids = sorted(set(jobids), key=int)
        if not ids:
            return {}
        sacct = self._run(
            ["sacct", "-X", "-P", "-n", "-j", ",".join(ids), "-o", "JobIDRaw,State,ExitCode,Reason,NodeList"]
        )
        if sacct.returncode == 0:
            return parse_sacct(sacct.stdout)
        squeue = self._run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T|%r|%N"])
        if squeue.returncode == 0:
            return parse_squeue(squeue.stdout)
        if "Invalid job id" in squeue.stderr:
            return {}  # finished longer ago than MinJobAge and no accounting: nothing knows it any more
        raise QueryError(f"sacct: {sacct.stderr.strip()} / squeue: {squeue.stderr.strip()}")

    def cancel(self, jobids: Iterable[str]) -> None:
        ids = list(jobids)
        if ids:
            self._run(["scancel", *ids])


def parse_sacct(text: str) -> dict[str, JobState]:
    states: dict[str, JobState] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 5 or not parts[0].isdigit():
            continue
        jobid, state, exit_code, reason, nodes = parts[:5]
        # "CANCELLED by 0" -> CANCELLED; with requeues sacct may list a job more than once: the last row wins.
        states[jobid] = JobState(jobid, state.split()[0] if state else "UNKNOWN", exit_code, reason, nodes)
    return states


def parse_squeue(text: str) -> dict[str, JobState]:
    states: dict[str, JobState] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        states[parts[0]] = JobState(parts[0], parts[1], "", parts[2], parts[3])
    return states
