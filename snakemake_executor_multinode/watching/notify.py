"""Notices: `--multinode-notify COMMAND` is run on the submitting side for each event of a run's jobs.

Events: a job `started` (a run of it: SLURM runs its script, whose first act is its start line in the runs file),
`stalled` (the progress watchdog's verdict), `requeued`, `node_replaced` (a spare took a dropped node's place, or a
node failed its check), `failed`, `finished`, and the run's own end, `run_finished`. The command gets one JSON object
on stdin (`Notice.record`); nothing of it goes on a command line, where `ps` shows it to every user of the host: a
webhook's URL or a token is the command's to read from the environment it inherits.

Notices never slow or fail the run: one background thread runs the command for each notice in turn (in the order the
run saw the events), without a shell, in a process group of its own that is killed after --multinode-notify-timeout
seconds. A command that fails or hangs is named in one warning per run; the run goes on. Nothing is kept between
runs: each run tells of what it sees (a rerun that reattaches to a running job tells of its start again).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from snakemake_executor_multinode.contract.jobfiles import STALL_MARKER, JobFiles, marker
from snakemake_executor_multinode.contract.jsonl import json_lines
from snakemake_executor_multinode.planning.settings import SettingsError
from snakemake_executor_multinode.watching.job_status import Outcome
from snakemake_executor_multinode.watching.registry import Submission

EVENTS = ("started", "stalled", "requeued", "node_replaced", "failed", "finished", "run_finished")
CHECK_SECONDS = 2.0  # a running job's files (runs, replacements, stall marker) are read at most this often
STDERR_SHOWN = 300  # characters of a failing command's stderr that its warning quotes
NEXT_RUN = re.compile(r"restart (\d+)$")  # the job_status's requeue notes end with the restart to come


@dataclass(frozen=True)
class Notice:
    """One event, as the notify command reads it (one JSON object on stdin)."""

    event: str  # one of EVENTS
    run: str  # the Snakemake run's id (`multinode status --run`)
    job: str | None = None  # SLURM job id; None for run_finished
    rule: str | None = None
    nodes: str = ""  # SLURM's node list ("node[1-2]"); for node_replaced the node dropped
    reason: str = ""  # why, in words: SLURM's state, the exit, the watchdog's verdict, the spare taken
    log: str | None = None  # the job's log (of the run the event belongs to)
    time: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    def record(self) -> str:
        return json.dumps(asdict(self), sort_keys=True) + "\n"


def command(setting: str) -> list[str]:
    """The notify command's words (shell words, run without a shell), its first resolved on PATH; SettingsError
    naming the setting when it is not there, so that a run stops before anything is submitted."""
    try:
        words = shlex.split(setting)
    except ValueError as err:
        raise SettingsError(f"--multinode-notify={setting!r}: not a command line ({err})") from None
    if not words:
        raise SettingsError(f"--multinode-notify={setting!r}: names no command")
    found = shutil.which(words[0])
    if found is None:
        raise SettingsError(
            f"--multinode-notify={setting!r}: no command {words[0]!r} (not an executable file, nor found on PATH)"
        )
    return [found, *words[1:]]


class Notifier:
    """Runs the command once per notice, in a background thread, in order; `send` returns at once."""

    def __init__(self, argv: list[str], timeout: float, warning: Callable[[str], None]) -> None:
        self.argv = argv
        self.timeout = timeout
        self.warning = warning
        self._queue: queue.Queue[Notice | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._warned = False

    def send(self, notice: Notice) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="multinode-notify", daemon=True)
            self._thread.start()
        self._queue.put(notice)

    def close(self) -> None:
        """Deliver what is queued, waiting at most one command's timeout (and a second) longer: the run's end is not
        held up by a hanging command. What is left undelivered is said."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(self.timeout + 1)
        if self._thread.is_alive():
            left = self._queue.qsize() - 1  # the stop sentinel is no notice
            self._warn(f"the run ended with {max(left, 0) + 1} notice(s) not delivered")

    def _work(self) -> None:
        while (notice := self._queue.get()) is not None:
            if problem := self.run(notice):
                self._warn(problem)

    def run(self, notice: Notice) -> str:
        """Run the command for one notice; what went wrong ("" when nothing did). Never raises."""
        try:
            proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: a timeout kills whatever it started too
            )  # fmt: skip
        except OSError as err:
            return f"could not be started ({err.strerror})"
        try:
            _, err_bytes = proc.communicate(notice.record().encode(), timeout=self.timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            return f"did not end within {self.timeout:g} s (--multinode-notify-timeout) and was killed"
        except OSError as err:  # it closed its stdin without reading it all
            proc.kill()
            proc.wait()
            return f"could not be given the notice ({err.strerror})"
        if proc.returncode != 0:
            said = err_bytes.decode(errors="replace").strip()[-STDERR_SHOWN:]
            return f"exited with {proc.returncode}" + (f": {said}" if said else "")
        return ""

    def _warn(self, problem: str) -> None:
        if not self._warned:
            self._warned = True
            self.warning(
                f"--multinode-notify {shlex.join(self.argv)}: {problem}; the run goes on, and later failures of the "
                "command are not reported again"
            )


@dataclass
class _Seen:
    """What a job's notices have told so far this run."""

    starts: set[int] = field(default_factory=set)  # restart counts whose start was told
    replaced: int = 0  # lines of the replacements file told
    stall: str = ""  # the watchdog's verdict last told
    nodes: str = ""  # the nodes of its newest run


class Notices:
    """What this run tells the notify command: each event of each job once, in the order it saw them."""

    def __init__(
        self,
        notifier: Notifier | None,
        run_id: str,
        state_dir: Path,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.notifier = notifier
        self.run_id = run_id
        self.state_dir = state_dir
        self.clock = clock
        self._seen: dict[str, _Seen] = {}
        self._last_check = -CHECK_SECONDS
        self.ended = {"finished": 0, "failed": 0}

    def cycle(self, outcomes: list[tuple[Submission, Outcome]]) -> None:
        """A status cycle's news of running jobs: a requeue at once, what their files say every CHECK_SECONDS."""
        if self.notifier is None:
            return
        due = self.clock() - self._last_check >= CHECK_SECONDS
        if due:
            self._last_check = self.clock()
        for sub, outcome in outcomes:
            if outcome.finished:
                continue
            if not outcome.note:
                if due:
                    self._files(sub)
                continue
            # the job_status says each requeue once: told after what came before it, before the run it makes starts
            found = NEXT_RUN.search(outcome.note)
            self._files(sub, before=int(found.group(1)) if found else None)
            self._tell(sub, "requeued", outcome.note, self._seen_for(sub).nodes)

    def end(self, sub: Submission, outcome: Outcome) -> None:
        """A job's end: what its files say and were not told yet, the watchdog's verdict, then failed or finished."""
        if self.notifier is None:
            return
        self._files(sub)
        seen = self._seen_for(sub)
        if outcome.stalled and outcome.stalled != seen.stall:
            self._tell(sub, "stalled", outcome.stalled, seen.nodes)
        event = "finished" if outcome.success else "failed"
        self.ended[event] += 1
        nodes = seen.nodes or (outcome.state.nodes if outcome.state is not None else "")
        self._tell(sub, event, outcome.describe(), nodes)
        self._seen.pop(str(sub.jobid), None)

    def run_end(self, why: str = "") -> None:
        """The run's end: told last, and delivered before the run exits (at most one command timeout later)."""
        if self.notifier is None:
            return
        reason = f"{self.ended['finished']} job(s) finished, {self.ended['failed']} failed"
        reason += f"; {why}" if why else ""
        self.notifier.send(Notice("run_finished", self.run_id, reason=reason))
        self.notifier.close()

    def _seen_for(self, sub: Submission) -> _Seen:
        return self._seen.setdefault(str(sub.jobid), _Seen())

    def _tell(self, sub: Submission, event: str, reason: str, nodes: str, log: str | None = None) -> None:
        assert self.notifier is not None
        from snakemake_executor_multinode.watching.status_view import current_log  # only with a notify command

        notice = Notice(event, self.run_id, sub.jobid, sub.rule, nodes, reason, log or current_log(sub) or None)
        self.notifier.send(notice)

    def _files(self, sub: Submission, before: int | None = None) -> None:
        """Starts (the runs file; with `before`, only of earlier runs), dropped nodes (the replacements file) and a
        stall verdict not told yet."""
        if not sub.log:
            return
        # Here, not at the top: only a run with a notify command reads these (a plain run's start stays light)
        from snakemake_executor_multinode.watching.status_view import replaced

        seen, files = self._seen_for(sub), JobFiles.from_log(sub.log)
        for line in json_lines(files.runs):
            if not isinstance(line, dict) or line.get("event") != "start":
                continue
            restart = line.get("restart")
            if not isinstance(restart, int) or restart in seen.starts or (before is not None and restart >= before):
                continue
            seen.starts.add(restart)
            seen.nodes = str(line.get("nodes", ""))
            log = files.restart(restart).log if restart else files.log
            self._tell(sub, "started", f"restart {restart}" if restart else "first run", seen.nodes, str(log))
        dropped = replaced(sub.log)
        for event in dropped[seen.replaced :]:
            how = f"replaced by {event.spare}" if event.spare else "dropped, no spare in its place"
            self._tell(sub, "node_replaced", f"{event.node} {how} ({event.why})", event.node)
        seen.replaced = len(dropped)
        if seen.starts and sub.jobid is not None:  # a started run removed any stale marker of an earlier job
            stall = _read(marker(self.state_dir, sub.jobid, STALL_MARKER))
            if stall and stall != seen.stall:
                seen.stall = stall
                self._tell(sub, "stalled", stall, seen.nodes)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
