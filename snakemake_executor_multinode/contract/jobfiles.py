"""Every file of a job and every folder of the plugin's state, named once: as Python paths, and as the job script's
shell words (the same names, with "$MULTINODE_JOB_KEY" or "$MULTINODE_LOG_STEM" where the job fills them in).

A job's files lie in its log folder and share its stem, <jobid>.attempt<n> (`log_stem`): the script (.sh), the log
(.log), the metrics and runs records, each node's labelled output (<stem>.<node>.out), GPU samples
(<stem>.<node>.gpu.csv) and first output time (<stem>.<node>.first). A requeued job's later runs write under
<stem>.restart<k> (a log and node files of their own); the metrics, runs and GPU sample files are the first run's,
which every run appends to. Before sbatch names the job, its script and code manifest are kept under the job's name
(`PendingFiles`). Markers lie in the state folder, named <job key><suffix> (`marker`). What outlives a run lies
under .snakemake/multinode (`StateFolders`).
"""

from __future__ import annotations

import glob
import math
import re
from dataclasses import dataclass
from pathlib import Path, PurePath

from snakemake_executor_multinode.contract.protocol import JOB_KEY_VAR, LOG_STEM_VAR, STATE_DIR_VAR

# Where the plugin keeps what outlives a run, relative to the workflow's working directory (the shared filesystem).
STATE_ROOT = PurePath(".snakemake/multinode")
STATE_DIR = STATE_ROOT / "state"  # the markers below, named <job key><suffix>
RUNS_DIR = STATE_ROOT / "runs"  # the run registry (watching/registry.py)
INDEX_DIR = STATE_ROOT / "index"  # the registry's newest submissions by outputs, for reattach (registry.py)
REPORTS_DIR = STATE_ROOT / "reports"  # efficiency reports (watching/report.py)
LOGS_DIR = STATE_ROOT / "logs"  # job scripts and logs: the default of --multinode-logdir
SNAPSHOTS_DIR = STATE_ROOT / "snapshots"  # one folder per frozen code snapshot (planning/snapshot.py)
OBJECTS_DIR = STATE_ROOT / "objects"  # the snapshots' content-addressed store
PROVENANCE_DIR = STATE_ROOT / "provenance"  # a record per job and per output (watching/provenance.py)
# `multinode torchrun` outside SLURM: each run's files under a stem of its own, local-<time>-<pid> (cli/local_run.py)
LOCAL_RUNS_DIR = STATE_ROOT / "torchrun"


@dataclass(frozen=True)
class StateFolders:
    """The state folders of one working directory."""

    workdir: Path

    @property
    def root(self) -> Path:
        return self.workdir / STATE_ROOT

    @property
    def state(self) -> Path:
        return self.workdir / STATE_DIR

    @property
    def runs(self) -> Path:
        return self.workdir / RUNS_DIR

    @property
    def index(self) -> Path:
        return self.workdir / INDEX_DIR

    @property
    def reports(self) -> Path:
        return self.workdir / REPORTS_DIR

    @property
    def logs(self) -> Path:
        return self.workdir / LOGS_DIR

    @property
    def snapshots(self) -> Path:
        return self.workdir / SNAPSHOTS_DIR

    @property
    def objects(self) -> Path:
        return self.workdir / OBJECTS_DIR

    @property
    def provenance(self) -> Path:
        return self.workdir / PROVENANCE_DIR

    @property
    def local_runs(self) -> Path:
        return self.workdir / LOCAL_RUNS_DIR

    def marker(self, job_key: str, suffix: str) -> Path:
        return marker(self.state, job_key, suffix)


# Markers the job script writes into the state folder (on the shared filesystem), named <job key><suffix>.
EXIT_MARKER = ".exit"  # "<exit code> <restart>" of the run that wrote it, written last (atomically, by rename)
FAILED_NODE_MARKER = ".failed-node"  # the node whose launch failed first (written by the launcher)
PREEMPT_MARKER = ".preempted"  # the training checkpointed on the signal (its step, written by rank 0)
REQUEUE_MARKER = ".requeued"  # "<next restart> <why>": the job requeued itself after a checkpoint
STALL_MARKER = ".stalled"  # the watchdog's verdict, one line (written by the launcher, read by the job status watch)
SELF_REQUEUE_MARKER = ".self-requeues"  # how often the job requeued itself after a checkpoint (its budget)
CRASH_MARKER = ".crashes"  # "<runs> <exit>": failed runs in a row soon after their start, the last one's exit code
# SLURM is preempting this run (its SIGTERM came with a PreemptTime): one JSON line, the runs file's "preempted" line,
# written by the first node's labeller that asked (launching/preemption.py); the job script waits for SLURM's end.
PREEMPT_NOTICE_MARKER = ".preempt-notice"
# `multinode cancel --checkpoint` (or Snakemake's first Ctrl-C) asked the training to checkpoint: the job ends after
# its checkpoint instead of requeueing itself (the text: who asked, and when)
CANCEL_MARKER = ".cancel-checkpoint"
MARKERS = (
    EXIT_MARKER, FAILED_NODE_MARKER, PREEMPT_MARKER, REQUEUE_MARKER, STALL_MARKER, SELF_REQUEUE_MARKER, CRASH_MARKER,
    PREEMPT_NOTICE_MARKER, CANCEL_MARKER,
)  # fmt: skip


def marker(state_dir: Path, job_key: str, suffix: str) -> Path:
    return state_dir / f"{job_key}{suffix}"


def marker_shell(suffix: str) -> str:
    """A marker's path in the job script, where the state folder is $MULTINODE_STATE_DIR."""
    return f'"${STATE_DIR_VAR}/${JOB_KEY_VAR}{suffix}"'


# The suffixes of a job's files after its stem.
LOG = ".log"
SCRIPT = ".sh"
# Named after the job's log, not its id alone: the log folder keeps them after the run (the state folder's markers
# are removed once Snakemake has seen the job end), for `multinode status` and the provenance records.
METRICS = ".metrics.jsonl"  # the training's metrics lines ($MULTINODE_METRICS_FILE)
RUNS = ".runs.jsonl"  # each run's start line (nodes, GPUs, versions) and end (exit, why) or requeue (why) line
NODE_OUT = ".out"  # <stem>.<node>.out: a node's labelled output (.out: the job's own logs are the .log files)
GPU_SAMPLES = ".gpu.csv"  # <stem>.<node>.gpu.csv: a node's nvidia-smi samples
FIRST_OUTPUT = ".first"  # <stem>.<node>.first: epoch seconds of the first line a rank of the node printed in the run
# The nodes `multinode torchrun` dropped and the spares it swapped in (resource spare_nodes), one JSON line each; the
# first run's file, which every run appends to.
REPLACEMENTS = ".replacements.jsonl"
RESTART = ".restart"  # <stem>.restart<k>: the k-th requeued run's own log and node files
CODE_MANIFEST = ".code.sha256"  # <job name>.code.sha256: what a restart checks when nothing is frozen
# The progress watchdog's exchange between the launcher (head node) and every node's labeller (launching/stall.py).
STALL_REQUEST = ".stall-request"  # the launcher asks every node for its ranks' stacks
STACKS_DONE = ".stacks-done"  # <stem>.<node>.stacks-done: a node has written its ranks' stacks
STOP_REQUEST = ".stop-request"  # the launcher asks every node to end its torchrun gently (SIGTERM)
NCCL_TRACES = ".nccl-trace-rank"  # <stem>.nccl-trace-rank<R>: NCCL's flight recorder dumps, rank by rank


TENSORBOARD = "tensorboard"  # <log dir>/tensorboard/<run id>: an experiment's TensorBoard folder


def tensorboard_dir(log_dir: PurePath, run_id: str) -> PurePath:
    """The TensorBoard folder of an experiment ($MULTINODE_TENSORBOARD_DIR): beside the logs of every job of it
    (a rule's jobs with the same wildcards share a log folder), one folder per run id, so that `tensorboard --logdir
    <log dir>/tensorboard` shows each Snakemake run as a run of its own and a requeue's curves continue its run's."""
    return log_dir / TENSORBOARD / run_id


def log_stem(job_key: str, attempt: int | str) -> str:
    """A job's stem: <job key>.attempt<n>. `job_key` may be sbatch's %j or a shell word of the job script."""
    return f"{job_key}.attempt{attempt}"


STEM_SHOWN = log_stem("<jobid>", "<n>")  # a stem as help texts show it


@dataclass(frozen=True)
class JobFiles:
    """One job's files: `prefix` is its log folder and stem joined, <log dir>/<jobid>.attempt<n>."""

    prefix: Path

    @classmethod
    def of(cls, log_dir: Path, job_key: str, attempt: int) -> JobFiles:
        return cls(log_dir / log_stem(job_key, attempt))

    @classmethod
    def from_log(cls, log: str | Path) -> JobFiles:
        """The files of the job whose first log is `log`."""
        return cls(Path(str(log).removesuffix(LOG)))

    @property
    def stem(self) -> str:
        return self.prefix.name

    def _file(self, suffix: str) -> Path:
        return self.prefix.with_name(self.stem + suffix)

    @property
    def log(self) -> Path:
        return self._file(LOG)

    @property
    def script(self) -> Path:
        return self._file(SCRIPT)

    @property
    def metrics(self) -> Path:
        return self._file(METRICS)

    @property
    def runs(self) -> Path:
        return self._file(RUNS)

    @property
    def replacements(self) -> Path:
        return self._file(REPLACEMENTS)

    @property
    def nccl_traces(self) -> Path:
        """The prefix NCCL's flight recorder completes with each rank's number."""
        return self._file(NCCL_TRACES)

    @property
    def preempt_marker(self) -> Path:
        """A run of `multinode torchrun` outside SLURM keeps its preempt marker beside its files (a job's lies in the
        state folder, named by its key: `marker`)."""
        return self._file(PREEMPT_MARKER)

    @property
    def first_run(self) -> JobFiles:
        """The first run's files of a requeued run's (<stem>.restart<k>); the same files for the first run."""
        return JobFiles(self.prefix.with_name(_RESTART_END.sub("", self.stem)))

    def node_out(self, node: str) -> Path:
        return self._file(f".{node}{NODE_OUT}")

    def gpu_samples(self, node: str) -> Path:
        return self._file(f".{node}{GPU_SAMPLES}")

    def first_output(self, node: str) -> Path:
        """This run's first output time on `node`: the epoch seconds (text) of the first line one of its ranks
        printed (written once, by the node's labeller)."""
        return self._file(f".{node}{FIRST_OUTPUT}")

    def first_output_time(self) -> float | None:
        """The earliest first output time over this run's nodes (a later run's files are not this run's); None
        when no node wrote one, or none parses."""
        found = self.prefix.parent.glob(glob.escape(self.stem + ".") + "*" + FIRST_OUTPUT)
        times = []
        for path in found:
            if _RESTART_NODE.match(path.name[len(self.stem) :]):
                continue  # <stem>.restart<k>.<node>.first: a later run's
            try:
                value = float(path.read_text().strip())
            except (OSError, ValueError):
                continue
            if math.isfinite(value):
                times.append(value)
        return min(times, default=None)

    @property
    def stall_request(self) -> Path:
        return self._file(STALL_REQUEST)

    def stacks_done(self, node: str) -> Path:
        return self._file(f".{node}{STACKS_DONE}")

    @property
    def stop_request(self) -> Path:
        return self._file(STOP_REQUEST)

    def restart(self, k: int) -> JobFiles:
        """The files of the job's k-th requeued run (k = 0: the first run's)."""
        return JobFiles(self._file(f"{RESTART}{k}")) if k else self

    def restart_logs(self) -> list[Path]:
        """The logs of the job's later runs that exist, oldest first."""
        found = self.prefix.parent.glob(glob.escape(self.stem + RESTART) + "*" + LOG)
        runs = [(int(m.group(1)), p) for p in found if (m := _RESTART_LOG.fullmatch(p.name[len(self.stem) :]))]
        return [p for _, p in sorted(runs)]

    def node_outs(self, node: str) -> list[Path]:
        """Every run's labelled output of `node` that exists (the first run's and each restart's)."""
        pattern = glob.escape(self.stem) + "*" + glob.escape(f".{node}{NODE_OUT}")
        return [p for p in self.prefix.parent.glob(pattern) if self._is_run_file(p, f".{node}{NODE_OUT}")]

    def gpu_samples_by_node(self) -> dict[str, Path]:
        """Every node's GPU samples, by node name."""
        found = self.prefix.parent.glob(glob.escape(self.stem + ".") + "*" + GPU_SAMPLES)
        return {p.name[len(self.stem) + 1 : -len(GPU_SAMPLES)]: p for p in sorted(found)}

    def all_files(self) -> list[Path]:
        """Every file of this stem that exists: its runs' logs and node files, its records, its script."""
        folder = self.prefix.parent
        return [p for p in folder.iterdir() if p.name.startswith(self.stem + ".")] if folder.is_dir() else []

    def _is_run_file(self, path: Path, tail: str) -> bool:
        middle = path.name[len(self.stem) : -len(tail)]
        return middle == "" or _RESTART_SUFFIX.fullmatch(middle) is not None


_RESTART_SUFFIX = re.compile(re.escape(RESTART) + r"\d+")
_RESTART_END = re.compile(re.escape(RESTART) + r"\d+$")
_RESTART_LOG = re.compile(re.escape(RESTART) + r"(\d+)" + re.escape(LOG))
_RESTART_NODE = re.compile(re.escape(RESTART) + r"\d+\.")  # what follows a stem in a later run's node file


@dataclass(frozen=True)
class ShellJobFiles:
    """The same names as the job script's shell words: `prefix` is a quoted folder and stem, or a variable."""

    prefix: str

    @classmethod
    def of(cls, log_dir_word: str, attempt: int) -> ShellJobFiles:
        """The first run's files, the job's key filled in by the script."""
        key = f'"${JOB_KEY_VAR}"'
        return cls(f"{log_dir_word}/{log_stem(key, attempt)}")

    @classmethod
    def this_run(cls) -> ShellJobFiles:
        """The running run's files: the job script sets $MULTINODE_LOG_STEM to the first run's prefix, or a
        restart's (`restart_shell`)."""
        return cls(f'"${LOG_STEM_VAR}"')

    @property
    def log(self) -> str:
        return self.prefix + LOG

    @property
    def metrics(self) -> str:
        return self.prefix + METRICS

    @property
    def runs(self) -> str:
        return self.prefix + RUNS

    @property
    def replacements(self) -> str:
        return self.prefix + REPLACEMENTS

    def node_out(self, node_word: str) -> str:
        return f"{self.prefix}.{node_word}{NODE_OUT}"

    def gpu_samples(self, node_word: str) -> str:
        return f"{self.prefix}.{node_word}{GPU_SAMPLES}"

    @property
    def nccl_traces(self) -> str:
        """The prefix NCCL's flight recorder completes with each rank's number."""
        return self.prefix + NCCL_TRACES

    @staticmethod
    def restart_suffix(count_word: str) -> str:
        """What a requeued run appends to the first run's prefix: .restart<k>, k a shell word."""
        return f"{RESTART}{count_word}"


@dataclass(frozen=True)
class PendingFiles:
    """A job's files under its name, before sbatch has named the job: the script sbatch is handed (a job array's
    element keeps running it), and the restart's code manifest."""

    log_dir: Path
    job_name: str

    @property
    def script(self) -> Path:
        return self.log_dir / f"{self.job_name}{SCRIPT}"

    @property
    def code_manifest(self) -> Path:
        return self.log_dir / f"{self.job_name}{CODE_MANIFEST}"


def array_script(log_dir: Path, array_name: str) -> Path:
    """A job array's own script: one folder above its elements' logs (the rule's folder), named after the array."""
    return log_dir.parent / f"{array_name}{SCRIPT}"
