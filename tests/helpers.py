"""The tests' one shared helper module: a clock and SLURM's fakes for the unit tests; the cluster handle, waiting for
events, Snakemake and `multinode` run in a workflow folder (or in the background), what SLURM and the registry say,
and CPU load. Snakemake runs in the background with a reader thread that collects its
output line by line, so a test waits for a line as an event (never for a duration), and `stop()` (Ctrl-C: Snakemake
cancels its jobs) leaves nothing running on the shared cluster."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from html.parser import HTMLParser
from pathlib import Path, PurePath
from typing import Any, TypeVar

import yaml

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.contract.jobfiles import JobFiles, StateFolders
from snakemake_executor_multinode.contract.releases import DEFAULT as DEFAULT_SLURM
from snakemake_executor_multinode.launching import launcher, spares, straggler
from snakemake_executor_multinode.launching.launcher import Allocation
from snakemake_executor_multinode.planning import environment, jobscript
from snakemake_executor_multinode.planning.plan import JobPlan, Planner, RuleJob, plan_job
from snakemake_executor_multinode.planning.request import JobRequest, RequestError, build_request
from snakemake_executor_multinode.sandbox.cluster import slurm_env
from snakemake_executor_multinode.sandbox.spec import ClusterSpec
from snakemake_executor_multinode.session import Session, Settings
from snakemake_executor_multinode.slurm.client import JobState, QueryError, SlurmClient
from snakemake_executor_multinode.slurm.formats import hostlist
from snakemake_executor_multinode.watching.registry import Registry, Submission

T = TypeVar("T")

# An answer of a SLURM command as (returncode, stdout, stderr)
Answer = tuple[int, str, str]


class Clock:
    """A clock that moves only when told (`now`) or slept on (`sleep`, which notes each sleep)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class FakeSlurm:
    """SLURM's commands as a runner (`SlurmClient(runner=...)`): each command, by its name, answers a fixed answer,
    the next of a list (the last repeats), or what a function of the command gives; a command not named answers
    `default` (None: it fails the test). Every command is recorded."""

    def __init__(
        self,
        default: Answer | None = (0, "", ""),
        **answers: Answer | list[Answer] | Callable[[list[str]], Answer],
    ) -> None:
        self.default, self.answers = default, answers
        self.calls: list[list[str]] = []

    def __call__(self, cmd: list[str], **_kw: object) -> subprocess.CompletedProcess:
        self.calls.append(cmd)
        answer = self.answers.get(cmd[0], self.default)
        if answer is None:
            raise AssertionError(f"unexpected command {cmd}")
        if callable(answer):
            answer = answer(cmd)
        elif isinstance(answer, list):
            answer = answer.pop(0) if len(answer) > 1 else answer[0]
        code, out, err = answer
        return subprocess.CompletedProcess(cmd, code, out, err)

    def called(self, *prefix: str) -> list[list[str]]:
        """The commands that began with these words."""
        return [c for c in self.calls if c[: len(prefix)] == list(prefix)]

    def count(self, *prefix: str) -> int:
        return len(self.called(*prefix))


def fake_session(tmp_path: Path, slurm: FakeSlurm, **settings: Any) -> tuple[Session, list[str]]:
    """A Session in `tmp_path` (run run1, no code snapshot, `settings` else the defaults) whose SLURM is `slurm`; its
    log and warnings, in order."""
    said: list[str] = []
    s = Session(Settings(snapshot="off", **settings), tmp_path, said.append, said.append, run_id="run1")
    s.client = s.job_status.client = s.submitter.client = s.watch.client = SlurmClient(runner=slurm)
    return s, said


def fake_steps(
    monkeypatch: Any,
    ends: list[launcher.StepEnd],
    gone: bool = True,
    argvs: list[list[str]] | None = None,
    idle: list[tuple[str, ...]] | None = None,
) -> list[tuple[tuple[str, ...], str, str]]:
    """The launcher's steps replaced (pytest's monkeypatch): each returns the next of `ends`; what each was started
    with is recorded (its nodes, its MULTINODE_RELAUNCH, its --master_port; its srun line in `argvs`, the spares it
    was told of in `idle`). `gone`: whether SLURM forgets a failed step in time."""
    started: list[tuple[tuple[str, ...], str, str]] = []

    def launch_step(
        argv: Sequence[str],
        env: dict[str, str],
        nodes: Sequence[str],
        spare_left: bool,
        spares: Sequence[str] = (),
        restartable: bool = False,
    ) -> launcher.StepEnd:
        started.append((tuple(nodes), env[protocol.RELAUNCH_VAR], env["MASTER_PORT"]))
        if argvs is not None:
            argvs.append(list(argv))
        if idle is not None:
            idle.append(tuple(spares))
        return ends.pop(0)

    monkeypatch.setattr(launcher, "launch_step", launch_step)
    monkeypatch.setattr(spares, "wait_step_gone", lambda job: gone)
    monkeypatch.setattr(spares, "head_address", lambda head, peers: f"addr-of-{head}")
    return started


class FakeClient:
    """A SlurmClient's answers: accounting's (`states`, from sacct), slurmctld's current view (`live_states`, with
    restart counts) and the jobs' names (`names`, for `named`). `fail` fails every query, `fail_live` slurmctld's
    only; `queries` records each accounting query."""

    def __init__(
        self,
        states: dict[str, JobState] | None = None,
        fail: bool = False,
        live: dict[str, JobState] | None = None,
        names: dict[str, str] | None = None,
    ) -> None:
        self.states = states or {}
        self.live_states = live if live is not None else {}
        self.names = names or {}
        self.fail = fail
        self.fail_live = False
        self.queries: list[list[str]] = []

    def live(self, ids: Iterable[str]) -> dict[str, JobState]:
        if self.fail or self.fail_live:
            raise QueryError("slurmctld down")
        return {i: self.live_states[i] for i in ids if i in self.live_states}

    def query(self, ids: Iterable[str]) -> dict[str, JobState]:
        self.queries.append(sorted(ids))
        if self.fail:
            raise QueryError("slurmdbd down")
        return {i: self.states[i] for i in ids if i in self.states}

    def named(self, ids: Iterable[str]) -> dict[str, tuple[str, str]]:
        return {i: (self.names[i], state.state) for i, state in self.live(ids).items() if i in self.names}


def wait_for(
    check: Callable[[], T], what: str, timeout: float = 180, proc: subprocess.Popen | None = None, interval: float = 0.2
) -> T:
    """Poll until `check()` gives something true and return it; the timeout only stops a hang (no verdict depends
    on it). With `proc`, a Snakemake that ends first fails at once, naming what it did not see."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"snakemake ended (exit {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(interval)
    return found


class Snakemake:
    """`snakemake --executor multinode` in the background; a reader thread collects its output line by line (and
    copies it to <tmp>/snakemake-<n>.out) so that the test can wait for a line as an event."""

    count = 0

    def __init__(self, workdir: Path, *args: str, jobs: int = 1, command: Sequence[str] | None = None) -> None:
        """`command` replaces `snakemake --executor multinode --jobs J --latency-wait 5` (a workflow profile's run)."""
        Snakemake.count += 1
        self.workdir = workdir
        self.copy = workdir.parent / f"snakemake-{Snakemake.count}.out"
        base = [
            sys.executable,
            "-m",
            "snakemake",
            "--executor",
            "multinode",
            "--jobs",
            str(jobs),
            "--latency-wait",
            "5",
        ]
        self.proc = subprocess.Popen(
            [*(command if command is not None else base), *args],
            cwd=workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=os.environ | {"PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[tuple[float, str]] = []  # (time.monotonic() when read, line)
        self._eof = False
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.copy.open("w") as copy:
            for line in self.proc.stdout:
                copy.write(line)
                copy.flush()
                with self._changed:
                    self.lines.append((time.monotonic(), line.rstrip("\n")))
                    self._changed.notify_all()
        with self._changed:
            self._eof = True
            self._changed.notify_all()

    @property
    def text(self) -> str:
        with self._changed:
            return "\n".join(line for _, line in self.lines)

    def matching(self, *words: str) -> list[tuple[float, str]]:
        with self._changed:
            return [(t, line) for t, line in self.lines if all(w in line for w in words)]

    def submitted(self, rule: str, timeout: float = 120) -> tuple[str, Path]:
        """The SLURM job id and the job log of the rule's first submission, from the plugin's line
        `rule R: SLURM job N ...; log L`."""
        _, line = self.wait_line(f"rule {rule}: SLURM job", timeout=timeout)
        return line.split("SLURM job ")[1].split()[0], Path(line.split("; log ")[1].strip())

    def wait_line(self, *words: str, timeout: float = 180) -> tuple[float, str]:
        """The first output line that contains every word, and when the reader got it."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for t, line in self.lines:
                    if all(w in line for w in words):
                        return t, line
                if self._eof:
                    self.proc.wait()
                    raise AssertionError(
                        f"snakemake ended (exit {self.proc.returncode}) without a line with {words}:\n{self.text}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no line with {words} within {timeout:.0f} s:\n{self.text}")
                self._changed.wait(min(left, 1.0))

    def wait(self, timeout: float = 300) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as err:
            raise AssertionError(f"snakemake still running after {timeout:.0f} s:\n{self.text}") from err
        self._reader.join(timeout=30)
        return rc

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Ctrl-C if still running (Snakemake cancels its jobs), then make sure it is gone."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=30)


@contextmanager
def background(workdir: Path, *args: str, **kw) -> Iterator[Snakemake]:
    """Snakemake in the background for the block; stopped (Ctrl-C) if the block leaves it running."""
    sm = Snakemake(workdir, *args, **kw)
    try:
        yield sm
    finally:
        sm.stop()


# --- The fast tier's guard ---------------------------------------------------------------------------------------
# No test in tests/unit starts a process or opens a socket (a DNS lookup too): those are in tests/process/, in the file
# of the same name (CONTRIBUTING.md, "Tests and checks"). tests/unit/conftest.py runs every unit test inside watch():
# Python's audit events, raised before the system call, reach process_event, which records the start and stops it
# (ProcessStarted); the conftest then fails the test, also where the code under test swallowed the exception.
# _posixsubprocess.fork_exec (multiprocessing's spawn and forkserver) raises no event of its own: it is wrapped to
# raise one. What C++ code does by itself (gloo's sockets) raises none: tests/unit/test_fast_tier.py also reads the
# unit test files for such calls.
PROCESS_EVENTS = frozenset(
    {
        "subprocess.Popen", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty",
        "_posixsubprocess.fork_exec", "socket.bind", "socket.connect", "socket.sendto", "socket.sendmsg",
        "socket.getaddrinfo", "socket.gethostbyname",
    }
)  # fmt: skip


class ProcessStarted(RuntimeError):
    """A test of the fast tier started a process or opened a socket."""


_watches: list[list[str]] = []  # what each open watch() saw, innermost last; all threads' (a test's thread is its)


def process_event(event: str, args: tuple[Any, ...]) -> None:
    """The audit hook: under a watch, a process start or socket use is recorded there and stopped."""
    if not _watches or event not in PROCESS_EVENTS:
        return
    what = f"{event} {_shown(args)}"
    _watches[-1].append(what)
    raise ProcessStarted(
        f"{what}: a test in tests/unit starts no process and opens no socket; "
        "it belongs in tests/process/, in the file of the same name (CONTRIBUTING.md, 'Tests and checks')"
    )


def _shown(args: tuple[Any, ...]) -> str:
    text = " ".join(repr(a) for a in args if not isinstance(a, dict))  # not an environment
    return text if len(text) <= 200 else text[:200] + "..."


@contextmanager
def watch() -> Iterator[list[str]]:
    """Process starts and socket use in the block are stopped and listed in the list it gives."""
    _install()
    seen: list[str] = []
    _watches.append(seen)
    try:
        yield seen
    finally:
        del _watches[next(i for i, w in enumerate(_watches) if w is seen)]  # by identity: [] == []


def watched() -> list[str] | None:
    """What the innermost open watch has seen so far; None outside every watch."""
    return _watches[-1] if _watches else None


@contextmanager
def unwatched() -> Iterator[None]:
    """The block may start processes (the session's CPU load, not a test's work)."""
    held = _watches[:]
    _watches.clear()
    try:
        yield
    finally:
        _watches[:] = held


def _install() -> None:
    """Once per interpreter: an audit hook cannot be removed, so it is idle (one list test) outside a watch."""
    import _posixsubprocess

    if getattr(_posixsubprocess.fork_exec, "audited", False):
        return
    sys.addaudithook(process_event)
    fork_exec = _posixsubprocess.fork_exec

    def audited(*args: Any, **kwargs: Any) -> Any:
        sys.audit("_posixsubprocess.fork_exec", args[0] if args else None)
        return fork_exec(*args, **kwargs)

    audited.audited = True  # type: ignore[attr-defined]
    _posixsubprocess.fork_exec = audited


@contextmanager
def cpu_saturated(extra: int = 1) -> Iterator[list[int]]:
    """One busy loop per core plus `extra`, for the block (a shared login node or CI runner); stopped by pid."""
    with unwatched():  # --cpu-load starts them in whichever test comes first, also a unit test
        loops = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
            for _ in range((os.cpu_count() or 1) + extra)
        ]
    try:
        yield [p.pid for p in loops]
    finally:
        for p in loops:
            p.kill()
            p.wait()


REPO = Path(__file__).resolve().parents[1]


# The SLURM release the cluster tests run on (scripts/test.sh runs them on each); each has its own cluster folder, so
# both can be up at once.
TEST_SLURM = os.environ.get("MULTINODE_TEST_SLURM", DEFAULT_SLURM)
# Five nodes: a 2-node job with a spare holds 3, and its retry must still find 3 without the 2 nodes it lost.
TEST_NODES = 5
# The Snakemake the tests run: scripts/snakemake8.sh runs the tests marked `snakemake8` on 8.30, in a session of its
# own beside the others, with a cluster folder of its own too.
SNAKEMAKE_MAJOR = int(importlib.metadata.version("snakemake").split(".")[0])
TEST_CLUSTER_DIR = Path(
    os.environ.get(
        "MULTINODE_TEST_CLUSTER_DIR",
        "/var/tmp/multinode-test-cluster"
        + ("" if TEST_SLURM == DEFAULT_SLURM else f"-{TEST_SLURM}")
        + ("-snakemake8" if SNAKEMAKE_MAJOR == 8 else ""),
    )
)
# Under pytest-xdist (scripts/test.sh runs the default tier on two workers) each worker brings up a cluster of its
# own: the first keeps the folder above, the others add their name to it.
if (XDIST_WORKER := os.environ.get("PYTEST_XDIST_WORKER", "gw0")) != "gw0":
    TEST_CLUSTER_DIR = TEST_CLUSTER_DIR.with_name(f"{TEST_CLUSTER_DIR.name}-{XDIST_WORKER}")


class Cluster:
    """A running sandbox cluster and the environment that points SLURM's commands at it."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.env = slurm_env(spec)

    def run(self, *cmd: str, timeout: float = 60, check: bool = True, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(cmd), capture_output=True, text=True, env=self.env, timeout=timeout, check=check, **kw
        )


def restart_slurmctld(cl: Cluster) -> None:
    """Stop slurmctld by the pid in its pid file and start it as `up` does (it recovers its saved state, jobs
    included): how a test makes it read a changed slurm.conf. Not `scontrol reconfigure`: since 23.11 slurmctld
    re-executes itself for it, and on 24.11.5 one such re-execution hung here for good (docs/slurm-versions.md)."""
    from snakemake_executor_multinode.sandbox import cluster, processes

    if pid := cluster.Daemon("slurmctld", cl.spec.dir / "run" / "slurmctld.pid", ("slurmctld",)).pid():
        processes.stop([pid])
    cluster._slurmctld_up(cl.spec)


END_STATES = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED",
}  # fmt: skip


def figures(test: str, **values: object) -> None:
    """A test's measured figures, printed; with $MULTINODE_FIGURES_FILE set (a benchmark that runs the test, e.g.
    benchmarks/restart.py) also appended to it as one JSON line, `test` its name."""
    print(f"\n[figures] {test}: " + ", ".join(f"{k}={v}" for k, v in values.items()), flush=True)
    if path := os.environ.get("MULTINODE_FIGURES_FILE"):
        with open(path, "a") as fh:
            fh.write(json.dumps({"test": test, **values}, default=str) + "\n")


def record(
    workdir: Path, run: str, rule: str, jobid: str | None, at: float, outputs: tuple[str, ...] = (), **kw: Any
) -> Submission:
    """A submission of `rule` in run `run` as the registry keeps it, submitted at `at` (seconds); its log under
    <workdir>/logs, not written; `kw`: other fields of the record (wildcards, ended, ...)."""
    log = JobFiles.of(workdir / "logs" / f"rule_{rule}" / "_", str(jobid), 1).log
    sub = Submission(
        run, rule, kw.pop("wildcards", {}), outputs or (f"results/{rule}.txt",), f"mn-{run}-{rule}-{jobid}", 1, "s.sh",
        str(log),
    )  # fmt: skip
    return Registry(workdir, run).record(replace(sub, jobid=jobid, submitted_at=at, **kw))


def records(wd: Path) -> list[dict]:
    """Every submission the registry holds, of every run in the folder."""
    return [json.loads(p.read_text()) for p in sorted(StateFolders(wd).runs.glob("*/*.json"))]


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def squeue_states(cl: Cluster, jobids: list[str]) -> dict[str, str]:
    out = cl.run("squeue", "-h", "-t", "all", "-j", ",".join(jobids), "-o", "%i %T", check=False).stdout
    return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)


def sacct_jobs(cl: Cluster, names: set[str], expect: set[str]) -> dict[str, list[str]]:
    """Accounting's records of every job with these (unique) names: job id -> its states (a requeued job has one
    row per run). Read once slurmdbd has recorded the end of every job in `expect` (it lags a little behind
    slurmctld); any other job of those names, a duplicate, is in the answer too."""

    def ended() -> dict[str, list[str]]:
        proc = cl.run(
            "sacct", "-X", "-n", "-P", "-S", "now-2days", "--name", ",".join(sorted(names)),
            "-o", "JobIDRaw,JobName,State", check=False,
        )  # fmt: skip
        found: dict[str, list[str]] = {}
        for row in proc.stdout.splitlines() if proc.returncode == 0 else []:
            jobid, name, state = row.split("|")
            if name in names:
                found.setdefault(jobid, []).append(state.split()[0])
        done = expect <= set(found) and all(states[-1] in END_STATES for states in found.values())
        return found if done else {}

    return wait_for(ended, f"sacct records of the ends of jobs {sorted(expect)}", 120)


def epoch(text: str) -> float:
    """sacct's local time (no zone, as this process's) as epoch seconds; parsed here, not by the plugin."""
    return datetime.fromisoformat(text).timestamp()


def sacct_runs(cl, job: str) -> list[dict[str, Any]]:
    """Every run of the job (--duplicates), oldest first: start, end, submit, elapsed seconds, nodes, state."""
    out = slurm(cl, "sacct", "-X", "-n", "-P", "--duplicates", "-j", job,
                "-o", "JobIDRaw,State,Submit,Start,End,ElapsedRaw,NNodes")  # fmt: skip
    runs = []
    for row in out.splitlines():
        jobid, state, submit, start, end, elapsed, nodes = row.split("|")
        if jobid == job:
            runs.append(
                {"state": state.split()[0], "submit": epoch(submit), "start": epoch(start), "end": epoch(end),
                 "elapsed": int(elapsed), "nodes": int(nodes)}
            )  # fmt: skip
    return sorted(runs, key=lambda r: r["start"])


def alive(pid: int, comm: str) -> bool:
    """The process exists, is not a zombie, and is the one we mean (its name, from /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    return name == comm and stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def snakemake(
    workdir: Path, *args: str, timeout: float = 300, check: bool = True, jobs: int = 4
) -> subprocess.CompletedProcess:
    """`snakemake --executor multinode` in `workdir`, to its end; with `check`, a failure fails the test."""
    cmd = [sys.executable, "-m", "snakemake", "--executor", "multinode", "--jobs", str(jobs), "--latency-wait", "5"]
    proc = subprocess.run([*cmd, *args], cwd=workdir, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


MULTINODE = [sys.executable, "-m", "snakemake_executor_multinode.cli"]


def multinode(workdir: Path, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    """`multinode ARGS` in `workdir`; with `check`, a failure fails the test."""
    proc = subprocess.run([*MULTINODE, *args], cwd=workdir, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"multinode {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc


TEST_WORKFLOWS = REPO / "tests" / "workflows"


def torchrun_rule(script: str, resources: str) -> str:
    """A Snakefile of one rule, train, that runs the training script `script` under `multinode torchrun` with these
    resources; the script writes out.txt, its first argument."""
    shell = f"multinode torchrun {script} {{output}}"
    return f'rule train:\n    output: "out.txt"\n    resources: {resources}\n    shell: "{shell}"\n'


def torchrun_workflow(tmp_path: Path, script: str, text: str, resources: str) -> Path:
    """A workflow folder, tmp_path/wf, of the training script `script` (its `text`) and the Snakefile that runs it
    (torchrun_rule)."""
    wd = tmp_path / "wf"
    wd.mkdir()
    (wd / script).write_text(text)
    (wd / "Snakefile").write_text(torchrun_rule(script, resources))
    return wd


def example_pipeline(profile: str) -> list[str]:
    """The command that runs workflows/ (the example pipeline) under one of its workflow profiles, from the folder
    that holds workflows/."""
    profile_flags = ["--workflow-profile", f"workflows/profiles/{profile}"]
    return [sys.executable, "-m", "snakemake", "-s", "workflows/Snakefile", *profile_flags]


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def committed_repo(repo: Path, files: dict[str, str]) -> Path:
    """A workflow repository at `repo` holding `files` (path -> text), committed."""
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "v1")
    return repo


def copied_workflow(name: str, tmp_path: Path) -> Path:
    """tests/workflows/<name> copied to <tmp>/<name>, where the test runs it."""
    wd = tmp_path / name
    shutil.copytree(TEST_WORKFLOWS / name, wd)
    return wd


def timelimit_ranks_waiting(wd: Path) -> bool:
    """Both workers of tests/workflows/timelimit have installed their USR2 handler and wait for the signal."""
    return all((wd / "results" / "ckpt" / f"ready{rank}").exists() for rank in (0, 1))


def job_logs(workdir: Path, rule: str) -> list[Path]:
    return sorted((StateFolders(workdir).logs / f"rule_{rule}").rglob("*.log"))


def run_log_names(job: str, restarts: int) -> list[str]:
    """The names of a job's logs (its first attempt's) when it ran 1 + `restarts` times: one log per run."""
    files = JobFiles.of(Path(), job, 1)
    return [files.restart(k).log.name for k in range(restarts + 1)]


ANY_FIRST_SCRIPT = JobFiles.of(Path(), "*", 1).script.name  # a glob: the script of any job's first attempt
ANY_FIRST_LOG = JobFiles.of(Path(), "*", 1).log.name  # a glob: the first run's log of any job's first attempt


def jobs_from(cl, workdir: Path) -> set[str]:
    """Ids of the jobs SLURM knows (MinJobAge: finished ones too) that were submitted from `workdir`: other
    engineers' jobs on the shared test cluster do not count."""
    out = slurm(cl, "squeue", "-h", "-t", "all", "-o", "%i %Z")
    return {line.split()[0] for line in out.splitlines() if line.split()[1:] == [str(workdir.resolve())]}


def slurm(cl, *cmd: str) -> str:
    """Run a SLURM command, asking again while it fails: the shared test cluster's slurmctld may be restarting
    (other tests inject faults). A command that keeps failing fails the test with its error."""
    last: list[subprocess.CompletedProcess] = []

    def ok() -> bool:
        last[:] = [cl.run(*cmd, check=False)]
        return last[0].returncode == 0

    try:
        wait_for(ok, f"successful {' '.join(cmd)}", 120)
    except AssertionError as err:
        raise AssertionError(f"{err}: {last[0].stderr.strip()}") from None
    return last[0].stdout


def log_times(log: Path) -> tuple[datetime, datetime]:
    """When the job script started and when it ended, as it printed them (`date -Is`)."""
    text = log.read_text()
    start = re.search(r"^\[multinode\] job \d+, rule .*, restart \d+, (\S+)$", text, re.M)
    end = re.search(r"^\[multinode\] exit \d+, (\S+)$", text, re.M)
    assert start and end, text
    return datetime.fromisoformat(start[1]), datetime.fromisoformat(end[1])


# --- Shared by a test file of tests/unit and its namesake in tests/process (the tests of it that start processes) ---
# launching/test_launcher.py, launching/test_network_check.py
ALLOC = Allocation(
    "4242", ("node110", "node111"), gpus_per_node=8, cpus_per_task=64, master_addr="10.0.0.110", master_port=24242
)
# launching/test_launcher.py
SRUN_FAILURE = (
    "[multinode torchrun] launching on node1, node_rank=0\n"
    "srun: error: node2: task 1: Exited with exit code 3\n"
    "srun: launch/slurm: _step_signal: Terminating StepId=12.0\n"
    "slurmstepd-node1: error: *** STEP 12.0 ON node1 CANCELLED AT 2026-12-03T10:03:33 ***\n"
    "srun: error: node1: task 0: Exited with exit code 143\n"
)


# launching/test_network_check.py
def agent_line(monkeypatch: Any, value: str | None) -> str:
    if value is None:
        monkeypatch.delenv(protocol.NETWORK_CHECK_VAR, raising=False)
    else:
        monkeypatch.setenv(protocol.NETWORK_CHECK_VAR, value)
    argv = launcher.srun_command(ALLOC, [], ["train.py"], python="/py")
    return argv[argv.index("-c") + 1]


# launching/test_network_check.py, launching/test_node_check.py
def profile_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "profiles.yaml"
    path.write_text(f"profiles:\n  p:\n{body}")
    return path


# launching/test_node_check.py
def exports(tmp_path: Path, value: str) -> list[str]:
    profiles = environment.load_profiles(profile_file(tmp_path, f"    node_check: {value}\n"))
    lines = environment.render_lines(environment.resolve(profiles, "p"))
    return [line for line in lines if "MULTINODE_NODE_CHECK" in line]


# launching/test_spares.py
BARRIER = "barrier (torch/distributed/distributed_c10d.py:5356)"


def write_stacks(stem: str, tops: dict[int, tuple[str, str]]) -> None:
    """Each rank's stack as the labellers write it: rank -> (node, innermost frame)."""
    for rank, (node, top) in tops.items():
        with open(JobFiles(Path(stem)).node_out(node), "a") as fh:
            fh.write(f'[{node} rank{rank}] stack| Thread 1 (idle): "MainThread"\n')
            fh.write(f"[{node} rank{rank}] stack|     {top}\n")


def finder(
    down: Sequence[str], rounds: list[list[str]] | None = None, flaky: Sequence[str] = ()
) -> Callable[[Sequence[str], int], list[str]]:
    """A stand-in for liveness.unreachable: `down` never answer, `flaky` miss the first round only; each round's
    question is recorded in `rounds`."""
    asked: list[list[str]] = [] if rounds is None else rounds

    def find(nodes: Sequence[str], port: int) -> list[str]:
        asked.append(list(nodes))
        missing = set(down) | (set(flaky) if len(asked) == 1 else set())
        return [n for n in nodes if n in missing]

    return find


# launching/test_straggler.py
NODES = ["node1", "node2", "node3"]


def event(busy: dict[str, float], step: int = 10, wall: float | None = None) -> str:
    return json.dumps({"event": "ranks", "step": step, "wall": time.time() if wall is None else wall, "busy_s": busy})


class Job:
    """A job's files in tmp_path, a straggler check on them with a fake clock, and what it logged."""

    def __init__(self, tmp_path: Path, on: str = "warn", spare: bool = False, nodes: list[str] = NODES) -> None:
        self.stem = str(JobFiles.of(tmp_path, "9", 1).prefix)
        self.metrics = tmp_path / "9.metrics.jsonl"
        self.metrics.write_text('{"step": 1, "loss": 3.0}\n')  # an earlier launch's line: not read again
        self.env = {
            protocol.LOG_STEM_VAR: self.stem,
            protocol.METRICS_FILE_VAR: str(self.metrics),
            protocol.ON_STRAGGLER_VAR: on,
            protocol.STRAGGLER_FACTOR_VAR: "1.5",
            protocol.STRAGGLER_WINDOW_VAR: "10",
        }
        self.clock, self.said = Clock(), []
        self.check = straggler.StragglerCheck(self.env, nodes, self.said.append, replaceable=spare, clock=self.clock)

    def at(self, t: float, busy: dict[str, float]) -> bool:
        """An event read at time t (1 s at least after the last: the check reads once a second); whether the
        launcher is to end the step."""
        self.clock.sleep(t - self.clock())
        with self.metrics.open("a") as fh:
            fh.write(event(busy) + "\n")
        return self.check.due()

    def records(self) -> list[dict]:
        path = JobFiles(Path(self.stem)).first_run.replacements
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# planning/test_jobscript.py: the seed recipe's cluster: 2 nodes x 8 A6000, 64 CPUs, 14 days, InfiniBand, conda in
# the job.
BLOG_PROFILES = """\
default: a6000
profiles:
  a6000:
    extends: infiniband
    nccl: {hca: mlx5_0, gid_index: 0, tc: 106, gdr_level: 2, launch_mode: GROUP, min_nrings: 4}  # the site's
    cuda: /path/to/cuda-11.8
    conda: {base: /path/to/anaconda3, env: my_env}
"""

BLOG_RESOURCES = dict(
    nodes=2,
    gpus=8,
    cpus_per_task=64,
    mem_mb=400000,
    runtime=20160,
    slurm_partition="gpu_A6000",
    slurm_account="your_account",
    nodelist="node110,node111",
)


def blog_script(tmp_path: Path) -> str:
    f = tmp_path / "env.yaml"
    f.write_text(BLOG_PROFILES)
    profiles = environment.load_profiles(f)
    req = build_request("train", BLOG_RESOURCES, threads=1, env_profile=profiles.default)
    ctx = jobscript.ScriptContext(
        command="multinode torchrun train.py --data results/data/train.bin --out results/model/final.pt",
        workdir=PurePath("/work/project"),
        log_dir=jobscript.log_dir_for(PurePath(".snakemake/multinode/logs"), req),
        state_dir=PurePath("/work/project/.snakemake/multinode/state"),
        job_name="mn-0123abcd-train",
    )
    return jobscript.render(req, ctx, environment.render_lines(environment.resolve(profiles, profiles.default)))


def spare_script(tmp_path: Path, **resources: object) -> str:
    req = build_request("train", {"nodes": 2, "gpus": 1, **resources})
    ctx = jobscript.ScriptContext("true", tmp_path, PurePath("logs"), tmp_path / "state", "n")
    return jobscript.render(req, ctx, [])


# test_architecture.py
SITE_STUB = "benchmarks/gpu/site_stub"

# test_version.py
INIT = REPO / "snakemake_executor_multinode" / "__init__.py"


def the_version() -> str:
    """`__version__` as hatchling reads it: the one assignment of a string literal in __init__.py."""
    tree = ast.parse(INIT.read_text())
    found = [
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and [getattr(t, "id", None) for t in node.targets] == ["__version__"]
        and isinstance(node.value, ast.Constant)
    ]
    assert len(found) == 1, f'{INIT}: one `__version__ = "X.Y.Z"`, found {found}'
    return found[0]


def hostile_plan(tmp_path: Path, value: str) -> JobPlan:
    """A 2-node job whose wildcard and environment profile value are `value` (hostile input); its command starts
    nothing on the other node (own_launcher: the launch check lets it be)."""
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(yaml.safe_dump({"profiles": {"hostile": {"env": {"TOKEN": value}}}}))
    planner = Planner(Settings(profile_file=str(profiles)), tmp_path, "run1")
    job = RuleJob(
        "train",
        {"nodes": 2, "env_profile": "hostile", "own_launcher": True},
        'printf %s "$TOKEN" > token.txt',
        wildcards={"sample": value},
    )
    return plan_job(job, planner)


def load_script(path: Path, name: str) -> types.ModuleType:
    """A script that is no package module (benchmarks/, scripts/), imported under `name` so tests can call it; it is
    registered in sys.modules first, where dataclasses look their module up."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# --- a node's death, as the sandbox can make it (tests/cluster/test_node_death_cluster.py, test_spare_nodes_cluster.py)


def node_index(cl: Cluster, name: str) -> int:
    return next(i for i in cl.spec.node_indices if cl.spec.node_name(i) == name)


def kill_node(cl: Cluster, name: str) -> float:
    """SIGKILL the node's slurmd (its pid file, checked in /proc) and every process of its network namespace;
    returns when none is left (time.monotonic())."""
    i = node_index(cl, name)
    slurmd = int((cl.spec.dir / "run" / f"slurmd-{name}.pid").read_text().split()[0])
    assert alive(slurmd, "slurmd"), f"the pid file of {name} names no running slurmd"

    def pids() -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", cl.spec.netns(i)], capture_output=True, text=True, check=True)
        return [int(p) for p in out.stdout.split()]

    victims = [slurmd, *(p for p in pids() if p != slurmd)]
    assert len(victims) > 2, f"{name} runs no job processes: {victims}"  # slurmd, slurmstepd, workers
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    killed = time.monotonic()
    wait_for(lambda: not pids(), f"every process of {name} gone", 30, interval=0.05)
    return killed


# The test scripts' step: one all_reduce in which every rank says whether it sees the file; all stop on the same step.
# (Each rank testing the file on its own, a rank that saw it a step before the others would sit in the barrier after
# the loop while they sit in the next all_reduce: a mismatch of collectives that hangs, seen under load.) `agree`
# decides several such flags in the one all_reduce.
RELEASED = """
import pathlib
import torch
import torch.distributed as dist


def agree(*flags):
    seen = torch.tensor([1.0 if flag else 0.0 for flag in flags])
    dist.all_reduce(seen, op=dist.ReduceOp.MAX)
    return [value > 0 for value in seen.tolist()]


def released(path):
    return agree(pathlib.Path(path).exists())[0]
"""


def ckpt_loop(
    pause_s: float = 0.1, print_steps: bool = False, metrics: bool = False, crash_at: int = 0, save_every: int = 1
) -> str:
    """A tiny 2-node gloo training for the fault tests: every rank says where it starts (launch-<rank>.txt: relaunch,
    resumed step, host; a ready-<job>-<relaunch>-<rank>-<host> file), rank 0 saves the step after every `save_every`
    all_reduce (step.txt, by rename; with `print_steps` it prints it: progress the stall watchdog sees) and every rank
    resumes from it. A launch trains until release-<relaunch> exists (RELEASED); then rank 0 appends the job id to
    argv[1]. `metrics`: rank 0 writes a metrics step line per step ($MULTINODE_METRICS_FILE, with its `wall`), the
    pace the adaptive stall timeout follows. `crash_at`: rank 1 exits 3 before that step, on every launch."""
    say = '\n        print(f"step {step}", flush=True)' if print_steps else ""
    line = (
        '\n        with open(os.environ["MULTINODE_METRICS_FILE"], "a") as fh:'
        '\n            fh.write(json.dumps({"step": step, "wall": time.time()}) + "\\n")'
        if metrics
        else ""
    )
    # before the step's all_reduce: rank 0 waits in it, so no launch logs a step beyond crash_at - 1
    crash = f"\n    if rank == 1 and step + 1 == {crash_at}:\n        os._exit(3)" if crash_at else ""
    return f"""{RELEASED}
import json, os, socket, sys, time

dist.init_process_group("gloo")
rank, host, job = dist.get_rank(), socket.gethostname(), os.environ["SLURM_JOB_ID"]
relaunch = os.environ.get("MULTINODE_RELAUNCH", "unset")
saved = pathlib.Path("step.txt")
start = int(saved.read_text()) if saved.exists() else 0
print(f"rank {{rank}} on {{host}}: relaunch {{relaunch}}, resuming at step {{start}}", flush=True)
with open(f"launch-{{rank}}.txt", "a") as fh:
    fh.write(f"{{relaunch}} {{start}} {{host}}\\n")
pathlib.Path(f"ready-{{job}}-{{relaunch}}-{{rank}}-{{host}}").touch()
step = start
while not released(f"release-{{relaunch}}"):
    step += 1
    if rank == 0:
        if step % {save_every} == 0:
            pathlib.Path("step.tmp").write_text(str(step))
            os.replace("step.tmp", saved){say}{line}
    time.sleep({pause_s}){crash}
dist.barrier()
if rank == 0:
    with open(sys.argv[1], "a") as fh:
        fh.write(job + "\\n")
dist.destroy_process_group()
"""


def relaunched_on_the_spare(wd: Path, head: str, other: str, spare: str) -> int:
    """Every rank's start (launch-<rank>.txt: relaunch, step, host, as ckpt_loop writes it): the first launch from
    step 0 on the head and `other`, the relaunch (1) on the head and the spare, both ranks from one step: that step."""
    starts = [line.split() for rank in (0, 1) for line in (wd / f"launch-{rank}.txt").read_text().splitlines()]
    assert sorted((s[0], s[2]) for s in starts) == sorted([("0", head), ("0", other), ("1", head), ("1", spare)])
    assert {int(s[1]) for s in starts if s[0] == "0"} == {0}, starts
    resumed = {int(s[1]) for s in starts if s[0] == "1"}
    assert len(resumed) == 1, starts
    return resumed.pop()


def saved_step(wd: Path) -> int:
    """The step the training's rank 0 saved last (step.txt: ckpt_loop's, and the scripts that save as it does); 0
    before the first."""
    text = (wd / "step.txt").read_text().strip() if (wd / "step.txt").exists() else ""
    return int(text) if text.isdigit() else 0


def checkpoint_loop(
    every: int = 5, save_s: float = 0.0, pause_s: float = 0.1, periodic_save_s: float | None = None
) -> str:
    """A tiny 2-node gloo training that keeps the training contract (docs/training-contract.md), for the preemption
    tests: every `every` steps, and on the checkpoint signal (SIGUSR2, a flag every rank agrees on at a step
    boundary), rank 0 saves the step to ckpt.txt (written aside, `save_s` seconds long, then renamed;
    `periodic_save_s` for the periodic saves and the last one, when given) between checkpoint_begin and
    checkpoint_end metrics events; after a signal's save it writes $MULTINODE_PREEMPT_FILE and every rank exits 0. A
    run resumes from ckpt.txt (a resume event); every step line (with `wall`) goes to $MULTINODE_METRICS_FILE. It
    trains until `release` exists, then saves and rank 0 appends the job id and the step to argv[1]. Rank 0 also
    writes saving-<step> while a save is under way (a test's event), and each rank ready-<job>-<restart>-<rank> (its
    $MULTINODE_RUN_ID) once its handler is installed."""
    periodic = save_s if periodic_save_s is None else periodic_save_s
    return f"""{RELEASED}
import json, os, signal, sys, time

dist.init_process_group("gloo")
rank, job = dist.get_rank(), os.environ["SLURM_JOB_ID"]
restart = os.environ.get("SLURM_RESTART_COUNT", "0")
stop = torch.zeros(1)
signal.signal(signal.SIGUSR2, lambda *_: stop.fill_(1))


def log(**record):
    if rank == 0:
        with open(os.environ["MULTINODE_METRICS_FILE"], "a") as fh:
            print(json.dumps({{**record, "wall": time.time()}}), file=fh, flush=True)


def save(step, seconds):
    if rank == 0:
        log(event="checkpoint_begin", step=step)
        marker = pathlib.Path(f"saving-{{step}}")
        marker.touch()
        pathlib.Path("ckpt.tmp").write_text(str(step))
        time.sleep(seconds)
        os.replace("ckpt.tmp", "ckpt.txt")
        marker.unlink()
        log(event="checkpoint_end", step=step)
    dist.barrier()


saved = pathlib.Path("ckpt.txt")
step = int(saved.read_text()) if saved.exists() else 0
if saved.exists():
    log(event="resume", step=step)
print(f"rank {{rank}}: job {{job}} restart {{restart}} resumes at step {{step}}", flush=True)
pathlib.Path(f"ready-{{job}}-{{restart}}-{{rank}}").write_text(os.environ.get("MULTINODE_RUN_ID", ""))
while not released("release"):
    step += 1
    time.sleep({pause_s})
    log(step=step)
    flag = stop.clone()
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        save(step, {save_s})
        if rank == 0:
            pathlib.Path(os.environ["MULTINODE_PREEMPT_FILE"]).write_text(f"step {{step}}\\n")
        print(f"rank {{rank}}: checkpointed step {{step}} on the signal", flush=True)
        dist.destroy_process_group()
        sys.exit(0)
    if step % {every} == 0:
        save(step, {periodic})
save(step, {periodic})
if rank == 0:
    with open(sys.argv[1], "a") as fh:
        fh.write(f"{{job}} {{step}}\\n")
dist.destroy_process_group()
"""


@contextmanager
def preemption(cl: Cluster, grace_s: int, mode: str = "REQUEUE") -> Iterator[None]:
    """The default partition's GraceTime and PreemptMode for the block (scontrol update: slurmctld takes them at
    once), then the cluster's own again (`up --preemption`: its spec's)."""
    spec = cl.spec
    assert spec.preemption, "the test cluster preempts (conftest.py: `up --preemption`)"
    part = f"PartitionName={spec.partition}"
    slurm(cl, "scontrol", "update", part, f"GraceTime={grace_s}", f"PreemptMode={mode}")
    try:
        yield
    finally:
        own = spec.preempt_mode.upper()
        slurm(cl, "scontrol", "update", part, f"GraceTime={spec.grace_time}", f"PreemptMode={own}")


def preempt(cl: Cluster, job: str) -> str:
    """A job of the preempting partition that needs the job's nodes whole (a second), submitted now: SLURM preempts
    the job for it. Returns its id."""
    from snakemake_executor_multinode.sandbox.spec import PREEMPTING

    nodes = slurm(cl, "squeue", "-h", "-j", job, "-o", "%N").strip()
    assert nodes and nodes != "(null)", f"job {job} holds no nodes"
    out = slurm(cl, "sbatch", "--parsable", "-p", PREEMPTING, "-w", nodes, "-N", str(len(hostlist(nodes))),
                "--exclusive", "-t", "5", "-o", "/dev/null", "--wrap", "sleep 1")  # fmt: skip
    return out.strip().split(";")[0]


# A tiny 2-node gloo training that keeps the training contract (docs/training-contract.md) and records what it does:
# `python train.py OUT STEP_S CKPT_EVERY`. Each step "computes" for STEP_S (a sleep, timed: a stopped process overruns
# it, no CPU speed in the figure), then every rank agrees in one all_reduce (the gradient sync) whether `release`
# exists and whether any rank got SIGUSR2. Rank 0 checkpoints the step (ckpt.json, by rename) every CKPT_EVERY steps,
# on SIGUSR2 (then writes $MULTINODE_PREEMPT_FILE and every rank exits 0) and when released (then appends the job id
# to OUT). A start resumes from ckpt.json. Every rank appends one line per launch to launches.jsonl (job, restart,
# relaunch, host, pid, run id, resumed step). Rank 0 keeps the metrics in metrics.jsonl (every step a line with
# `wall` and `step_ms`, busy_s per node every 5 steps, checkpoint_begin/end and resume events; at a resume the step
# lines above the resumed step become "superseded" events) and links $MULTINODE_METRICS_FILE to it, so every job of
# the experiment shares one file. With MATRIX_TRACKERS=1 rank 0 logs each step's loss through training/tracking.py.
# Until its first step it prints a line every 5 s: the trackers' imports, after its first line (where a fixed
# stall_timeout starts to count, launching/stall.py), took longer than a short stall_timeout on a loaded machine.
CONTRACT_TRAINING = (
    """
import threading
started = threading.Event()


def starting():
    print("training: starting", flush=True)
    while not started.wait(5):
        print("training: starting", flush=True)


threading.Thread(target=starting, daemon=True).start()
"""
    + RELEASED
    + """
import json, os, signal, socket, sys, time

out, step_s, every = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
usr2 = []
signal.signal(signal.SIGUSR2, lambda *_: usr2.append(1))  # a flag: acted on at the next step boundary
dist.init_process_group("gloo")
rank, world, env = dist.get_rank(), dist.get_world_size(), os.environ
host = socket.gethostname().split(".")[0]
metrics, ckpt = pathlib.Path("metrics.jsonl"), pathlib.Path("ckpt.json")


def append(path, record):
    with open(path, "a") as fh:
        fh.write(json.dumps(record) + "\\n")


def event(name, step, **extra):
    append(metrics, {"event": name, "step": step, "wall": time.time(), **extra})


def replace(path, text):
    tmp = pathlib.Path(f"{path}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


t0 = time.time()
start = json.loads(ckpt.read_text())["step"] if ckpt.exists() else 0
restore_s = time.time() - t0
append("launches.jsonl", {
    "rank": rank, "host": host, "pid": os.getpid(), "job": env["SLURM_JOB_ID"],
    "restart": int(env.get("SLURM_RESTART_COUNT", "0")), "relaunch": int(env.get("MULTINODE_RELAUNCH", "0")),
    "run_id": env.get("MULTINODE_RUN_ID"), "start": start, "wall": time.time(),
})
trackers = None
if rank == 0:
    text = metrics.read_text() if metrics.exists() else ""
    kept = [json.loads(x) for x in text.splitlines(keepends=True) if x.endswith("\\n") and x.strip()]
    replace(metrics, "".join(
        json.dumps(m if "event" in m or m["step"] <= start else {**m, "event": "superseded"}) + "\\n" for m in kept
    ))
    if env.get("MULTINODE_METRICS_FILE"):
        link = pathlib.Path(env["MULTINODE_METRICS_FILE"] + ".tmp")
        link.unlink(missing_ok=True)
        link.symlink_to(metrics.resolve())
        os.replace(link, env["MULTINODE_METRICS_FILE"])
    if env.get("MATRIX_TRACKERS") == "1":
        print("training: opening the trackers", flush=True)
        from snakemake_executor_multinode.training.tracking import Trackers
        trackers = Trackers.open(first_step=start + 1, config={"step_s": step_s})
        print("training: trackers " + ",".join(trackers.names), flush=True)
hosts = [None] * world
dist.all_gather_object(hosts, host)
if rank == 0 and start:
    event("resume", start, restore_s=restore_s)
print(f"rank {rank} on {host}: resuming at step {start}", flush=True)


def save(step):
    if rank == 0:
        event("checkpoint_begin", step)
        replace(ckpt, json.dumps({"step": step}))
        event("checkpoint_end", step)


step, busy, n, mark = start, 0.0, 0, time.perf_counter()
started.set()  # from here on every step prints a line
while True:
    t = time.perf_counter()
    time.sleep(step_s)  # the step's compute
    busy, n = busy + time.perf_counter() - t, n + 1
    done, stop = agree(pathlib.Path("release").exists(), usr2)  # the gradient sync
    step += 1
    record = {"step": step}
    if step % 5 == 0:  # each node's busy seconds per step, for the straggler check
        figures = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(figures, torch.tensor([busy / n]))
        busy, n = 0.0, 0
        per = {}
        for h, f in zip(hosts, figures):
            per.setdefault(h, []).append(f.item())
        record["busy_s"] = {h: sum(v) / len(v) for h, v in per.items()}
    now = time.perf_counter()
    record |= {"wall": time.time(), "step_ms": round(1000 * (now - mark), 3)}
    mark = now
    if rank == 0:
        append(metrics, record)
        print(f"step {step}", flush=True)
        if trackers is not None:
            trackers.log({"loss": 1.0 / step}, step)
    if stop or done or step % every == 0:
        save(step)
        mark = time.perf_counter()
    if stop:
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # leaving: a repeated signal must not kill the exit
        if rank == 0 and env.get("MULTINODE_PREEMPT_FILE"):
            replace(env["MULTINODE_PREEMPT_FILE"], f"{step}\\n")
        print(f"rank {rank}: SIGUSR2, checkpointed step {step}", flush=True)
        break
    if done:
        if rank == 0:
            with open(out, "a") as fh:
                fh.write(env["SLURM_JOB_ID"] + "\\n")
        break
if trackers is not None:
    trackers.close()
dist.barrier()
dist.destroy_process_group()
"""
)


class Slowdown:
    """Stops a process 80% of the time (SIGSTOP 0.4 s, SIGCONT 0.1 s), by pid, until `end`; it is left running."""

    def __init__(self, pid: int) -> None:
        self.pid, self.done = pid, threading.Event()
        self.thread = threading.Thread(target=self._cycle, daemon=True)
        self.thread.start()

    def _cycle(self) -> None:
        try:
            while not self.done.is_set():
                os.kill(self.pid, signal.SIGSTOP)
                self.done.wait(0.4)
                os.kill(self.pid, signal.SIGCONT)
                self.done.wait(0.1)
        except ProcessLookupError:
            pass  # the launcher ended the step

    def end(self) -> None:
        self.done.set()
        self.thread.join(timeout=10)
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


# A node check command (a profile's node_check.command, docs/further.md "Node check") that fails on exactly one node:
# the one that runs the check as the step's second node (SLURM_NODEID 1) names itself in the marker file {mark} on the
# first check, and from then on the command fails wherever the marker names the node it runs on, printing why.
FAILING_CHECK = (
    '[ -e {mark} ] || [ "$SLURM_NODEID" != 1 ] || echo "$SLURMD_NODENAME" > {mark}; '
    'if [ "$(cat {mark} 2>/dev/null)" = "$SLURMD_NODENAME" ]; then '
    'echo "marked bad: $SLURMD_NODENAME"; exit 1; fi; echo "healthy: $SLURMD_NODENAME"'
)


def complete_lines(path: Path) -> list[dict[str, Any]]:
    """The complete JSON lines of a file a job may be appending to (a metrics file); none while it is missing."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n") and line.strip()]


def rank_pids(cl: Cluster, name: str, job: str | None = None) -> dict[int, int]:
    """The torch workers running on a node: global RANK -> pid, read from /proc/<pid>/environ of every process of
    the node's network namespace (torchrun sets RANK in its workers' environment only); with `job`, those of that
    SLURM job only (other jobs' workers may share the node)."""
    out = subprocess.run(["ip", "netns", "pids", cl.spec.netns(node_index(cl, name))], capture_output=True, text=True)
    found = {}
    for pid in map(int, out.stdout.split()):
        try:
            env = dict(
                item.split("=", 1)
                for item in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
                if "=" in item
            )
        except OSError:
            continue  # ended meanwhile
        if env.get("RANK", "").isdigit() and "TORCHELASTIC_RUN_ID" in env and job in (None, env.get("SLURM_JOB_ID")):
            rank = int(env["RANK"])
            # a worker's child inherits its RANK: the fault must reach the worker itself, so two claimants fail
            assert rank not in found, f"rank {rank}: {found[rank]} {cmdline(found[rank])!r}, {pid} {cmdline(pid)!r}"
            found[rank] = pid
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "(ended)"


def slurmd_start_time(cl: Cluster, name: str) -> str:
    """slurmctld's SlurmdStartTime of the node: it changes when a new slurmd registers."""
    out = slurm(cl, "scontrol", "show", "node", name)
    return next(f.split("=", 1)[1] for f in out.split() if f.startswith("SlurmdStartTime="))


def restart_slurmd(cl: Cluster, name: str) -> tuple[float, float]:
    """Restart the node's slurmd as an admin would (`systemctl restart slurmd`): SIGTERM by the pid in its pid file
    (checked in /proc), wait for its exit, start it again as `multinode cluster up` does (its namespaces, /etc/hosts,
    cgroup tree), and return once slurmctld has its registration (a new SlurmdStartTime, the node responding):
    (stopped, registered), time.monotonic(). The node's running steps are left alone."""
    from snakemake_executor_multinode.sandbox import cluster, processes

    pidfile = cl.spec.dir / "run" / f"slurmd-{name}.pid"
    pid = int(pidfile.read_text().split()[0])
    assert alive(pid, "slurmd"), f"the pid file of {name} names no running slurmd"
    before = slurmd_start_time(cl, name)
    processes.stop([pid])
    stopped = time.monotonic()
    cluster._start_slurmd(cl.spec, node_index(cl, name))

    def registered() -> bool:
        out = slurm(cl, "scontrol", "show", "node", name)
        return slurmd_start_time(cl, name) != before and "NOT_RESPONDING" not in out and "State=DOWN" not in out

    wait_for(registered, f"the new slurmd of {name} registered with slurmctld", 120, interval=0.1)
    return stopped, time.monotonic()


def train_rule(
    config: dict,
    *,
    script: str = "scripts/train.py",
    output: str = "model.pt",
    nodes: int = 2,
    gpus: int = 1,
    metrics: str = "ckpt/metrics.jsonl",
    resources: str = "runtime=30",
) -> str:
    """A Snakefile of one rule `train`: the example training (or a script that wraps it) on `nodes` nodes x `gpus`
    ranks (a fake GPU and a CPU each) through `multinode torchrun`, `config` its --config-json, checkpoints in ckpt/
    (training_folder makes the rest). An output other than model.pt is written after the training ends well."""
    out, then = ("{output}", "") if output == "model.pt" else ("model.pt", " && echo ok > {output}")
    return f"""
rule train:
    output: {output!r}
    params: cfg={json.dumps(config)!r}
    resources: nodes={nodes}, gpus={gpus}, cpus_per_task={gpus}, mem_mb=3000, {resources}
    shell:
        "multinode torchrun {script} --data-dir data --out {out} --ckpt-dir ckpt "
        "--metrics {metrics} --config-json {{params.cfg:q}}{then}"
"""


def training_folder(wd: Path, num_docs: int = 300, seed: int = 3) -> Path:
    """A workflow folder for the real training: workflows/scripts copied to <wd>/scripts (a test's job may outlive
    an edit of the checkout) and a small generated corpus in <wd>/data; returns the scripts' folder."""
    wd.mkdir(parents=True, exist_ok=True)
    scripts = wd / "scripts"
    shutil.copytree(REPO / "workflows" / "scripts", scripts, ignore=shutil.ignore_patterns("__pycache__"))
    argv = [sys.executable, str(scripts / "preprocess.py"), "--out-dir", str(wd / "data"), "--num-docs", str(num_docs)]
    data = subprocess.run([*argv, "--seed", str(seed)], capture_output=True, text=True, timeout=300)
    assert data.returncode == 0, data.stdout + data.stderr
    return scripts


class PageTables(HTMLParser):
    """Every table of an HTML page as rows of cell texts; the texts of its h1 and h2 headings."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.headings: list[str] = []
        self._cell: list[str] | None = None
        self._heading = False
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        self._heading = tag in ("h1", "h2")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        elif self._heading:
            self.headings.append(data)
            self._heading = False


# --- a small filesystem (tests/cluster/test_disk_full_cluster.py, tests/training/test_disk_full.py, unit tests)

# Node i's slurmd has a private mount namespace (sandbox/cluster.py): a mount made on the host after its start never
# reaches it. This clones the host's mount (open_tree) and moves the clone into the namespace of the pid given
# (setns + move_mount): the nodes and the host then share one filesystem, as the nodes of a cluster share theirs.
_INTO_NAMESPACE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
OPEN_TREE, MOVE_MOUNT, CLONE, CLOEXEC, AT_FDCWD, EMPTY_PATH, NEWNS = 428, 429, 1, 0o2000000, -100, 4, 0x20000
path, pid = sys.argv[1].encode(), int(sys.argv[2])
tree = libc.syscall(OPEN_TREE, AT_FDCWD, path, CLONE | CLOEXEC)
if tree < 0 or libc.setns(os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY), NEWNS) < 0:
    raise OSError(ctypes.get_errno(), "open_tree/setns")
if libc.syscall(MOVE_MOUNT, tree, b"", AT_FDCWD, path, EMPTY_PATH) < 0:
    raise OSError(ctypes.get_errno(), "move_mount")
"""


def node_pids(cl: Cluster) -> list[int]:
    """Each node's slurmd (its pid file, checked in /proc): a process in the node's mount namespace."""
    pids = []
    for i in cl.spec.node_indices:
        pid = int((cl.spec.dir / "run" / f"slurmd-{cl.spec.node_name(i)}.pid").read_text().split()[0])
        assert alive(pid, "slurmd"), f"node {cl.spec.node_name(i)} runs no slurmd"
        pids.append(pid)
    return pids


@contextmanager
def small_filesystem(path: Path, size: int, cl: Cluster | None = None) -> Iterator[Path]:
    """A tmpfs of `size` bytes (rounded up to pages) at `path` (made if missing) for the block, unmounted after it
    whatever happens; with `cl` in every node of the sandbox too (the same filesystem: _INTO_NAMESPACE)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    mounted: list[int] = []
    try:
        for pid in node_pids(cl) if cl is not None else []:
            subprocess.run([sys.executable, "-c", _INTO_NAMESPACE, str(path), str(pid)], check=True, timeout=30)
            mounted.append(pid)
        yield path
    finally:
        for pid in mounted:  # lazily: a process of a job may still hold a file open there
            subprocess.run(["nsenter", f"--mount=/proc/{pid}/ns/mnt", "umount", "-l", str(path)], check=False)
        subprocess.run(["umount", "-l", str(path)], check=True)


def resize(path: Path, size: int) -> None:
    """A mounted tmpfs to `size` bytes (not below what it holds): for every namespace it is mounted in."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


def fill(path: Path, leave: int = 0) -> Path:
    """A file in `path` that takes all its free space but `leave` bytes (whole pages); returns it."""
    filler = path / "filler"
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    with open(filler, "wb") as fh:
        fh.write(b"\0" * max(0, free - leave))
    return filler


def needs_root() -> None:
    if os.geteuid() != 0:
        import pytest

        pytest.skip("mounting a small filesystem needs root")


def request_for(**resources: Any) -> JobRequest:
    """The validated request of a rule `train` with these resources."""
    return build_request("train", resources)


def refusal_of(resources: dict[str, Any], **kw: Any) -> str:
    """What build_request says when it refuses a rule `train` with these resources."""
    import pytest

    with pytest.raises(RequestError) as err:
        build_request("train", resources, **kw)
    return str(err.value)
