"""Goodput through a schedule of faults: the seed's hand-written recipe, what a competent team adds to it, and
`--executor multinode`, side by side with a fault-free baseline, in one run.

One 2-node x 2-rank CPU training (workflows/scripts/train.py, torch_ddp + gloo, checkpoint every N steps) per
variant, all of one scenario at once on one local cluster (`multinode cluster up`, 2 CPUs and 2 fake GPUs per node: a
job fills its nodes, so a node's death touches one job). Each variant but the baseline meets the same faults, each
injected by pid (or by SLURM's own command) once its training has logged the step the schedule names:

  node_death         the job's second node: its slurmd (pid file) and every process of its network namespace
                     SIGKILLed; it comes back (`restart_node`) once SLURM has marked it DOWN (SlurmdTimeout)
  hang               one rank of the second node SIGSTOPped (the highest global rank; found by pid in that node's
                     namespace, by the RANK its environment carries)
  crash              one rank of the second node SIGKILLed (found the same way): a crashed process on a healthy node
  admin_requeue      `scontrol requeue JOB`
  time_limit_signal  the running job's time limit cut to 125-185 s from now: SLURM's own `--signal=USR2@120` comes;
                     a requeued job gets its limit back while it waits

Variants:
  baseline   `--executor multinode` without faults: the ceiling (startup, checkpoints, teardown).
  recipe     shared/seed-blog.md's train.sh: sbatch, one `srun -w NODE torchrun --node_rank=K` per node, the last in
             the foreground, `--signal=USR2@120`, `--open-mode=append`; its time limit is its only guard.
  competent  what a competent team adds to the recipe: a process-group timeout (train.py's collective_timeout_s,
             --pg-timeout-s), one `srun --kill-on-bad-exit=1` step for every rank (SLURM starts the ranks; a rank that
             exits with an error ends the others), and `--signal=B:USR2@120` with a batch-script trap that passes the
             signal on to the training (srun forwards it to every rank).
  multinode  `snakemake --executor multinode --retries 3` on the same training: `multinode torchrun`, the stall
             settings of --stall-timeout/--on-stall (none: the plugin's defaults), the same signal and time limit.
  spares     the same with `spare_nodes=1` (issue 37): 3 nodes asked for, 2 trained on; a dead node or the node of
             a stalled rank is replaced by the spare inside the job (the faults target the second training node).
The recipes' user is modelled as resubmitting the same script the moment a job of it has ended without the final
model (no human is that fast: their best case). SLURM itself requeues a job on an admin requeue and a node failure
(JobRequeue's default).

Scenarios: `quiet` (only these jobs) and `busy` (another user keeps one 1-node job of `--busy-job-s` seconds
pending at all times, so any node that is freed is taken: a requeued or resubmitted job waits for two nodes).

Reported per variant: goodput = productive node-seconds (the steps the final model is made of, on the training's
nodes) over allocated node-seconds (every run of every job, spare nodes included; queue waits are not allocated), by
the goodput ledger (watching/ledger.py) over sacct's runs; the wall time from the first submission to the final
model beside it; the ledger's categories in node-seconds; every run of every SLURM job with its state, exit code and
reason (sacct); per fault: the step at the fault, the step resumed from, the steps lost (the last step logged before
the resume minus the step resumed from; every step is logged), the time from the fault to the first step logged after
the resume, and that time cut at the records and sacct's runs: held (the fault to the end of the run it hit, or to
the relaunch inside it), queue (to the next run's start: not allocated), startup and restore (the resume's
restore_s) and lost (the steps computed again, at the variant's median step time); for the signal, when SLURM was due
to send it (the cut limit's end less the lead) and when the training got it (train.py's `signal` event). Load
averages at the start and the end and sampled through the run.

    python benchmarks/goodput.py [--scenarios quiet busy] [--steps 600] [--out benchmarks/results-goodput.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from string import Template
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from snakemake_executor_multinode.sandbox import cluster  # noqa: E402
from snakemake_executor_multinode.sandbox.spec import ClusterSpec  # noqa: E402
from snakemake_executor_multinode.slurm.formats import clock_to_seconds, epoch  # noqa: E402
from snakemake_executor_multinode.watching.ledger import RunSpan, ledger  # noqa: E402

TRAIN = REPO / "workflows" / "scripts" / "train.py"
PREPROCESS = REPO / "workflows" / "scripts" / "preprocess.py"
FAULTS = ("node_death", "hang", "crash", "admin_requeue", "time_limit_signal")
AT = (0.12, 0.28, 0.44, 0.6, 0.72)  # each fault once the training has logged this share of its steps
NODES, RANKS, CPUS = 2, 2, 2  # per job: nodes, ranks per node, CPUs per node (a node's all)
SIGNAL_LEAD_S = 120
POLL_S = 0.5

# shared/seed-blog.md's train.sh, with this machine's paths; its NCCL block does not apply to gloo on CPU.
RECIPE = Template("""#!/bin/bash
#SBATCH --job-name=$name
#SBATCH --nodes=$nodes
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=$cpus
#SBATCH --gres=gpu:$ranks
#SBATCH --time=$minutes
#SBATCH --open-mode=append
#SBATCH --signal=USR2@$lead

export OMP_NUM_THREADS=1

NODELIST=$$(scontrol show hostname $$SLURM_JOB_NODELIST)
MASTER_ADDR=$$(echo "$$NODELIST" | head -n 1)
LAST_NODE=$$(echo "$$NODELIST" | tail -n 1)
NODE_NUM=$$(echo "$$NODELIST" | wc -l)
NODE_COUNT=0
echo "NODE_NUM=$$NODE_NUM MASTER_ADDR=$$MASTER_ADDR"

for NODE in $$NODELIST; do
    echo "Launching on $$NODE, node_rank=$$NODE_COUNT"
    if [ "$$NODE" = "$$LAST_NODE" ]; then
        srun --nodes=1 --ntasks=1 -w $$NODE $torchrun --nproc_per_node=$ranks --nnodes=$$NODE_NUM \\
            --node_rank=$$NODE_COUNT --master_addr=$$MASTER_ADDR --master_port=34567 $train
    else
        srun --nodes=1 --ntasks=1 -w $$NODE $torchrun --nproc_per_node=$ranks --nnodes=$$NODE_NUM \\
            --node_rank=$$NODE_COUNT --master_addr=$$MASTER_ADDR --master_port=34567 $train &
    fi
    ((NODE_COUNT++))
done
""")

# What a competent team adds to the recipe: SLURM starts every rank in one step (--kill-on-bad-exit: a rank that
# exits with an error ends the others), the pre-time-limit signal comes to the batch shell (B:), whose trap passes it
# on to the training (srun forwards it to every rank), and the training's collectives time out (collective_timeout_s).
COMPETENT = Template("""#!/bin/bash
#SBATCH --job-name=$name
#SBATCH --nodes=$nodes
#SBATCH --ntasks-per-node=$ranks
#SBATCH --cpus-per-task=1
#SBATCH --gres=gpu:$ranks
#SBATCH --time=$minutes
#SBATCH --open-mode=append
#SBATCH --signal=B:USR2@$lead

export OMP_NUM_THREADS=1
export MASTER_ADDR=$$(scontrol show hostname $$SLURM_JOB_NODELIST | head -n 1) MASTER_PORT=34567
trap 'echo "USR2 at $$(date +%s.%N): passed on to the training"; kill -USR2 $$SRUN' USR2
srun --kill-on-bad-exit=1 bash $rank_script &
SRUN=$$!
while true; do
    wait $$SRUN
    rc=$$?
    kill -0 $$SRUN 2>/dev/null || break  # the trap ended the wait: srun still runs
done
exit $$rc
""")

# One rank of the competent recipe: SLURM's task ids as torch's (train.py reads them as under torchrun).
RANK_SCRIPT = Template("""#!/bin/bash
export RANK=$$SLURM_PROCID LOCAL_RANK=$$SLURM_LOCALID WORLD_SIZE=$$SLURM_NTASKS LOCAL_WORLD_SIZE=$ranks
exec $python $train
""")

SNAKEFILE = Template("""rule train:
    output: "model.pt"
    resources:
        nodes=$nodes, gpus=$ranks, cpus_per_task=$cpus, runtime=$minutes, signal="USR2@$lead",$stall
        spare_nodes=$spares,
    shell: "multinode torchrun $train"
""")


# --- what the training and SLURM say ----------------------------------------------------------------------------------


@dataclass
class Progress:
    """The metrics file read whole (train.py rewrites it when a run resumes: lost lines become "superseded")."""

    lines: list[tuple[int, float]] = field(default_factory=list)  # (step, wall) of step lines, file order
    resumes: list[tuple[int, float]] = field(default_factory=list)  # (step resumed from, wall)
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def step(self) -> int:
        return self.lines[-1][0] if self.lines else 0


def read_progress(path: Path) -> Progress:
    progress = Progress()
    try:
        text = path.read_text()
    except OSError:
        return progress
    for raw in text.splitlines():
        try:
            rec = json.loads(raw)
        except ValueError:
            continue  # a line being written
        if not isinstance(rec, dict) or "wall" not in rec or "step" not in rec:
            continue
        progress.records.append(rec)
        event = rec.get("event")
        if event is None:
            progress.lines.append((int(rec["step"]), float(rec["wall"])))
        elif event == "resume":
            progress.resumes.append((int(rec["step"]), float(rec["wall"])))
    return progress


@dataclass
class FaultResult:
    fault: str
    job: str
    injected_at: float
    step: int  # the last step logged when the fault came
    detail: str = ""
    resumed_from: int | None = None
    first_resumed_step_at: float | None = None
    steps_lost: int | None = None
    time_to_first_resumed_step_s: float | None = None
    # that time cut at sacct's runs and the records (`cut`): allocated but for queue
    held_s: float | None = None  # the fault to the end of the run it hit (or to the relaunch inside it)
    queue_s: float | None = None  # pending until the next run started: not allocated
    startup_s: float | None = None  # that run's start to its resume, less the restore
    restore_s: float | None = None  # the resume's restore_s
    lost_s: float | None = None  # the steps computed again, at the variant's median step time
    signal_due_at: float | None = None  # time_limit_signal: SLURM's EndTime after the cut, less the lead
    signal_received_at: float | None = None  # when the training got it (its `signal` event; None: never)


def settle(fault: FaultResult, progress: Progress, records: list[dict[str, Any]]) -> None:
    """The fault's outcome from the metrics: the first resume after it, the steps computed again, the first step
    logged after that resume. Step lines a resume superseded still carry their step and wall (`records`)."""
    resume = next(((s, w) for s, w in progress.resumes if w > fault.injected_at), None)
    if resume is None:
        return
    step, wall = resume
    before = [int(r["step"]) for r in records if r.get("event") in (None, "superseded") and float(r["wall"]) < wall]
    after = next((w for s, w in progress.lines if w > wall and s > step), None)
    fault.resumed_from = step
    fault.steps_lost = max(max(before, default=step) - step, 0)
    if after is not None:
        fault.first_resumed_step_at = after
        fault.time_to_first_resumed_step_s = round(after - fault.injected_at, 2)


def slurm(spec: ClusterSpec, *argv: str, check: bool = True) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, env=cluster.slurm_env(spec), timeout=60)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()}")
    return proc.stdout


@dataclass
class Job:
    id: str
    state: str
    nodes: list[str]


def jobs_in(spec: ClusterSpec, workdir: Path) -> list[Job]:
    """This variant's jobs in squeue: those whose working directory is its folder."""
    out = slurm(spec, "squeue", "-h", "-o", "%i|%T|%N|%Z", check=False)
    found = []
    for line in out.splitlines():
        jobid, state, nodelist, wd = line.split("|", 3)
        if Path(wd) == workdir:
            nodes = slurm(spec, "scontrol", "show", "hostnames", nodelist).split() if nodelist else []
            found.append(Job(jobid, state, nodes))
    return found


@dataclass
class Run:
    """One run (the first, or a requeue) of a SLURM job as sacct accounted it, with how it ended."""

    job: str
    submit: float | None
    start: float
    end: float
    nodes: int
    state: str
    exit_code: str
    reason: str


def accounted_runs(spec: ClusterSpec, jobs: list[str]) -> list[Run]:
    """Every run (requeues too) of these jobs as sacct accounted it, oldest first."""
    fields = "JobIDRaw,Submit,Start,End,NNodes,State,ExitCode,Reason"
    out = slurm(spec, "sacct", "-X", "-D", "-n", "-P", "-j", ",".join(jobs), "-o", fields)
    runs = []
    for line in out.splitlines():
        job, submit, start, end, nodes, state, code, why = line.split("|")
        s, e = epoch(start), epoch(end)
        if s is not None and e is not None:
            runs.append(Run(job, epoch(submit), s, e, int(nodes), state, code, why))
    return sorted(runs, key=lambda r: r.start)


def cut(fault: FaultResult, runs: list[Run], resume: dict[str, Any] | None, step_s: float) -> None:
    """The fault's time to the first resumed step, cut at sacct's runs and the resume event (FaultResult)."""
    if resume is None or fault.steps_lost is None:
        return
    restore = float(resume.get("restore_s") or 0.0)
    started = float(resume["wall"]) - restore  # the resume's load began
    hit = next((r for r in runs if r.start <= fault.injected_at <= r.end), None)
    fault.restore_s, fault.lost_s = round(restore, 2), round(fault.steps_lost * step_s, 2)
    if hit is None or hit.end >= started:  # resumed inside the run it hit: a relaunch (a spare's), all held
        fault.held_s, fault.queue_s, fault.startup_s = round(started - fault.injected_at, 2), 0.0, 0.0
        return
    after = next((r for r in runs if r.start >= hit.end and r.start <= started), None)
    fault.held_s = round(hit.end - fault.injected_at, 2)
    fault.queue_s = round((after.start if after else started) - hit.end, 2)
    fault.startup_s = round(started - after.start, 2) if after else 0.0


# --- faults, by pid ---------------------------------------------------------------------------------------------------


def node_index(spec: ClusterSpec, name: str) -> int:
    return next(i for i in spec.node_indices if spec.node_name(i) == name)


def netns_pids(spec: ClusterSpec, i: int) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", spec.netns(i)], capture_output=True, text=True, check=True).stdout
    return [int(p) for p in out.split()]


def kill_node(spec: ClusterSpec, name: str) -> str:
    i = node_index(spec, name)
    slurmd = int((spec.dir / "run" / f"slurmd-{name}.pid").read_text().split()[0])
    if Path(f"/proc/{slurmd}/comm").read_text().strip() != "slurmd":
        raise RuntimeError(f"the pid file of {name} names no slurmd")
    victims = [slurmd, *(p for p in netns_pids(spec, i) if p != slurmd)]
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return f"{name}: {len(victims)} processes"


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


def ranks_on(spec: ClusterSpec, name: str) -> list[tuple[int, int]]:
    """(global rank, pid) of the training workers on the node: its environment has RANK and LOCAL_RANK."""
    workers = []
    for pid in netns_pids(spec, node_index(spec, name)):
        env = environ(pid)
        if "LOCAL_RANK" in env and env.get("RANK", "").isdigit():
            workers.append((int(env["RANK"]), pid))
    return workers


def signal_a_rank(spec: ClusterSpec, name: str, sig: signal.Signals) -> str | None:
    """`sig` to the highest global rank on the node: SIGSTOP a hang, SIGKILL a crash."""
    workers = ranks_on(spec, name)
    if not workers:
        return None
    rank, pid = max(workers)
    os.kill(pid, sig)
    return f"rank {rank} (pid {pid}) on {name}"


def cut_time_limit(spec: ClusterSpec, job: str) -> tuple[str, float | None]:
    """The job's limit cut so that SLURM's signal comes in 125-185 s; and when it is due (its new EndTime less the
    lead; None where squeue cannot say)."""
    used = clock_to_seconds(slurm(spec, "squeue", "-h", "-j", job, "-o", "%M").strip()) or 0
    minutes = math.ceil((used + SIGNAL_LEAD_S + 5) / 60)
    slurm(spec, "scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}")
    end = epoch(slurm(spec, "squeue", "-h", "-j", job, "-o", "%e", check=False).strip())
    return f"after {used} s: limit {minutes} min", None if end is None else end - SIGNAL_LEAD_S


# --- one variant through the schedule ---------------------------------------------------------------------------------


@dataclass
class VariantResult:
    scenario: str
    variant: str
    steps: int
    submitted_at: float
    nodes: int = NODES  # the training's nodes
    allocated_nodes: int = NODES  # per job: the training's and the spares
    final_output_at: float | None = None
    wall_s: float | None = None  # the first submission to the final model
    goodput: float | None = None  # productive node-seconds / allocated node-seconds
    productive_node_s: float | None = None
    allocated_node_s: float | None = None
    ledger_node_s: dict[str, float] = field(default_factory=dict)
    run_ledger_s: list[dict[str, float]] = field(default_factory=list)  # each run's categories, seconds per node
    step_s: float | None = None  # the median step time of its step lines
    checkpoints: int = 0  # saves that ended (checkpoint_end)
    runs: list[Run] = field(default_factory=list)  # every run of every job: how it ended
    jobs: list[str] = field(default_factory=list)
    resubmissions: int = 0
    faults: list[FaultResult] = field(default_factory=list)
    error: str | None = None


class Variant(threading.Thread):
    spares = 0  # nodes allocated beyond the training's
    faults = FAULTS  # the schedule it meets
    training: dict[str, Any] = {}  # train.py config keys of its own

    def __init__(self, spec: ClusterSpec, scenario: str, name: str, root: Path, data: Path, args: argparse.Namespace):
        super().__init__(name=f"{scenario}-{name}", daemon=True)
        self.spec, self.args = spec, args
        self.wd = root / scenario / name
        shutil.rmtree(self.wd, ignore_errors=True)
        self.wd.mkdir(parents=True)
        self.metrics, self.model = self.wd / "metrics.jsonl", self.wd / "model.pt"
        cfg = {"steps": args.steps, "ckpt_every": args.ckpt_every, "log_every": 1, "keep_ckpts": 2, **self.training}
        self.train = " ".join(shlex.quote(w) for w in [
            str(TRAIN), "--data-dir", str(data), "--out", str(self.model), "--ckpt-dir", str(self.wd / "ckpt"),
            "--metrics", str(self.metrics), "--config-json", json.dumps(cfg),
        ])  # fmt: skip
        self.result = VariantResult(scenario, name, args.steps, 0.0, allocated_nodes=NODES + self.spares)
        self.seen: set[str] = set()
        self.helpers: list[threading.Thread] = []

    # the variants differ in how they start and what happens after a job ends
    def submit(self) -> None:
        raise NotImplementedError

    def tick(self, jobs: list[Job]) -> bool:
        """One poll's own work; True once the variant has ended."""
        raise NotImplementedError

    def run(self) -> None:
        try:
            self._run()
        except Exception as e:  # noqa: BLE001  (a benchmark reports, it does not crash its neighbours)
            self.result.error = f"{type(e).__name__}: {e}"

    def _run(self) -> None:
        r = self.result
        r.submitted_at = time.time()
        self.submit()
        deadline = time.monotonic() + self.args.deadline_s
        pending = [(f, at) for f, at in zip(FAULTS, AT, strict=True) if f in self.faults]
        while time.monotonic() < deadline:
            jobs = jobs_in(self.spec, self.wd)
            self.seen.update(j.id for j in jobs)
            progress = read_progress(self.metrics)
            for f in r.faults:
                if f.first_resumed_step_at is None:
                    settle(f, progress, progress.records)
            running = [j for j in jobs if j.state == "RUNNING" and len(j.nodes) >= NODES]
            recovered = all(f.first_resumed_step_at is not None for f in r.faults)
            if pending and recovered and running and progress.step >= pending[0][1] * self.args.steps:
                if self.inject(pending[0][0], running[0], progress):
                    pending.pop(0)
            if self.tick(jobs):
                break
            time.sleep(POLL_S)
        else:
            r.error = f"not done within {self.args.deadline_s} s"
        for h in self.helpers:
            h.join(timeout=600)
        self.account()

    def inject(self, fault: str, job: Job, progress: Progress) -> bool:
        now = time.time()
        # the second training node: a spare holds no rank, and the head runs the job script (its death ends the job)
        target = next((n for n in reversed(job.nodes[1:]) if ranks_on(self.spec, n)), None)
        if target is None and fault in ("node_death", "hang", "crash"):
            return False  # the ranks are not up yet: the next poll
        due = None
        if fault == "node_death":
            detail = kill_node(self.spec, target)
            self.helpers.append(threading.Thread(target=self.restore_when_down, args=(target,), daemon=True))
            self.helpers[-1].start()
        elif fault in ("hang", "crash"):
            found = signal_a_rank(self.spec, target, signal.SIGSTOP if fault == "hang" else signal.SIGKILL)
            if found is None:
                return False  # workers not up yet on that node: the next poll
            detail = found
        elif fault == "admin_requeue":
            detail = slurm(self.spec, "scontrol", "requeue", job.id) or "requeued"
        else:
            detail, due = cut_time_limit(self.spec, job.id)
            self.helpers.append(threading.Thread(target=self.give_limit_back, args=(job.id,), daemon=True))
            self.helpers[-1].start()
        self.result.faults.append(FaultResult(fault, job.id, now, progress.step, detail.strip(), signal_due_at=due))
        print(f"[{self.name}] {fault} at step {progress.step}: {detail.strip()}", flush=True)
        return True

    def restore_when_down(self, node: str) -> None:
        """The dead node comes back once SLURM has noticed (DOWN after SlurmdTimeout): a repaired node."""
        while "down" not in slurm(self.spec, "sinfo", "-h", "-n", node, "-o", "%T", check=False):
            time.sleep(2)
        cluster.restart_node(self.spec, node_index(self.spec, node))

    def give_limit_back(self, job: str) -> None:
        """Once the cut run has ended: a requeued (pending) job gets the rule's time limit back. (A run that ends
        passes through COMPLETING: a requeued job is pending only after it; else it kept the cut limit and met the
        signal again in every later run.)"""
        while True:
            state = slurm(self.spec, "squeue", "-h", "-j", job, "-o", "%T", check=False).strip()
            if state not in ("RUNNING", "COMPLETING"):
                break
            time.sleep(1)
        if state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING"):
            slurm(self.spec, "scontrol", "update", f"JobId={job}", f"TimeLimit={self.args.limit_min}", check=False)

    def account(self) -> None:
        r = self.result
        r.jobs = sorted(self.seen, key=int)
        r.resubmissions = len(r.jobs) - 1  # the recipe's user or Snakemake's retries (a requeue keeps its job id)
        if self.model.exists():
            r.final_output_at = self.model.stat().st_mtime
            r.wall_s = round(r.final_output_at - r.submitted_at, 2)
        if not r.jobs:
            return
        r.runs = accounted_runs(self.spec, r.jobs)
        stopped = [f.injected_at for f in r.faults if f.fault in ("hang", "node_death")]
        # a run a hang or a dead node stopped: its time from the last step to its end is stalled, not teardown (the
        # ledger of `multinode report` knows only the watchdog's stalls)
        spans = [RunSpan(x.start, x.end, x.nodes, RANKS, x.submit, any(x.start <= t <= x.end for t in stopped))
                 for x in r.runs]  # fmt: skip
        # every run trains on NODES nodes: the rest of its allocation (spare_nodes) is the ledger's spare category
        trains = [{"event": "start", "restart": i, "train_nodes": NODES} for i in range(len(spans))]
        progress = read_progress(self.metrics)
        book = ledger(spans, trains, progress.records)
        r.ledger_node_s = {k: round(v, 2) for k, v in book.node_seconds.items()}
        r.run_ledger_s = [{k: round(v, 2) for k, v in run.seconds.items()} for run in book.runs]
        r.productive_node_s = round(book.node_seconds["productive"], 2)
        r.allocated_node_s = round(book.allocated_node_s, 2)
        r.goodput = None if book.goodput is None or r.wall_s is None else round(book.goodput, 4)
        r.checkpoints = sum(1 for x in progress.records if x.get("event") == "checkpoint_end")
        step_ms = [x["step_ms"] for x in progress.records if "event" not in x and "step_ms" in x]
        r.step_s = round(statistics.median(step_ms) / 1000, 4) if step_ms else None
        signals = [x for x in progress.records if x.get("event") == "signal"]
        for f in r.faults:
            resume = next((x for x in progress.records if x.get("event") == "resume" and x["wall"] > f.injected_at),
                          None)  # fmt: skip
            cut(f, r.runs, resume, r.step_s or 0.0)
            if f.fault == "time_limit_signal":
                got = next((x for x in signals if x["wall"] > f.injected_at), None)
                f.signal_received_at = None if got is None else got.get("received")


class Recipe(Variant):
    def submit(self) -> None:
        script = self.wd / "train.sh"
        if not script.exists():
            script.write_text(self.script())
        out = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, cwd=self.wd,
                             env=cluster.slurm_env(self.spec), check=True)  # fmt: skip
        self.seen.add(out.stdout.strip().split(";")[0])

    def script(self) -> str:
        torchrun = f"{shlex.quote(sys.executable)} -m torch.distributed.run"
        return RECIPE.substitute(
            name=f"recipe-{self.result.scenario}", nodes=NODES, cpus=CPUS, ranks=RANKS,
            minutes=self.args.limit_min, lead=SIGNAL_LEAD_S, torchrun=torchrun, train=self.train,
        )  # fmt: skip

    def tick(self, jobs: list[Job]) -> bool:
        if jobs:
            return False
        if self.model.exists():
            return True
        self.submit()  # the user: resubmits the moment the job is gone without the model
        return False


class Competent(Recipe):
    """The recipe with what a competent team adds (module docstring)."""

    @property
    def training(self) -> dict[str, Any]:  # type: ignore[override]
        return {"collective_timeout_s": self.args.pg_timeout_s}

    def script(self) -> str:
        rank_script = self.wd / "rank.sh"
        rank_script.write_text(RANK_SCRIPT.substitute(ranks=RANKS, python=shlex.quote(sys.executable),
                                                      train=self.train))  # fmt: skip
        return COMPETENT.substitute(
            name=f"competent-{self.result.scenario}", nodes=NODES, ranks=RANKS, minutes=self.args.limit_min,
            lead=SIGNAL_LEAD_S, rank_script=shlex.quote(str(rank_script)),
        )  # fmt: skip


class Multinode(Variant):
    def submit(self) -> None:
        a = self.args
        stall = "".join(f' {key}="{value}",' for key, value in (("stall_timeout", a.stall_timeout),
                                                                 ("on_stall", a.on_stall)) if value)  # fmt: skip
        (self.wd / "Snakefile").write_text(SNAKEFILE.substitute(
            nodes=NODES, ranks=RANKS, cpus=CPUS, minutes=a.limit_min, lead=SIGNAL_LEAD_S, spares=self.spares,
            stall=stall,
            train=self.train.replace("\\", "\\\\").replace('"', '\\"').replace("{", "{{").replace("}", "}}"),
        ))  # fmt: skip
        cmd = [sys.executable, "-m", "snakemake", "--executor", "multinode", "--jobs", "1", "--retries", "3",
               "--latency-wait", "10"]  # fmt: skip
        self.log = (self.wd / "snakemake.log").open("w")
        self.proc = subprocess.Popen(cmd, cwd=self.wd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=cluster.slurm_env(self.spec))  # fmt: skip

    def tick(self, jobs: list[Job]) -> bool:
        code = self.proc.poll()
        if code is None:
            return False
        if code != 0:
            self.result.error = f"snakemake exited {code}; see {self.wd / 'snakemake.log'}"
        return True


class Baseline(Multinode):
    faults = ()  # the fault-free run: the ceiling of the same setup


class Spares(Multinode):
    spares = 1  # issue 37: a dead, failing or stalled node is replaced inside the allocation


VARIANTS = {"baseline": Baseline, "recipe": Recipe, "competent": Competent, "multinode": Multinode, "spares": Spares}


# --- the busy cluster's other user ----------------------------------------------------------------------------------


class OtherUser(threading.Thread):
    """Keeps one 1-node job pending at all times: any node that is freed is taken for `seconds`."""

    def __init__(self, spec: ClusterSpec, workdir: Path, seconds: int) -> None:
        super().__init__(name="other-user", daemon=True)
        self.spec, self.wd, self.seconds = spec, workdir, seconds
        self.stopped = threading.Event()
        self.submitted = 0
        workdir.mkdir(parents=True, exist_ok=True)

    def run(self) -> None:
        while not self.stopped.is_set():
            if not any(j.state == "PENDING" for j in jobs_in(self.spec, self.wd)):
                slurm(self.spec, "sbatch", "-N1", "-n1", f"-c{CPUS}", "-t", "10", "-o", "/dev/null", "-D", str(self.wd),
                      "--wrap", f"sleep {self.seconds}")  # fmt: skip
                self.submitted += 1
            self.stopped.wait(POLL_S)

    def stop(self) -> None:
        self.stopped.set()
        self.join()
        for job in jobs_in(self.spec, self.wd):
            slurm(self.spec, "scancel", job.id, check=False)


# --- the run --------------------------------------------------------------------------------------------------------


def bring_up(directory: Path, nodes: int) -> ClusterSpec:
    cmd = [sys.executable, "-m", "snakemake_executor_multinode.cli", "cluster", "up", "--dir", str(directory),
           "--nodes", str(nodes), "--cpus", str(CPUS), "--gpus", str(RANKS)]  # fmt: skip
    subprocess.run(cmd, check=True)
    spec = ClusterSpec.load(directory)
    assert spec is not None
    return spec


def git_commit() -> str | None:
    git = ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]
    return subprocess.run(git, capture_output=True, text=True).stdout.strip() or None


def loads() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class LoadSampler(threading.Thread):
    """The 1-minute load average every `every` seconds while the run lasts (the machine is shared)."""

    def __init__(self, every: float = 30.0) -> None:
        super().__init__(name="load", daemon=True)
        self.every, self.samples = every, [loads()[0]]
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            self.samples.append(loads()[0])

    def summary(self) -> dict[str, Any]:
        self.stopped.set()
        return {"every_s": self.every, "mean": round(statistics.fmean(self.samples), 2),
                "max": round(max(self.samples), 2), "samples": len(self.samples)}  # fmt: skip


def scenario_run(name: str, spec: ClusterSpec, root: Path, data: Path, args: argparse.Namespace) -> dict[str, Any]:
    variants = [VARIANTS[v](spec, name, v, root, data, args) for v in args.variants]
    other = OtherUser(spec, root / name / "other-user", args.busy_job_s) if name == "busy" else None
    for v in variants:
        v.start()
    if other is not None:  # from the moment every variant runs: it takes what is freed after
        while not all(read_progress(v.metrics).lines for v in variants) and any(v.is_alive() for v in variants):
            time.sleep(POLL_S)
        other.start()
    for v in variants:
        v.join()
    if other is not None:
        other.stop()
    out: dict[str, Any] = {"variants": [asdict(v.result) for v in variants]}
    if other is not None:
        out["other_user"] = {"job_s": args.busy_job_s, "jobs": other.submitted}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenarios", nargs="+", default=["quiet", "busy"], choices=["quiet", "busy"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--steps", type=int, default=600, help="training steps")
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--limit-min", type=int, default=15, help="every job's time limit in minutes (the recipe's guard)")
    ap.add_argument("--busy-job-s", type=int, default=120, help="the busy cluster's other user's job length")
    ap.add_argument("--deadline-s", type=int, default=5400, help="a variant not done by then is reported unfinished")
    ap.add_argument("--pg-timeout-s", type=float, default=60.0, help="the competent recipe's collective timeout")
    ap.add_argument("--stall-timeout", default=None, help="multinode's stall_timeout (none: the plugin's default)")
    ap.add_argument("--on-stall", default=None, help="multinode's on_stall (none: the plugin's default)")
    ap.add_argument("--root", type=Path, default=Path("/var/tmp/mn-goodput"))
    ap.add_argument("--keep", action="store_true", help="leave the clusters up")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results-goodput.json")
    args = ap.parse_args(argv)
    args.root.mkdir(parents=True, exist_ok=True)
    data = args.root / "data"
    if not (data / "train.bin").exists():
        subprocess.run([sys.executable, str(PREPROCESS), "--out-dir", str(data), "--num-docs", "2000"], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
    # every variant's nodes at once, and two more: a resubmitted job finds nodes while a dead one is still down
    nodes = sum(NODES + VARIANTS[v].spares for v in args.variants) + 2 + (1 if "busy" in args.scenarios else 0)
    specs = {s: bring_up(args.root / f"cluster-{s}", nodes) for s in args.scenarios}
    sampler = LoadSampler()
    sampler.start()
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "commit": git_commit(),
        "config": {k: v for k, v in vars(args).items() if k not in ("root", "out", "keep")},
        "schedule": dict(zip(FAULTS, AT, strict=True)),
        "load_before": loads(),
        "cpus": os.cpu_count(),
        "slurm": {s: spec.slurm for s, spec in specs.items()},
    }
    found: dict[str, Any] = {}
    threads = [threading.Thread(target=lambda s=s: found.__setitem__(s, scenario_run(s, specs[s], args.root, data,
                                                                                       args)))
               for s in args.scenarios]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result["load_after"] = loads()
    result["load_during"] = sampler.summary()
    result["nodes"] = nodes
    result["scenarios"] = found
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for s, sc in found.items():
        for v in sc["variants"]:
            print(f"{s:6} {v['variant']:10} goodput {v['goodput']} wall {v['wall_s']} s productive "
                  f"{v['productive_node_s']} node-s of {v['allocated_node_s']} runs {len(v['runs'])} error "
                  f"{v['error']}")  # fmt: skip
            for f in v["faults"]:
                print(f"    {f['fault']:18} step {f['step']:4} resumed {f['resumed_from']} lost {f['steps_lost']}"
                      f" first resumed step after {f['time_to_first_resumed_step_s']} s")  # fmt: skip
    if not args.keep:
        for spec in specs.values():
            cluster.down(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
