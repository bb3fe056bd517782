"""The matrix of features and faults on the real local SLURM cluster (issue 53, part 4).

Every case of tests/fault_matrix.py (an all-pairs set over eight features and seven faults, 14 cases) runs a tiny
2-node gloo training (tests/helpers.CONTRACT_TRAINING: checkpoints every 10 steps, SIGUSR2 -> checkpoint + preempt
file, resume, a metrics line per step) through `snakemake --executor multinode`, injects its fault by pid once step
12 is logged (two steps after a checkpoint, so a fault that loses work loses some), lets the training finish once
it has shown it got past the fault (a `release` file), and holds every case to the same invariants:

1. it ends as the documentation says (fault_matrix.expected): Snakemake's exit code, the SLURM jobs, requeued or
   not, replaced or not, restarted in the job or not, the retry leaving the node out or not;
2. the steps computed again are at most those since the last checkpoint: every launch resumes from the newest
   checkpoint written before it, and the final step lines are 1..N once each;
3. one MULTINODE_RUN_ID across every run, launch and retry (and every W&B offline folder of a tracked case);
4. `multinode report`'s ledger adds up to sacct's allocation within 2% for every job, and its productive
   node-seconds match the training's own clock (its step times x its nodes) within 10%;
5. `multinode status` names what happened.

The cases run side by side on the suite's 5-node cluster (a thread pool; no xdist here). A node's death kills every
process on that node, so the two node-death cases run after the others, their jobs `--exclusive`. Cost, not truth,
sets the knobs that are not the matrix's: straggler_window 10s (30m where no straggler is made, so a loaded machine
cannot name one), stall_timeout 30s where a rank hangs or a node dies (a gloo rank may hang on its lost peer instead
of failing; the default would hold it 30 minutes), the watch cycle 1 s and SLURM's sweep 3 s.

MULTINODE_MATRIX_CASES=case03,case07 runs those cases only; MULTINODE_MATRIX_RESULT=<path> writes the result file
there (benchmarks/results-matrix.json is rendered into docs/evidence.md by benchmarks/render.py).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import signal
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from snakemake_executor_multinode.contract import node_events
from snakemake_executor_multinode.contract.jobfiles import JobFiles, StateFolders
from snakemake_executor_multinode.sandbox import cluster
from snakemake_executor_multinode.watching.ledger import CATEGORIES
from tests import fault_matrix as fm
from tests.helpers import (
    CONTRACT_TRAINING,
    FAILING_CHECK,
    REPO,
    Cluster,
    Slowdown,
    Snakemake,
    complete_lines,
    kill_node,
    multinode,
    node_index,
    rank_pids,
    records,
    sacct_jobs,
    sacct_runs,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.one_release]

STEP_S, CKPT_EVERY = 0.1, 10
FAULT_AT = 12  # the fault comes once this step is logged: 2 steps after the checkpoint of step 10
AFTER = 3  # steps a launch after the fault logs before the test releases the training
HANG_GUARD_S = 900.0  # only against a hang: no verdict depends on it

TRACKED = (
    "MATRIX_TRACKERS=1 WANDB_MODE=offline WANDB_DIR={wd} WANDB_SILENT=true MLFLOW_TRACKING_URI=file://{wd}/mlruns "
    "MLFLOW_ALLOW_FILE_STORE=true "
)


def workflow(case: fm.Case, wd: Path) -> list[str]:
    """The case's workflow folder; Snakemake's arguments for it."""
    wd.mkdir(parents=True)
    (wd / "train.py").write_text(CONTRACT_TRAINING)
    resources = [
        "nodes=2", "gpus=1", "cpus_per_task=1", "mem_mb=1000", "runtime=30", f"spare_nodes={case.spare_nodes}",
        f"on_straggler={case.on_straggler!r}", f"on_stall={case.on_stall!r}", f"max_restarts={case.max_restarts}",
        "straggler_factor=2",
        f"straggler_window={'10s' if case.event == fm.STRAGGLER else '30m'!r}",
    ]  # fmt: skip
    if case.event in (fm.HUNG_RANK, fm.NODE_DEATH):
        resources.append('stall_timeout="30s"')
    if case.event == fm.NODE_DEATH:
        resources.append('slurm_extra="--exclusive"')  # the node's death must kill no other case's job
    args = ["--retries", str(case.retries), "--multinode-max-requeues", str(case.max_requeues)]
    args += ["--multinode-status-seconds", "1", "--multinode-sweep-seconds", "3"]
    if case.node_check == fm.FAILING_CHECK:
        resources.append('env_profile="checked"')
        (wd / "profiles.yaml").write_text(
            "profiles:\n  checked:\n    node_check:\n"
            f"      command: {json.dumps(FAILING_CHECK.format(mark=wd / 'bad-node.txt'))}\n      timeout: 60\n"
        )
        args += ["--multinode-profile-file", "profiles.yaml"]
    tracked = TRACKED.format(wd=wd) if case.trackers == "on" else ""
    (wd / "Snakefile").write_text(
        'rule train:\n    output: "out.txt"\n'
        f"    resources: {', '.join(resources)}\n"
        f'    shell: "{tracked}multinode torchrun train.py {{output}} {STEP_S} {CKPT_EVERY}"\n'
    )
    return args


def launches(wd: Path) -> list[dict[str, Any]]:
    """Every rank's start of every launch, in order (the training's launches.jsonl)."""
    return complete_lines(wd / "launches.jsonl")


def metrics(wd: Path) -> list[dict[str, Any]]:
    return complete_lines(wd / "metrics.jsonl")


def step_lines(recs: list[dict[str, Any]], since: float = 0.0) -> list[dict[str, Any]]:
    return [r for r in recs if "event" not in r and r["wall"] > since]


def nodes_of_launch(wd: Path, job: str) -> tuple[str, str]:
    """The head and the other node of the job's latest launch (ranks 0 and 1)."""
    mine = [x for x in launches(wd) if x["job"] == job]
    last = max(x["restart"] * 1000 + x["relaunch"] for x in mine)
    hosts = {x["rank"]: x["host"] for x in mine if x["restart"] * 1000 + x["relaunch"] == last}
    return hosts[0], hosts[1]


class Fault:
    """The case's fault, injected by pid; `undo` leaves nothing stopped and brings a killed node back."""

    def __init__(self, cl: Cluster, case: fm.Case, wd: Path, job: str, joblog: Path) -> None:
        self.cl, self.case, self.wd, self.job, self.joblog = cl, case, wd, job, joblog
        self.stopped: int | None = None
        self.slow: Slowdown | None = None
        self.dead: str | None = None
        self.refused = ""  # what SLURM said when it refused the fault (an admin's requeue)
        self.node = ""  # the node it hit: the non-head training node

    def inject(self) -> float:
        """The fault, now; returns when it was done (epoch seconds): what the training logs after it, it logged
        past the fault."""
        _, other = nodes_of_launch(self.wd, self.job)
        self.node, event = other, self.case.event
        if event == fm.TIME_LIMIT:  # what --signal=USR2@T sends: every step's processes
            self.cl.run("scancel", "--signal=USR2", self.job)
        elif event == fm.ADMIN_REQUEUE:
            done = self.cl.run("scontrol", "requeue", self.job, check=False)
            self.refused = "" if done.returncode == 0 else (done.stderr or done.stdout).strip()
        elif event == fm.NODE_DEATH:
            self.dead = other
            kill_node(self.cl, other)
        else:
            pid = rank_pids(self.cl, other, self.job)[1]
            if event == fm.HUNG_RANK:
                os.kill(pid, signal.SIGSTOP)
                self.stopped = pid
            elif event == fm.CRASHED_RANK:
                os.kill(pid, signal.SIGKILL)
            elif event == fm.STRAGGLER:
                self.slow = Slowdown(pid)
                named = wait_for(lambda: straggler_named(self.joblog), "the straggler named", 300)
                self.slow.end()
                return named
        return time.time()

    def undo(self) -> None:
        if self.slow is not None:
            self.slow.end()
        if self.stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.stopped, signal.SIGCONT)
        if self.dead is not None:
            cluster.restart_node(self.cl.spec, node_index(self.cl, self.dead))
            self.dead = None


def straggler_named(joblog: Path) -> float | None:
    return time.time() if "straggler: node" in joblog.read_text() else None


def run_case(cl: Cluster, case: fm.Case, root: Path, holding: threading.Event | None = None) -> dict[str, Any]:
    """One case, from its submission to its checks; its row of the result file, with when (seconds from its start)
    its job was submitted, the fault came, the training was past it, Snakemake ended and the checks were done.
    `holding` is set once the job holds its nodes (its training logged a step), or the case ended."""
    wd = root / case.name / "wf"
    args = workflow(case, wd)
    began = time.monotonic()
    timeline: dict[str, float] = {}

    def mark(what: str) -> None:
        timeline[what] = round(time.monotonic() - began, 1)

    start_wall = time.time()
    sm = Snakemake(wd, *args)
    fault: Fault | None = None
    try:
        job, joblog = sm.submitted("train", timeout=600)
        mark("submitted")
        if holding is not None:
            wait_for(lambda: step_lines(metrics(wd)), "the training's first step", HANG_GUARD_S, sm.proc)
            holding.set()
        fault_wall = start_wall
        if case.event != fm.CHECK_FAILS:  # the failing check needs nothing: it fails the node at the start
            wait_for(lambda: any(r["step"] >= FAULT_AT for r in step_lines(metrics(wd))), f"step {FAULT_AT}",
                     HANG_GUARD_S, sm.proc)  # fmt: skip
            fault = Fault(cl, case, wd, job, joblog)
            fault_wall = fault.inject()
            mark("fault")

        def past_the_fault() -> bool:
            """Snakemake ended, or a launch after the fault logged AFTER steps (or, where the fault starts none,
            the training went on for 5 steps after it)."""
            if not sm.alive():
                return True
            later = [x["wall"] for x in launches(wd) if x["wall"] > fault_wall and x["rank"] == 0]
            since = max(later) if later else fault_wall
            return len(step_lines(metrics(wd), since)) >= (AFTER if later else 5)

        wait_for(past_the_fault, "the training past the fault", HANG_GUARD_S)
        mark("past")
        (wd / "release").touch()
        rc = sm.wait(HANG_GUARD_S)
        mark("ended")
    finally:
        if holding is not None:
            holding.set()
        (wd / "release").touch()
        sm.stop()
        if fault is not None:
            fault.undo()
    row = check(cl, case, wd, rc, sm, fault)
    mark("checked")
    return {**row, "wall_s": timeline["checked"], "timeline": timeline}


def check(cl: Cluster, case: fm.Case, wd: Path, rc: int, sm: Snakemake, fault: Fault | None) -> dict[str, Any]:
    """The invariants; the case's row. A failed invariant raises naming the case."""
    want = fm.expected(case)
    subs = sorted(records(wd), key=lambda r: r["attempt"])
    jobs = [s["jobid"] for s in subs]
    sacct_jobs(cl, {s["job_name"] for s in subs}, set(jobs))  # once every job's end is accounted
    runs = {j: sacct_runs(cl, j) for j in jobs}
    files = {s["jobid"]: JobFiles.from_log(s["log"]) for s in subs}
    histories = {j: node_events.read(f.replacements) for j, f in files.items()}
    scripts = {s["jobid"]: Path(s["script"]).read_text() for s in subs}
    excluded = any("#SBATCH --exclude=" in scripts[j] for j in jobs[1:])
    # the node the fault hit: the failing check's marker names the one it failed on
    node = fault.node if fault is not None else (wd / "bad-node.txt").read_text().strip()
    said = {j: f.log.read_text() + "".join(p.read_text() for p in f.restart_logs()) for j, f in files.items()}
    got = fm.Outcome(
        rc=rc,
        jobs=len(jobs),
        requeued=any(len(r) > 1 for r in runs.values()),
        replaced=any(h.spare_replaced for h in histories.values()),
        excluded=excluded,
        restarted=any(RESTARTED in text for text in said.values()),
    )
    text = sm.text
    why = f"{case.name} {case.values()}: expected {want.describe()}, got {got.describe()}"
    assert fault is None or not fault.refused, f"{why}; SLURM refused the fault: {fault.refused}"
    assert got == want, f"{why}\n{text[-3000:]}\n" + "\n".join(said.values())[-6000:]
    dropped = [e.node for h in histories.values() for e in h.dropped]
    hit = got.replaced or case.event == fm.CHECK_FAILS  # a node failing its check is dropped, spare or not
    assert dropped == ([node] if hit else []), f"{case.name}: dropped {dropped}, the fault hit {node}"
    if got.excluded:  # the retry leaves out the node the fault hit, not its victim
        assert f"#SBATCH --exclude={node}\n" in scripts[jobs[-1]], f"{case.name}: {node} not left out"

    # (2) nothing computed again beyond the steps since the last checkpoint
    recs = metrics(wd)
    ends = [(r["wall"], r["step"]) for r in recs if r.get("event") == "checkpoint_end"]
    starts = sorted((x for x in launches(wd) if x["rank"] == 0), key=lambda x: x["wall"])
    for launch in starts:
        newest = max((s for w, s in ends if w < launch["wall"]), default=0)
        assert launch["start"] == newest, f"{case.name}: a launch resumed at {launch['start']}, not {newest}: {starts}"
    kept = [r["step"] for r in step_lines(recs)]
    assert kept == list(range(1, len(kept) + 1)), f"{case.name}: step lines {kept}"
    lost = [r["step"] for r in recs if r.get("event") == "superseded"]

    # (3) one experiment
    ids = {x["run_id"] for x in launches(wd)} | {s["tracking_id"] for s in subs}
    assert len(ids) == 1 and all(ids), f"{case.name}: run ids {ids}"
    (run_id,) = ids
    if case.trackers == "on" and starts:  # a case whose training never started opened none
        folders = [p.name for p in (wd / "wandb").glob("offline-run-*")]
        assert folders and all(f.endswith(f"-{run_id}") for f in folders), f"{case.name}: W&B runs {folders}"
        opened = re.findall(r"training: trackers (\S+)", "".join(said.values()))
        assert opened and all(o == "TensorBoard,W&B,MLflow" for o in opened), f"{case.name}: trackers {opened}"

    # (4) the ledger against sacct and the training's own clock
    (run,) = {s["run_id"] for s in subs}
    multinode(wd, "report", "--run", run)
    rows = list(csv.DictReader(io.StringIO((StateFolders(wd).reports / f"{run}.csv").read_text())))
    ledger: dict[str, dict[str, float]] = {}
    productive = 0.0
    for job in jobs:
        (row,) = [r for r in rows if r["scope"] == "job" and r["jobid"] == job]
        node_s = {c: float(row[f"{c}_node_s"] or 0) for c in CATEGORIES}
        allocated = float(sum(r["elapsed"] * r["nodes"] for r in runs[job]))
        assert sum(node_s.values()) == pytest.approx(allocated, rel=0.02), (case.name, job, node_s, allocated)
        productive += node_s["productive"]
        ledger[job] = {"allocated": allocated, **{c: round(v, 2) for c, v in node_s.items() if v}}
    clock = 2 * sum(r["step_ms"] for r in step_lines(recs)) / 1000  # 2 training nodes
    assert productive == pytest.approx(clock, rel=0.10), (case.name, productive, clock, ledger)

    # (5) `multinode status` names what happened
    status = multinode(wd, "status").stdout
    (wd.parent / "status.txt").write_text(status)
    said_lines = []  # the lines of the status that say it, without the job's label
    for words in named(case, got, node):
        assert words in status, f"{case.name}: `multinode status` does not say {words!r}:\n{status}"
        line = next(x for x in status.splitlines() if words in x).strip()
        line = re.sub(r"^train( #\d)? \(job \d+\): ", "", line)
        said_lines += [] if line in said_lines else [line]
    return {
        "case": case.name,
        **case.values(),
        "expected": asdict(want),
        "got": asdict(got),
        "ends": got.describe(),
        "sacct": {j: [r["state"] for r in runs[j]] for j in jobs},
        "lost_steps": len(lost),
        "steps": len(kept),
        "productive_node_s": round(productive, 2),
        "training_clock_node_s": round(clock, 2),
        "ledger": ledger,
        "status_says": said_lines,
    }


# What `multinode status` says of a node the fault hit, by the fault (with a spare: "<node> -> <spare> (<why>)";
# without: the failed run's "failing node <node>")
WHY_REPLACED = {
    fm.NODE_DEATH: "does not answer: the node is down",
    fm.CRASHED_RANK: "exited with",
    fm.CHECK_FAILS: "failed its node check: its command exited with 1",
    fm.STRAGGLER: "straggler: node",
}
RESTARTED = "restarting the training on the same nodes"  # the launcher's line (launching/launcher.py)
SELF_REQUEUED = {
    fm.TIME_LIMIT: "requeued by itself (checkpointed before the time limit)",
    fm.HUNG_RANK: "requeued by itself (stalled: ended by the progress watchdog, on_stall requeue)",
}


def named(case: fm.Case, got: fm.Outcome, node: str) -> list[str]:
    """What `multinode status` must say of the case: what happened, and to which node (`node`: the one the fault
    hit)."""
    words = []
    if got.replaced:
        words.append(f"{node} -> ")
        words.append(WHY_REPLACED[case.event])
    if case.event == fm.STRAGGLER:
        words.append(f"{node} straggler (")
    if case.event == fm.ADMIN_REQUEUE:
        words.append("exit 143, requeued by SLURM")
    elif got.requeued:
        words.append(SELF_REQUEUED[case.event])
    elif case.event == fm.TIME_LIMIT:
        words.append("(checkpointed before the time limit; not requeued: its own requeues are used up")
    elif case.event == fm.HUNG_RANK and not got.restarted:
        words.append("(stalled: ended by the progress watchdog")
    if case.event in WHY_REPLACED and case.event != fm.STRAGGLER and not (got.replaced or got.restarted):
        words.append(f"failing node {node})")
    return words


def selected() -> list[fm.Case]:
    every = fm.cases()
    wanted = [w for w in os.environ.get("MULTINODE_MATRIX_CASES", "").split(",") if w]
    unknown = set(wanted) - {c.name for c in every}
    assert not unknown, f"MULTINODE_MATRIX_CASES names no case: {sorted(unknown)}"
    return [c for c in every if not wanted or c.name in wanted]


def outcome(future: Future) -> dict[str, Any] | BaseException:
    try:
        return future.result()
    except BaseException as err:  # every case runs to its end; all failures are said together
        return err


def test_every_pair_of_features_and_faults_ends_as_the_documentation_says(slurm_cluster, tmp_path):
    chosen = selected()
    load_before = os.getloadavg()
    date = time.strftime("%Y-%m-%d %H:%M")
    began = time.monotonic()
    # A node's death kills whatever runs on that node: those cases' jobs are --exclusive and hold their nodes before
    # any other case submits (the others' Snakemake starts then overlap them); a dead node stays COMPLETING for its
    # job until the case brings it back, so no other job lands there meanwhile.
    deaths = [c for c in chosen if c.event == fm.NODE_DEATH]
    with ThreadPoolExecutor(max_workers=len(chosen)) as pool:
        holding = {c.name: threading.Event() for c in deaths}
        futures = {c.name: pool.submit(run_case, slurm_cluster, c, tmp_path, holding[c.name]) for c in deaths}
        for event in holding.values():
            event.wait(HANG_GUARD_S)
        futures |= {c.name: pool.submit(run_case, slurm_cluster, c, tmp_path) for c in chosen if c not in deaths}
        results = [outcome(futures[c.name]) for c in chosen]
    wall_s = time.monotonic() - began
    failures = [f"{c.name}: {r!r}" for c, r in zip(chosen, results, strict=True) if isinstance(r, BaseException)]
    rows = sorted((r for r in results if isinstance(r, dict)), key=lambda r: r["case"])
    result = {
        "date": date, "wall_s": round(wall_s, 1), "concurrent": len(chosen), "cases_run": len(chosen),
        "cases_passed": len(rows), "load_before": [round(x, 1) for x in load_before],
        "load_after": [round(x, 1) for x in os.getloadavg()], "cases": rows,
    }  # fmt: skip
    (tmp_path / "results-matrix.json").write_text(json.dumps(result, indent=1) + "\n")
    if target := os.environ.get("MULTINODE_MATRIX_RESULT"):
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        result = {"commit": head.stdout.strip(), **result}
        Path(target).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n[figures] matrix: {len(chosen)} cases in {wall_s:.0f} s, side by side", flush=True)
    assert not failures, "\n\n".join(failures)
