"""Labelled output of `multinode torchrun`: every line says which node and rank wrote it, and none is cut.

On every node, `run` starts torchrun with each rank's output in a file of its own and appends each complete line,
labelled with its node and rank (contract/logline.py), to the node's file beside the job log (<stem>.<node>.out);
torchrun's own messages carry the node alone. The time of the first line a rank prints goes, once, into the node's
first output file (JobFiles.first_output): the ledger's end of startup for a job that writes no metrics. On the
head node, `Merger` copies the nodes' files, line by line, into the job log.

Why not torchrun's `--tee`: its tailer writes whatever one read returns, so a line that a rank writes in two pieces
(print() writes the text and the newline separately; a block-buffered stdout flushes mid-line) comes out cut, and
another rank's line runs into it. Why not srun's own output forwarding: it splits a line longer than its message
size (about 1 KiB) and interleaves the pieces with other nodes' lines. Here a line is written only once it is
complete (or its stream has ended), in one write, by the only writer of each file. On NFS the job log may show a
node's lines a few seconds late (attribute caching); the node's own file has them at once.

Run by the launcher's step on every node:
    python -m snakemake_executor_multinode.launching.nodelog --nproc P [--dynamic] -- \
        python -m torch.distributed.run ...
"""

from __future__ import annotations

import argparse
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from snakemake_executor_multinode.contract import logline, protocol
from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.launching import preemption, proctree, stall
from snakemake_executor_multinode.launching.torchrun_flags import option_value
from snakemake_executor_multinode.slurm.client import Preemption, QueryError
from snakemake_executor_multinode.util.private_files import write_private

POLL_S = 0.05  # how often new rank files are looked for and read: the delay a line may see, nothing more
# Polls that a rank file's lines wait for its worker's rank before they go out labelled with the local rank only (the
# worker ended before it was seen; at the end of the run they go out at once)
RANK_WAIT_POLLS = 100
# <log dir>/<run id>_<random>/attempt_<restart>/<local rank>/{stdout,stderr}.log: torchrun's layout (DefaultLogsSpecs)
RANK_FILE = re.compile(r"attempt_(?P<attempt>\d+)/(?P<local>\d+)/(?P<stream>stdout|stderr)\.log$")


@dataclass
class Source:
    """One stream being read: a rank's file, or torchrun's own stdout/stderr."""

    label: bytes
    stream: int  # 1 or 2: where its lines go in the job log
    console: bool = True  # False: kept in the node's file only (torchrun's --local-ranks-filter)
    partial: bytes = b""
    fh: object = field(default=None, repr=False)


@dataclass
class RankFile(Source):
    """A rank's file under torchrun's log dir. Its label waits for the worker's global rank (the file exists before
    the worker does); what it wrote meanwhile is held, not lost."""

    local: int = 0
    attempt: int = 0
    inode: int = 0  # the file this source reads: torchrun replaces a file under the same path (RankFiles.poll)
    path: Path | None = None
    held: bytes = b""
    waited: int = 0  # polls its held lines have waited for the rank


class Labeller:
    """Splits chunks into complete lines and writes each, labelled, in one write: to the node's file in a job, to
    the terminal outside SLURM (no file given)."""

    def __init__(
        self,
        node_file: Path | None,
        echo: bool = False,
        out_fds: tuple[int, int] = (1, 2),
        first_output: Path | None = None,
    ) -> None:
        self.out_fds, self.echo = out_fds, echo or node_file is None
        # O_APPEND, one write per line: a second launch in the same job appends whole lines after the first's
        self.node_fd = os.open(node_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if node_file else None
        self.first_output = first_output  # None once written (or when there is none to write)

    def rank_printed(self) -> None:
        """A rank printed a line: the first time in this run (an earlier launch of the run may have), its time
        goes to the node's first output file, whole (renamed into place). A failed write costs the ledger its end
        of startup, never the training its output: one line on stderr says so."""
        path, self.first_output = self.first_output, None
        if path is None:
            return
        try:
            if not path.exists():
                write_private(path, f"{time.time()!r}\n")  # repr: the float itself, read back unrounded
        except OSError as exc:
            _write_all(self.out_fds[1], f"[multinode torchrun] first output time not written: {exc}\n".encode())

    def feed(self, src: Source, data: bytes) -> None:
        lines = (src.partial + data).split(b"\n")
        src.partial = lines.pop()
        for line in lines:
            self.write(src, line + b"\n")

    def close(self, src: Source) -> None:
        """The stream ended: a last line without its newline still comes out whole."""
        if src.partial:
            self.write(src, src.partial + b"\n")
            src.partial = b""

    def write(self, src: Source, line: bytes) -> None:
        if not src.console:
            return
        text = src.label + line
        if self.node_fd is not None:
            _write_all(self.node_fd, text)
        if self.echo:
            _write_all(self.out_fds[src.stream - 1], text)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except InterruptedError:
            continue
        except OSError:  # the job log went away (srun killed): keep the node's file and the run going
            return


def rank_of_worker(agent_pid: int, local_rank: int, attempt: int) -> int | None:
    """The global rank torchrun gave a worker (with c10d the rendezvous picks it), read from the worker's
    environment: a child of the agent with this LOCAL_RANK and TORCHELASTIC_RESTART_COUNT."""
    for pid in proctree.children().get(agent_pid, []):
        try:
            env = proctree.environ(pid)
        except OSError:
            continue
        if (
            env.get(b"LOCAL_RANK") == str(local_rank).encode()
            and env.get(b"TORCHELASTIC_RESTART_COUNT", b"0") == str(attempt).encode()
        ):
            rank = env.get(b"RANK", b"")
            return int(rank) if rank.isdigit() else None
    return None


class RankFiles:
    """Finds the rank files torchrun creates under the log dir (one set per restart attempt) and reads them.

    torchrun numbers a set by its restart count, and a restart forced by a membership change (another node's agent
    restarted and waits in the rendezvous) does not count: the workers start again under the same attempt number,
    and torchrun deletes that attempt's folder and creates the files anew under the same paths. A file is therefore
    known by its inode, not its path: a replaced file's source is drained to its end through the open handle (the
    deleted file's lines are still there), then the new file is read as a new source with its worker's rank."""

    def __init__(
        self, root: Path, node: str, rank: Callable[[int, int], int | None], console: Callable[[int], bool]
    ) -> None:
        self.root, self.node, self.rank, self.console = root, node, rank, console
        self.sources: dict[Path, RankFile] = {}

    def poll(self, out: Labeller, final: bool = False) -> None:
        for path in self.root.glob("*/attempt_*/*/std*.log"):
            if not (m := RANK_FILE.search(path.as_posix())):
                continue
            known = self.sources.get(path)
            try:
                if known is not None and path.stat().st_ino == known.inode:
                    continue
                fh = open(path, "rb")  # noqa: SIM115 - read as it grows
            except OSError:
                continue  # removed meanwhile: its set is being replaced
            if known is not None:
                self._retire(known, out)
            local = int(m["local"])
            src = RankFile(b"", 1 if m["stream"] == "stdout" else 2, self.console(local), local=local)
            src.attempt, src.fh, src.inode = int(m["attempt"]), fh, os.fstat(fh.fileno()).st_ino
            src.path = path
            self.sources[path] = src
        for src in self.sources.values():
            self._read(src, out, final)

    def _read(self, src: RankFile, out: Labeller, final: bool) -> None:
        data = b""
        while chunk := src.fh.read(1 << 16):  # type: ignore[attr-defined]
            data += chunk
        if b"\n" in data or (final and (data or src.held or src.partial)):
            out.rank_printed()  # read as printed, before its line may wait for the rank's label
        if not src.label:
            rank = self.rank(src.local, src.attempt)
            if rank is not None and not self._current(src):
                # The file was replaced: the worker with this local rank and attempt number is the next round's
                # (torchrun starts it only after replacing the file), so its rank is not this file's. Held open, the
                # old file keeps its inode: an equal inode is the same file.
                rank = None
            src.held += data
            src.waited += bool(src.held)
            if rank is None and not final and src.waited < RANK_WAIT_POLLS:
                return  # the worker is not found yet: its lines wait for their label
            data, src.held = src.held, b""
            # without its rank, the worker was gone too soon: its local rank says which it was
            who = logline.label(self.node, rank) if rank is not None else logline.label(self.node, local_rank=src.local)
            src.label = who.encode()
        if data:
            out.feed(src, data)

    @staticmethod
    def _current(src: RankFile) -> bool:
        try:
            return src.path is not None and src.path.stat().st_ino == src.inode
        except OSError:
            return False

    def _retire(self, src: RankFile, out: Labeller) -> None:
        self._read(src, out, final=True)
        out.close(src)
        src.fh.close()  # type: ignore[attr-defined]

    def close(self, out: Labeller) -> None:
        self.poll(out, final=True)
        for src in self.sources.values():
            out.close(src)
            src.fh.close()  # type: ignore[attr-defined]


def signal_workers(top: int, signum: int) -> None:
    """`signum` to `top` (torchrun's agent, or a container runtime's client around it) and every process down the
    tree to the workers, the first ones with RANK in their environment (they run in sessions of their own, so a
    process group would miss them), and to nothing below a worker: a DataLoader's workers started by spawn or
    forkserver (and torch.compile's) begin with the signal's default action, exec having reset the rank's handler,
    and USR2's default would kill them, and with them the rank (tests/training/test_dataloader_usr2.py)."""
    tree, targets, todo = proctree.children(), [top], [top]
    while todo:
        for pid in tree.get(todo.pop(), []):
            targets.append(pid)
            try:
                if b"RANK" not in proctree.environ(pid):
                    todo.append(pid)  # the agent, or a wrapper: the workers are further down
            except OSError:
                continue
    for pid in targets:
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def with_rank_logs(torchrun: Sequence[str], log_dir: str) -> list[str]:
    """torchrun's command with every worker's stdout and stderr redirected into files under `log_dir`."""
    at = list(torchrun).index("torch.distributed.run") + 1
    return [*torchrun[:at], "--redirects=3", f"--log-dir={log_dir}", *torchrun[at:]]


def run(torchrun: Sequence[str], nproc: int, dynamic: bool, env: dict[str, str], echo: bool = False) -> int:
    """Run this node's torchrun with every line labelled into the node's file; torchrun's exit code."""
    node = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    node_rank = int(env.get("SLURM_NODEID", "0"))
    user_dir = option_value(torchrun, "--log-dir", "--log_dir")
    root = Path(user_dir) if user_dir else Path(tempfile.mkdtemp(prefix=f"multinode-{node}-"))
    shown = option_value(torchrun, "--local-ranks-filter", "--local_ranks_filter")
    shown_ranks = {int(r) for r in shown.split(",") if r.strip().isdigit()} if shown else None
    out = Labeller(_node_file(env, node), echo, first_output=_first_output_file(env, node))
    agent = (Source(logline.label(node).encode(), 1), Source(logline.label(node).encode(), 2))
    out.write(agent[1], f"[multinode torchrun] launching on {node}, node_rank={node_rank}\n".encode())
    cmd = torchrun if user_dir else with_rank_logs(torchrun, str(root))
    # Unbuffered workers: a rank's lines reach its file (and the job log) as it prints them, not 8 KiB later.
    proc = subprocess.Popen(
        list(cmd), env={"PYTHONUNBUFFERED": "1", **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )

    def rank(local: int, attempt: int) -> int | None:
        if not dynamic:  # static rendezvous: torchrun ranks node after node
            return node_rank * nproc + local
        return rank_of_worker(proc.pid, local, attempt)  # the rendezvous picked it; None until the worker runs

    contained = bool(env.get(protocol.CONTAINER_RUNTIME_VAR))
    _handle_signals(proc, log_stem(env), Preempted(proc, env, node, out, agent[1]), contained=contained)
    files = RankFiles(root, node, rank, lambda local: shown_ranks is None or local in shown_ranks)
    stacks = StackRequests(log_stem(env), node, proc.pid, out)
    try:
        code = _follow(proc, agent, files, out, stacks.tick)
    finally:
        if not user_dir:
            shutil.rmtree(root, ignore_errors=True)
    return code if code >= 0 else 128 - code


def _node_file(env: Mapping[str, str], node: str) -> Path | None:
    stem = log_stem(env)
    if not stem:
        return None
    path = JobFiles(Path(stem)).node_out(node)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _first_output_file(env: Mapping[str, str], node: str) -> Path | None:
    stem = log_stem(env)
    return JobFiles(Path(stem)).first_output(node) if stem else None


def _forward(proc: subprocess.Popen, signum: int) -> None:
    if proc.poll() is None:
        proc.send_signal(signum)


def _pass_on(proc: subprocess.Popen, signum: int) -> None:
    """To torchrun and its workers (signal_workers): torchrun's agent ignores USR1/USR2 (inherited) and its workers
    checkpoint; a container runtime's client (podman) passes it into the container."""
    signal_workers(proc.pid, signum)


def _kill_all(proc: subprocess.Popen) -> None:
    """SIGKILL to torchrun and every process below it, unless torchrun ended on the gentle stop's SIGTERM."""
    if proc.poll() is not None:
        return
    below = proctree.descendants(proc.pid)  # found first: torchrun first, before it can react to its workers' end
    for pid in (proc.pid, *below):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _handle_signals(proc: subprocess.Popen, stem: str, term: Preempted, contained: bool = False) -> None:
    """SIGINT goes to torchrun (it stops its workers; the reading goes on until it is gone), and so does SIGTERM
    unless SLURM is preempting the job (`term`: then it is the checkpoint signal). USR2 goes to torchrun and its
    workers (signal_workers). USR1 is the launcher's gentle end of a stalled step (stall.stop_file exists): SIGTERM to
    torchrun, and without a container (`contained`) a SIGKILL to it and every process below it stall.STOP_KILL_S
    later (a stopped or hung worker outlives the SIGTERM; SLURM's own SIGKILL waits for its KillWait); else a user's
    checkpoint signal (signal="USR1@..."), passed on as USR2 is."""
    stopping: list[threading.Timer] = []

    def usr1(signum: int, _frame: object) -> None:
        if stem and stall.stop_file(stem).exists():
            _forward(proc, signal.SIGTERM)
            if not contained and not stopping:
                stopping.append(threading.Timer(stall.STOP_KILL_S, _kill_all, (proc,)))
                stopping[0].daemon = True
                stopping[0].start()
        else:
            _pass_on(proc, signum)

    signal.signal(signal.SIGINT, lambda signum, _frame: _forward(proc, signum))
    signal.signal(signal.SIGTERM, lambda _signum, _frame: term.sigterm())
    # torchrun started with USR1 and USR2 ignored (set in main, inherited); from here on this process passes them on
    signal.signal(signal.SIGUSR2, lambda signum, _frame: _pass_on(proc, signum))
    signal.signal(signal.SIGUSR1, usr1)


class Preempted:
    """A SIGTERM to this node's task: SLURM's preemption notice, or the end (scancel, time limit, the grace time's
    end)? slurmctld is asked, on a thread of its own (the lines keep flowing); a preemption is passed on to the
    workers as the checkpoint signal and noted for the job script (preemption.py), anything else, and any second
    SIGTERM, goes to torchrun at once."""

    def __init__(
        self,
        proc: subprocess.Popen,
        env: Mapping[str, str],
        node: str,
        out: Labeller,
        said: Source,
        ask: Callable[[Mapping[str, str]], Preemption | None] = preemption.ask,
    ) -> None:
        self.proc, self.env, self.node, self.out, self.said, self.ask = proc, env, node, out, said, ask
        self.state = "running"  # -> asking -> preempted | stopped
        # re-entrant: a second SIGTERM's handler may run inside the first's, in the same thread
        self.lock = threading.RLock()
        self.thread: threading.Thread | None = None

    def sigterm(self) -> None:
        with self.lock:
            if self.state == "running":
                self.state = "asking"
                self.thread = threading.Thread(target=self.decide, daemon=True)
                self.thread.start()
                return
            self.state = "stopped"
        _forward(self.proc, signal.SIGTERM)

    def decide(self) -> None:
        name = preemption.checkpoint_signal(self.env)
        cancel = self.env.get(protocol.CANCEL_FILE_VAR, "")
        if cancel and Path(cancel).exists():  # `multinode cancel --checkpoint` sent it: no question for SLURM
            with self.lock:
                if self.state != "asking":
                    return
                self.state = "preempted"
            self._say(f"SIGTERM of a cancel that checkpoints first: passed on to the ranks as SIG{name}")
            _pass_on(self.proc, getattr(signal, f"SIG{name}"))
            return
        try:
            found, why = self.ask(self.env), ""
        except QueryError as err:
            found, why = None, f"SLURM did not answer whether this SIGTERM is a preemption ({err}): "
        with self.lock:
            if self.state != "asking":
                return  # a second SIGTERM came first: stopped already
            self.state = "preempted" if found is not None else "stopped"
        if found is None:
            if why:
                self._say(f"{why}the training ends, as on any SIGTERM")
            _forward(self.proc, signal.SIGTERM)
            return
        self._say(f"{preemption.when(preemption.notice_line(self.env, found, self.node))}: passed on to the ranks as "
                  f"SIG{name}, the checkpoint signal")  # fmt: skip
        if error := preemption.record(self.env, found, self.node):
            self._say(f"ERROR: {error}")
        _pass_on(self.proc, getattr(signal, f"SIG{name}"))

    def _say(self, text: str) -> None:
        self.out.write(self.said, f"[multinode torchrun] {text}\n".encode())


class StackRequests:
    """The progress watchdog's request (launching/stall.py), looked for about once a second: this node's workers'
    Python stacks, labelled with their ranks, into the node's file; then the node says it is done."""

    def __init__(self, stem: str, node: str, agent_pid: int, out: Labeller) -> None:
        self.stem, self.node, self.agent_pid, self.out = stem, node, agent_pid, out
        self.next_look = 0.0
        self.answered = False

    def tick(self) -> None:
        now = time.monotonic()
        if self.answered or not self.stem or now < self.next_look:
            return
        self.next_look = now + 1.0
        if not stall.request_file(self.stem).exists():
            return
        self.answered = True
        workers = stall.worker_ranks(self.agent_pid, step=os.environ)
        if not workers:
            src = Source((logline.label(self.node) + logline.STACK).encode(), 2)
            self.out.write(src, f"no stack: no worker process found on {self.node}".encode() + b"\n")
        for pid, rank in workers:
            src = Source((logline.label(self.node, rank) + logline.STACK).encode(), 2)
            for line in [f"pid {pid} on {self.node}:", *stall.dump(pid)]:
                self.out.write(src, line.encode(errors="replace") + b"\n")
        stall.done_file(self.stem, self.node).write_text("done\n")


def _follow(
    proc: subprocess.Popen, agent: tuple[Source, Source], files: RankFiles, out: Labeller, tick: Callable[[], None]
) -> int:
    """Read torchrun's own output and the rank files until torchrun has ended and everything is drained."""
    assert proc.stdout is not None and proc.stderr is not None
    pipes = {proc.stdout.fileno(): agent[0], proc.stderr.fileno(): agent[1]}
    while pipes:
        tick()
        for fd in select.select(list(pipes), [], [], POLL_S)[0]:
            data = os.read(fd, 1 << 16)
            if data:
                out.feed(pipes[fd], data)
            else:
                out.close(pipes.pop(fd))
        files.poll(out)
    code = proc.wait()
    files.close(out)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m snakemake_executor_multinode.launching.nodelog", description=__doc__
    )
    parser.add_argument("--nproc", type=int, required=True, help="worker processes on this node")
    parser.add_argument("--dynamic", action="store_true", help="the rendezvous (c10d) assigns the ranks")
    parser.add_argument("--echo", action="store_true", help="also write the lines to stdout/stderr (a user's step)")
    parser.add_argument("torchrun", nargs=argparse.REMAINDER, help="-- and torchrun's command")
    args = parser.parse_args(argv)
    torchrun = args.torchrun[1:] if args.torchrun[:1] == ["--"] else args.torchrun
    if not torchrun:
        parser.error("no torchrun command after --")
    # SLURM's --signal=USR2 (and scancel --signal) reaches every process of the step with proctrack/linuxproc, but
    # only the step's task (this process) with proctrack/cgroup, most production clusters. So torchrun starts with
    # USR2 ignored (its agent must not die of it), and this process passes it on to the workers (run: pass_on);
    # under linuxproc a worker gets it twice, which its flag-setting handler absorbs (a training that is leaving
    # ignores it: docs/training-contract.md; a worker killed by it after its checkpoint: launcher.after_checkpoint).
    # USR1 likewise (a rule may choose it; the launcher also uses it, with a request file, to end a stalled step
    # gently).
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    return run(torchrun, args.nproc, args.dynamic, dict(os.environ), args.echo)


class Merger:
    """On the head node: copies the nodes' labelled files into the job log (this process's stdout) as they grow,
    whole lines only, from where each file ended when the launch began (an earlier launch's lines are already in
    the log)."""

    def __init__(self, stem: str, nodes: Sequence[str], out_fd: int = 1) -> None:
        self.out_fd = out_fd
        self.paths = [JobFiles(Path(stem)).node_out(node) for node in nodes]
        self.offsets = {p: (p.stat().st_size if p.exists() else 0) for p in self.paths}
        self.partial = {p: b"" for p in self.paths}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="multinode-log-merger", daemon=True)

    def __enter__(self) -> Merger:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.copy()
        self.copy()  # what the nodes wrote last

    def copy(self) -> None:
        for path in self.paths:
            try:
                with open(path, "rb") as fh:
                    fh.seek(self.offsets[path])
                    data = fh.read()
            except OSError:
                continue  # not created yet: the node has not started
            if not data:
                continue
            self.offsets[path] += len(data)
            whole, _, rest = (self.partial[path] + data).rpartition(b"\n")
            self.partial[path] = rest
            if whole:
                _write_all(self.out_fd, whole + b"\n")


def log_stem(env: Mapping[str, str]) -> str:
    """Where this job's node files go: beside the job log; outside SLURM, nowhere (the terminal has the lines)."""
    if stem := env.get(protocol.LOG_STEM_VAR):
        return stem
    if job := env.get("SLURM_JOB_ID"):
        return os.path.join(env.get("SLURM_SUBMIT_DIR", "."), f"slurm-{job}")
    return ""


if __name__ == "__main__":
    sys.exit(main())
