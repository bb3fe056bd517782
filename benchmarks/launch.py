"""`multinode torchrun`'s two ways to fan out, side by side in one run on the local cluster.

    multinode cluster up --dir /var/tmp/mn-bench8 --nodes 8 --cpus 2 --gpus 2 --no-accounting
    eval "$(multinode cluster env --dir /var/tmp/mn-bench8)"
    python benchmarks/launch.py [--nodes 2 4 8] [--repeats 3] [--json benchmarks/results-launch.json]
    multinode cluster down --dir /var/tmp/mn-bench8

Launchers, each started from a hand-written batch script exactly as the job script starts it:
  step       `multinode torchrun` (the launcher): ONE `srun --ntasks-per-node=1 --kill-on-bad-exit=1` step,
             node rank from $SLURM_NODEID, failing node read from srun's own report
  per-node   the launcher before this benchmark, kept here only for the comparison (`per-node-torchrun` below):
             one `srun --nodes=1 --nodelist=NODE` per node in parallel, supervised by polling every 0.2 s, the
             others stopped with SIGTERM (10 s grace, then srun's double SIGINT) when one fails
Both build the torchrun command with the launcher's one builder (`launch.torchrun_command`), so they differ only in
the fan-out and in failure handling. Neither imports torch to read its options (the launcher used to: measured
separately, "split_flags").

Scenarios (benchmarks/launch_worker.py): `ok`, every rank imports torch and returns from init_process_group;
`fail`, the last node's rank 0 dies once every other rank is blocked in a wait that never notices (a NCCL-like hang);
`fail-term`, the same with the blocked ranks handling SIGTERM and staying blocked: only SIGKILL ends them.
Measured per job, from timestamps taken on the nodes (one machine: one clock), from the job script's start:
  launcher   the launcher process started
  first/last torchrun   the first and the last node's torchrun started (the step task's fork, which `exec` keeps;
             benchmarks/launch_probe): the last one is the fan-out, what the launcher costs
  workers    the last worker process started (each agent imported torch first)
  launch     the last rank past init_process_group (every process imported torch: on a 2-core machine this is
             CPU contention, (1 + nproc) x nodes imports sharing 2 cores)
  detect     (fail) the dying rank's exit -> the launcher returned and the job script ended (Snakemake sees it)
  named      (fail) the failing node written to $MULTINODE_FAILED_NODE_FILE, and the one named in the log
  ranks left (fail) blocked ranks still alive when the job script ended, and when they were all gone
  ranks lost (fail) blocked ranks still alive 45 s after the job script ended (past KillWait): SLURM lost them
             (their agent was SIGKILLed; this cluster tracks processes by parentage, proctrack/linuxproc); the
             benchmark kills them
  rpcs       slurmctld RPCs of the job by message type (sdiag before/after; sdiag's own excluded), and the
             launcher's share: minus a `baseline` job of the same size that runs no step
Results: one JSON (--json) with every job and the medians; a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from chain_overhead import rpc_counts  # noqa: E402  (one sdiag parser for the benchmarks)

from snakemake_executor_multinode.contract import protocol  # noqa: E402
from snakemake_executor_multinode.launching.launcher import (  # noqa: E402
    check_user_flags,
    log,
    nproc_for,
    read_allocation,
    split_torchrun_args,
    torchrun_command,
    worker_env,
)

ORPHAN_WAIT_S = 45  # past SLURM's KillWait (30 s): a rank still alive then is one SLURM lost track of
HERE = Path(__file__).resolve().parent
PROBE = HERE / "launch_probe"
WORKER = HERE / "launch_worker.py"


# ---- the per-node launcher, for the comparison only ------------------------------------------------------------


def per_node_sruns(opts: Sequence[str], script: Sequence[str], env: Mapping[str, str]) -> list[tuple[str, list[str]]]:
    alloc = read_allocation(env)
    check_user_flags(alloc, opts)
    nproc = nproc_for(alloc, opts)
    out = []
    for rank, node in enumerate(alloc.nodes):
        srun = [
            "srun",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={node}",
            f"--cpus-per-task={alloc.cpus_per_task}",
            "--mem=0",
            "--kill-on-bad-exit=1",
            "--export=ALL",
            f"--job-name=torchrun-node{rank}",
        ]
        torchrun = torchrun_command(opts, script, nproc=nproc, alloc=alloc, node_rank=rank)
        out.append((node, [*srun, "bash", "-c", 'trap "" USR2; exec "$@"', "multinode-agent", *torchrun]))
    return out


def per_node_torchrun(argv: Sequence[str]) -> int:
    """The launcher's former fan-out and supervision, unchanged but for the shared torchrun builder."""
    opts, script = split_torchrun_args(argv)
    env = dict(os.environ)
    alloc = read_allocation(env)
    launches = per_node_sruns(opts, script, env)
    wenv = worker_env(alloc, nproc_for(alloc, opts), env)
    procs = {rank: subprocess.Popen(cmd, env=wenv) for rank, (_, cmd) in enumerate(launches)}
    stopping = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    failed: tuple[int, int] | None = None
    while any(p.poll() is None for p in procs.values()):
        for rank, p in procs.items():
            code = p.poll()
            if code not in (None, 0) and failed is None:
                failed = (rank, code)
        if failed is not None and not stopping:
            stopping = True
            log(f"node {launches[failed[0]][0]} (node_rank {failed[0]}) failed with exit code {failed[1]}")
            _stop_all(procs, grace=10.0)
        time.sleep(0.2)
    if failed is None:
        failed = next(((r, p.returncode) for r, p in procs.items() if p.returncode != 0), None)
    if failed is None:
        return 0
    node = launches[failed[0]][0]
    log(f"FAILED: node {node} (node_rank {failed[0]}) exited with {failed[1]}")
    if path := env.get(protocol.FAILED_NODE_FILE_VAR):
        Path(path).write_text(f"{node}\n")
    return failed[1] if failed[1] > 0 else 1


def _stop_all(procs: Mapping[int, subprocess.Popen], grace: float) -> None:
    alive = [p for p in procs.values() if p.poll() is None]
    for p in alive:
        p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.poll() is None for p in alive):
        time.sleep(0.1)
    for p in alive:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            time.sleep(0.1)
            p.send_signal(signal.SIGINT)
    for p in alive:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()


# ---- measuring ---------------------------------------------------------------------------------------------------

LAUNCHERS = {
    "step": [sys.executable, "-m", "snakemake_executor_multinode.cli", "torchrun"],
    "per-node": [sys.executable, str(Path(__file__).resolve()), "per-node-torchrun"],
}

BATCH = """#!/bin/bash
#SBATCH --nodes={nodes} --ntasks-per-node=1 --gres=gpu:{gpus} --cpus-per-task={cpus} --time=5
#SBATCH --job-name=mn-bench-{name} --output={log}
echo "$(date +%s.%N) job" >>{stamps}
cd {work}
export MN_BENCH_STAMPS={stamps} PYTHONPATH={pythonpath}
export {failed_var}={failed}
{command}
rc=$?
echo "$(date +%s.%N) end $rc" >>{stamps}
"""


def sdiag() -> tuple[dict[str, int], int]:
    """slurmctld's RPC counts by message type (sdiag's own excluded), and its completed-jobs counter."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout
    counts = rpc_counts(out)
    done = re.search(r"Jobs completed:\s+(\d+)", out)
    failed = re.search(r"Jobs failed:\s+(\d+)", out)
    return counts, int(done[1] if done else 0) + int(failed[1] if failed else 0)


def read_stamps(path: Path) -> list[tuple[float, str, list[str]]]:
    rows = []
    for line in path.read_text().splitlines():
        t, kind, *rest = line.split()
        rows.append((float(t), kind, rest))
    return rows


def run_job(launcher: str, nodes: int, mode: str, args: argparse.Namespace, work: Path) -> dict:
    name = f"{launcher}-{nodes}n-{mode}"
    stamps, log_path, failed = work / f"{name}.stamps", work / f"{name}.log", work / f"{name}.failed-node"
    for p in (stamps, log_path, failed):
        p.unlink(missing_ok=True)
    if launcher == "baseline":
        command = "true"
    else:
        cmd = [*LAUNCHERS[launcher], f"--nproc_per_node={args.nproc}", str(WORKER), mode]
        command = shlex.join(cmd)
    script = work / f"{name}.sbatch"
    script.write_text(
        BATCH.format(
            nodes=nodes,
            gpus=args.gpus,
            cpus=args.cpus,
            name=name,
            log=log_path,
            stamps=stamps,
            work=work,
            pythonpath=f"{PROBE}:{REPO}",
            failed_var=protocol.FAILED_NODE_FILE_VAR,
            failed=failed,
            command=command,
        )
    )
    load = os.getloadavg()[0]
    rpc0, done0 = sdiag()
    job = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True)
    job_id = job.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 360
    while not (stamps.exists() and " end " in stamps.read_text()):  # the filesystem says when, not slurmctld
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], check=False)
            raise SystemExit(f"{name}: job {job_id} did not end within 6 minutes; see {log_path}")
        time.sleep(0.1)
    rows = read_stamps(stamps)
    survivors = [int(r[1]) for t, k, r in rows if k == "blocking"]
    left = [pid for pid in survivors if Path(f"/proc/{pid}").exists()]  # alive as the job script ended
    orphans = []
    wait_until = time.monotonic() + ORPHAN_WAIT_S
    while any(Path(f"/proc/{pid}").exists() for pid in left) and time.monotonic() < wait_until:
        time.sleep(0.1)  # and the next job starts on a clean cluster
    gone = time.time()
    for pid in left:  # ranks SLURM lost track of (their agent was killed; proctrack/linuxproc): ours to end
        try:
            os.kill(pid, signal.SIGKILL)
            orphans.append(pid)
        except ProcessLookupError:
            pass
    while True:  # the batch-complete and step-complete RPCs land just after the script's last line
        time.sleep(0.5)
        rpc1, done1 = sdiag()
        if done1 > done0 or time.monotonic() > deadline:
            break
    time.sleep(1.0)
    rpc1, _ = sdiag()
    rpcs = {k: rpc1.get(k, 0) - rpc0.get(k, 0) for k in rpc1 if rpc1.get(k, 0) != rpc0.get(k, 0)}
    start = next(t for t, k, _ in rows if k == "job")
    end_t, end_rest = next((t, r) for t, k, r in rows if k == "end")

    def times(kind: str, field: int | None) -> list[float]:
        return [float(r[field]) if field is not None else t for t, k, r in rows if k == kind]

    def last(kind: str, field: int | None = None) -> float | None:
        ts = times(kind, field)
        return round(max(ts) - start, 3) if ts else None

    def first(kind: str, field: int | None = None) -> float | None:
        ts = times(kind, field)
        return round(min(ts) - start, 3) if ts else None

    rec: dict = {
        "launcher": launcher,
        "nodes": nodes,
        "mode": mode,
        "job": job_id,
        "exit": int(end_rest[0]),
        "load_before": round(load, 2),
        "wall_s": round(end_t - start, 3),
        "rpcs": rpcs,
        "rpcs_total": sum(rpcs.values()),
    }
    if launcher == "baseline":
        return rec
    agent_hosts = {r[0] for t, k, r in rows if k == "agent"}
    rec |= {
        "agent_hosts": len(agent_hosts),
        "launcher_s": last("launcher", 2),  # the launcher process started (job script's own start before it)
        "first_task_s": first("agent", 2),
        "fanout_s": last("agent", 2),  # the process's fork time on its node
        "agents_s": last("agent"),
        "workers_s": last("worker"),
        "imported_s": last("imported"),
        "launch_s": last("init"),
    }
    if mode.startswith("fail"):
        dying, dying_host = next(((t, r[0]) for t, k, r in rows if k == "dying"), (None, None))
        text = log_path.read_text() if log_path.exists() else ""
        named = re.search(r"FAILED: node (\S+) \(node_rank (\d+)\)", text)
        rec |= {
            "detect_s": round(end_t - dying, 3) if dying else None,
            "named_after_s": round(failed.stat().st_mtime - dying, 3) if dying and failed.exists() else None,
            "failed_node_file": failed.read_text().strip() if failed.exists() else None,
            "named_in_log": f"{named[1]} (node_rank {named[2]})" if named else None,
            "expected": f"{dying_host} (node_rank {nodes - 1})",
            "survivors_left": left,  # blocked ranks still alive when the launcher returned
            "all_ranks_gone_s": round(gone - dying, 3) if dying and left and not orphans else None,  # to 0.1 s
            "orphans_killed_by_benchmark": len(orphans),  # still alive ORPHAN_WAIT_S after the job script ended
        }
    return rec


def split_flags_cost(repeats: int) -> dict:
    """Wall seconds of a fresh process splitting torchrun's options: torch's parser (before) vs the table (now)."""
    old = "from torch.distributed.run import get_args_parser; get_args_parser()"
    new = (
        "from snakemake_executor_multinode.launching.launcher import split_torchrun_args; split_torchrun_args(['x.py'])"
    )
    out = {}
    for name, code in (("torch_parser_s", old), ("static_table_s", new)):
        walls = []
        for _ in range(repeats):
            t = time.monotonic()
            subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
            walls.append(time.monotonic() - t)
        out[name] = round(statistics.median(walls), 3)
    return out


def median(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(vals), 3) if vals else None


def summarize(records: list[dict], nodes: Sequence[int]) -> list[dict]:
    out = []
    for mode in ("ok", "fail", "fail-term"):
        for nn in nodes:
            base = [r for r in records if r["launcher"] == "baseline" and r["nodes"] == nn]
            base_rpcs = statistics.median(r["rpcs_total"] for r in base) if base else 0
            for launcher in LAUNCHERS:
                rows = [r for r in records if (r["launcher"], r["nodes"], r["mode"]) == (launcher, nn, mode)]
                if not rows:
                    continue
                s = {"launcher": launcher, "nodes": nn, "mode": mode, "n": len(rows)}
                keys = ("launcher_s", "first_task_s", "fanout_s", "agents_s", "workers_s", "launch_s", "wall_s")
                for key in (*keys, "rpcs_total"):
                    s[key] = median(rows, key)
                s["launcher_rpcs"] = round(s["rpcs_total"] - base_rpcs, 1) if s["rpcs_total"] is not None else None
                types: dict[str, list[int]] = {}
                for r in rows:
                    for k in set().union(*(x["rpcs"] for x in rows)):
                        types.setdefault(k, []).append(r["rpcs"].get(k, 0))
                s["rpcs_by_type"] = {k: statistics.median(v) for k, v in sorted(types.items())}
                if mode != "ok":
                    s["detect_s"] = median(rows, "detect_s")
                    s["detect_max_s"] = max((r["detect_s"] for r in rows if r["detect_s"] is not None), default=None)
                    s["named_after_s"] = median(rows, "named_after_s")
                    s["named_right"] = sum(
                        r["named_in_log"] == r["expected"] and r["expected"].startswith(f"{r['failed_node_file']} ")
                        for r in rows
                    )
                    s["survivors_left"] = sum(len(r["survivors_left"]) for r in rows)
                    s["all_ranks_gone_s"] = median(rows, "all_ranks_gone_s")
                    s["orphans"] = sum(r["orphans_killed_by_benchmark"] for r in rows)
                out.append(s)
    return out


def table(summary: list[dict]) -> str:
    lines = [
        "| launcher | nodes | launcher up s | first torchrun s | last torchrun (fan-out) s | workers up s "
        "| launch s | job RPCs | launcher RPCs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        if s["mode"] == "ok":
            lines.append(
                f"| {s['launcher']} | {s['nodes']} | {s['launcher_s']} | {s['first_task_s']} | {s['fanout_s']} "
                f"| {s['workers_s']} | {s['launch_s']} | {s['rpcs_total']} | {s['launcher_rpcs']} |"
            )
    lines += [
        "",
        "| scenario | launcher | nodes | dead rank -> job script ends s (median / max) | failed-node file "
        "written s | named right | ranks still alive then | all ranks gone s | ranks SLURM lost |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        if s["mode"] != "ok":
            lines.append(
                f"| {s['mode']} | {s['launcher']} | {s['nodes']} | {s['detect_s']} / {s['detect_max_s']} "
                f"| {s['named_after_s']} "
                f"| {s['named_right']}/{s['n']} | {s['survivors_left']} | {s['all_ranks_gone_s'] or '-'} "
                f"| {s['orphans']} |"
            )
    return "\n".join(lines)


def bench(args: argparse.Namespace) -> int:
    if not os.environ.get("SLURM_CONF"):
        raise SystemExit('point SLURM_CONF at a cluster: eval "$(multinode cluster env --dir ...)"')
    records: list[dict] = []
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs",
        "slurm": subprocess.run(["srun", "--version"], capture_output=True, text=True).stdout.strip(),
        "torch": subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
        ).stdout.strip(),
        "nproc_per_node": args.nproc,
        "cpus_per_task": args.cpus,
        "repeats": args.repeats,
    }
    meta["split_flags"] = split_flags_cost(3)
    print(f"splitting torchrun's options in a fresh process: {meta['split_flags']}", flush=True)
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="mn-bench-launch-") as tmp:
        work = Path(tmp)
        for rep in range(args.repeats):
            for nodes in args.nodes:
                plan = [("baseline", "ok")] + [(la, m) for m in args.modes for la in args.launchers]
                if rep % 2:  # alternate which launcher goes first
                    plan = [plan[0], *reversed(plan[1:])]
                for launcher, mode in plan:
                    rec = run_job(launcher, nodes, mode, args, work)
                    rec["repeat"] = rep
                    records.append(rec)
                    show = {k: rec.get(k) for k in ("launcher", "nodes", "mode", "exit", "fanout_s", "launch_s")}
                    show |= {k: rec[k] for k in ("detect_s", "named_in_log", "rpcs_total") if k in rec}
                    print(json.dumps(show), flush=True)
    summary = summarize(records, args.nodes)
    print(table(summary))
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "summary": summary, "jobs": records}, indent=1) + "\n")
    return 0


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["per-node-torchrun"]:
        return per_node_torchrun(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--launchers", nargs="+", default=list(LAUNCHERS), choices=list(LAUNCHERS))
    ap.add_argument("--modes", nargs="+", default=["ok", "fail", "fail-term"], choices=["ok", "fail", "fail-term"])
    ap.add_argument("--nproc", type=int, default=1, help="processes per node (default 1: fewer torch imports)")
    ap.add_argument("--gpus", type=int, default=2, help="GPUs per node to allocate (the cluster's)")
    ap.add_argument("--cpus", type=int, default=2, help="--cpus-per-task (the cluster's CPUs per node)")
    ap.add_argument("--json", type=Path, help="write every job and the medians here")
    return bench(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
