"""Where each job's time goes in a chain of one-second jobs: the hand-written afterok chain (the floor) and
`snakemake --executor multinode`, side by side in one run, every step timed, and a profile of Snakemake's process.

    eval "$(multinode cluster env)"
    python benchmarks/chain_breakdown.py [--jobs 10] [--out FILE] [--checkout LABEL=DIR ...]

Every job runs the same bash body: it appends `<job id> start <time>` to a file, sleeps a second, makes its output
and appends `<job id> end <time>` ($EPOCHREALTIME: no process for a time). From one job's end to the next job's
start, each step is timed from what each side writes anyway, all on this host's clock:
  the job      its command's start and end (the file above); the exit marker's mtime (the job script's tail)
  slurmctld    each job's submission, allocation and completion (its log, in milliseconds)
  Snakemake    its process runs under a probe (`probe` below) that wraps the plugin's steps and Snakemake's
               scheduler loop: the status cycle that saw the marker, the plugin's end of the job, Snakemake's
               handling of that end and its choice of the next job, planning, the submission's files, sbatch, and
               every SLURM command and process the plugin started; at the end, when Snakemake's main returned,
               when Python's exit handlers ran (after its non-daemon threads ended) and when the process was gone
The multinode variant runs twice: timed with the probe alone, then once more under cProfile (every thread), whose
heaviest functions go into the result; the profiled run's times are not used.

`--checkout LABEL=DIR` also runs the multinode chain from another checkout of the plugin (PYTHONPATH=DIR) and
records the CPU time of Snakemake's process (importing the adapter, the start up to the first submission, each job):
CPU time, unlike wall time, does not grow with the load of a shared machine, so earlier commits compare with it.
`--inject-delay S` makes every submission S seconds slower (a sleep before sbatch): the guard test's proof that a
per-job cost that doubles is seen (tests/cluster/test_chain_overhead_cluster.py).
"""

from __future__ import annotations

import argparse
import atexit
import cProfile
import functools
import json
import os
import pstats
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chain_overhead import SLEEP, sdiag_rpcs  # noqa: E402  (one sdiag parser for the chain benchmarks)

BODY = (
    'echo "$SLURM_JOB_ID start $EPOCHREALTIME" >> {times}; sleep ' + str(SLEEP) + "; touch {output}; "
    'echo "$SLURM_JOB_ID end $EPOCHREALTIME" >> {times}'
)
FLOOR, MULTINODE = "handwritten afterok chain", "multinode"

# ---------------------------------------------------------------------------------------------------------------
# The probe: runs inside Snakemake's process


def _wrap(
    cls: Any, name: str, label: str, events: list[dict[str, Any]], key: Callable[..., dict[str, Any]] | None = None
) -> None:
    """Each call of cls.name appends {event: label, t0, t1, cpu (the process's, at its end), **key(result, args)}."""
    orig = getattr(cls, name, None)
    if orig is None:  # an older layout of the plugin (a --checkout of an earlier commit): that step is not timed
        return

    @functools.wraps(orig)
    def timed(*args: Any, **kw: Any) -> Any:
        extra = {"marker_mtime": _marker_mtime(*args)} if label == "plugin_end" else {}
        t0, result = time.time(), None
        try:
            result = orig(*args, **kw)
            return result
        finally:
            row = {"event": label, "t0": t0, "t1": time.time(), "cpu": time.process_time(), **extra}
            if key is not None:
                try:
                    row.update(key(result, *args, **kw))
                except Exception as err:  # a probe never breaks the run it measures
                    row["key_error"] = repr(err)
            events.append(row)

    setattr(cls, name, timed)


def _marker_mtime(session: Any, sub: Any, *_: Any) -> float | None:
    """When the job script wrote the exit marker that this end was read from (gone after Session.end)."""
    try:
        return os.stat(session.job_status.marker(sub.jobid)).st_mtime
    except OSError:
        return None


def install(events: list[dict[str, Any]], inject_delay: float = 0.0) -> None:
    """Wrap the plugin's steps and Snakemake's scheduler loop; each call appends one event."""
    from snakemake.scheduling import job_scheduler

    import snakemake_executor_plugin_multinode as adapter
    from snakemake_executor_multinode import session, submitting
    from snakemake_executor_multinode.slurm import client

    s, ex, js = session.Session, adapter.Executor, job_scheduler.JobScheduler
    _wrap(s, "poll", "poll", events, key=lambda r, *a: {"finished": sorted(j for j, o in r.items() if o.finished)})
    _wrap(s, "end", "plugin_end", events, key=lambda r, self, sub, outcome: {"jobid": sub.jobid})
    _wrap(ex, "report_job_success", "report_success", events, key=lambda r, self, info: {"jobid": info.external_jobid})
    _wrap(ex, "__post_init__", "executor_init", events)
    _wrap(ex, "run_job", "run_job", events)
    _wrap(ex, "plan_for", "plan", events)
    _wrap(ex, "_submitted", "submitted", events, key=lambda r, self, job, sub: {"jobid": sub.jobid})
    _wrap(ex, "shutdown", "executor_shutdown", events)
    _wrap(submitting.Submitter, "_prepare", "prepare", events)
    _wrap(client.SlurmClient, "_run", "slurm_command", events, key=lambda r, self, cmd, *a, **k: {"argv": list(cmd)})
    _wrap(js, "_finish_jobs", "snakemake_finish_jobs", events)
    _wrap(js, "job_selector", "snakemake_select", events)
    if inject_delay:
        submit = client.SlurmClient.submit

        def slower(self: Any, *args: Any, **kw: Any) -> str:
            time.sleep(inject_delay)
            return submit(self, *args, **kw)

        client.SlurmClient.submit = slower  # type: ignore[method-assign]
    popen = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def execute_child(self: Any, args: Any, *rest: Any, **kw: Any) -> Any:  # every process Snakemake's side starts
        t0 = time.time()
        try:
            return popen(self, args, *rest, **kw)
        finally:
            argv = [str(a) for a in args] if isinstance(args, list | tuple) else [str(args)]
            events.append({"event": "process", "t0": t0, "t1": time.time(), "argv": argv[:2]})

    subprocess.Popen._execute_child = execute_child  # type: ignore[attr-defined]


def _profile_threads(profiles: list[cProfile.Profile]) -> None:
    """cProfile every thread started from now on (Snakemake's status thread among them)."""
    run = threading.Thread.run

    def profiled(self: threading.Thread) -> None:
        prof = cProfile.Profile()
        profiles.append(prof)
        prof.enable()
        try:
            run(self)
        finally:
            prof.disable()

    threading.Thread.run = profiled  # type: ignore[method-assign]


def probe_main(events_path: Path, profile_path: Path | None, inject_delay: float, argv: list[str]) -> int:
    """Snakemake's own main, under the probe. The events are written by the exit handler registered first, which
    Python runs last: after Snakemake's main returned and its non-daemon threads ended."""
    events: list[dict[str, Any]] = [{"event": "process_start", "t0": time.time(), "t1": time.time(), "cpu": 0.0}]
    profiles: list[cProfile.Profile] = []

    def at_exit() -> None:
        events.append({"event": "exit_handlers", "t0": time.time(), "t1": time.time(), "cpu": time.process_time()})
        events_path.write_text("".join(json.dumps(e) + "\n" for e in events))
        if profiles and profile_path:
            for prof in profiles:
                prof.disable()
            stats = pstats.Stats(profiles[0])
            for prof in profiles[1:]:
                stats.add(prof)
            stats.dump_stats(str(profile_path))

    atexit.register(at_exit)
    install(events, inject_delay)
    if profile_path:
        _profile_threads(profiles)
        profiles.append(cProfile.Profile())
        profiles[-1].enable()
    from snakemake.cli import main

    try:
        main(argv)
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    else:
        code = 0
    events.append({"event": "main_returned", "t0": time.time(), "t1": time.time(), "cpu": time.process_time()})
    return code


# ---------------------------------------------------------------------------------------------------------------
# SLURM's side: its own logs


def slurm_logs() -> tuple[Path, list[Path]]:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    conf = dict(re.findall(r"^(\S+)\s*=\s*(.*)$", out, re.M))
    ctld = Path(conf["SlurmctldLogFile"].strip())
    slurmd = Path(conf["SlurmdLogFile"].strip())
    return ctld, sorted(slurmd.parent.glob(slurmd.name.replace("%n", "*").replace("%h", "*")))


LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)\] (.*)$")
CTLD_EVENTS = [
    ("submitted", re.compile(r"_slurm_rpc_submit_batch_job: JobId=(\d+) ")),
    ("allocated", re.compile(r"sched: Allocate JobId=(\d+) ")),
    ("allocated", re.compile(r"sched/backfill: _start_job: Started JobId=(\d+) ")),
    ("completed", re.compile(r"_job_complete: JobId=(\d+) done")),
]
SLURMD_EVENTS = [("launched", re.compile(r"Launching batch job (\d+) "))]


def read_log(path: Path, offset: int, patterns: list[tuple[str, re.Pattern[str]]]) -> dict[str, dict[str, float]]:
    """{job id: {event: time}} from the lines written after `offset`."""
    found: dict[str, dict[str, float]] = {}
    with path.open(errors="replace") as f:
        f.seek(offset)
        for text in f:
            m = LOG_LINE.match(text)
            if not m:
                continue
            when = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").timestamp()  # SLURM logs local time
            for event, pattern in patterns:
                if found_id := pattern.search(m.group(2)):
                    found.setdefault(found_id.group(1), {}).setdefault(event, when)
    return found


class SlurmSide:
    """The lines slurmctld and the slurmds write from now on."""

    def __init__(self) -> None:
        self.ctld, self.slurmd = slurm_logs()
        self.offsets = {p: p.stat().st_size for p in [self.ctld, *self.slurmd]}

    def jobs(self) -> dict[str, dict[str, float]]:
        jobs = read_log(self.ctld, self.offsets[self.ctld], CTLD_EVENTS)
        for p in self.slurmd:
            for jobid, ev in read_log(p, self.offsets[p], SLURMD_EVENTS).items():
                jobs.setdefault(jobid, {}).update(ev)
        return jobs


def job_times(path: Path) -> dict[str, dict[str, float]]:
    times: dict[str, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        jobid, event, when = line.split()
        times.setdefault(jobid, {})[event] = float(when)
    return times


# ---------------------------------------------------------------------------------------------------------------
# The two variants


def floor(n: int, workdir: Path) -> dict[str, Any]:
    """N scripts with the same body, each `sbatch --dependency=afterok:<previous>`, all submitted at once."""
    times, done = workdir / "times.txt", workdir / "done"
    prev = None
    start = time.time()
    for i in range(n):
        script = workdir / f"s{i}.sh"
        body = BODY.format(times=times, output=workdir / f"s{i}.txt")
        script.write_text("#!/bin/bash\n" + body + (f"\ntouch {done}\n" if i == n - 1 else "\n"))
        dep = [f"--dependency=afterok:{prev}"] if prev else []
        prev = subprocess.run(
            ["sbatch", "--parsable", "-o", "/dev/null", *dep, str(script)],
            capture_output=True, text=True, check=True, cwd=workdir,
        ).stdout.strip()  # fmt: skip
    while not done.exists():  # the filesystem, not slurmctld, tells us it ended
        time.sleep(0.05)
    return {"start": start, "end": time.time()}


def snakefile(n: int, times: Path) -> str:
    rules = [f'rule all:\n    input: "s{n - 1}.txt"\n']
    for i in range(n):
        inp = f'    input: "s{i - 1}.txt"\n' if i else ""
        body = BODY.format(times=times, output="{output}").replace('"', '\\"')
        rules.append(f'rule s{i}:\n{inp}    output: "s{i}.txt"\n    shell: "{body}"\n')
    return "\n".join(rules)


def multinode(
    n: int, workdir: Path, profile: Path | None = None, inject_delay: float = 0.0, pythonpath: str | None = None
) -> dict[str, Any]:
    (workdir / "Snakefile").write_text(snakefile(n, workdir / "times.txt"))
    events = workdir / "events.jsonl"
    cmd = [sys.executable, __file__, "probe", str(events), str(profile or ""), str(inject_delay), "--",
           "--executor", "multinode", "--jobs", "1", "--quiet", "all"]  # fmt: skip
    env = os.environ if pythonpath is None else {**os.environ, "PYTHONPATH": pythonpath}
    start = time.time()
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=env)
    end = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"snakemake failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"start": start, "end": end, "events": [json.loads(x) for x in events.read_text().splitlines()]}


def measured(name: str, n: int, run: Callable[[int, Path], dict[str, Any]]) -> dict[str, Any]:
    load = Path("/proc/loadavg").read_text().split()[:3]
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        wd = Path(tmp)
        side = SlurmSide()
        rpc0 = sdiag_rpcs(by_type=True)
        row = run(n, wd)
        time.sleep(1)  # the last batch-complete RPC and its log line
        rpc1 = sdiag_rpcs(by_type=True)
        row["slurm"] = side.jobs()
        row["times"] = job_times(wd / "times.txt")
    row["variant"], row["loadavg_before"] = name, load
    row["rpcs"] = {k: rpc1[k] - rpc0.get(k, 0) for k in rpc1 if rpc1[k] != rpc0.get(k, 0)}
    return row


# ---------------------------------------------------------------------------------------------------------------
# The breakdown


def chain(row: dict[str, Any]) -> list[str]:
    """The chain's job ids in the order they ran (by their command's start)."""
    return sorted(row["times"], key=lambda j: row["times"][j]["start"])


def gaps(row: dict[str, Any]) -> list[float]:
    """Each job's command end to the next job's command start."""
    ids, t = chain(row), row["times"]
    return [round(t[b]["start"] - t[a]["end"], 3) for a, b in zip(ids, ids[1:], strict=False)]


def upper_quartile(values: list[float]) -> float:
    """The gap most jobs stay under: the floor's own luck (slurmctld sometimes starts the next job the moment the
    last one ends) and one slow job of ours weigh nothing in it."""
    return round(statistics.quantiles(values, n=4, method="inclusive")[2], 3)


def per_job_ratio(result: dict[str, Any]) -> float:
    """The guard's verdict (tests/cluster/test_chain_overhead_cluster.py): multinode's upper-quartile gap between
    one job's end and the next job's start, over the floor's in the same run. A ratio, never a time."""
    return round(result[MULTINODE]["upper_quartile_gap_s"] / result[FLOOR]["upper_quartile_gap_s"], 2)


def _mean(values: list[float]) -> float:
    return round(statistics.mean(values), 3)


def _common(row: dict[str, Any], n: int) -> dict[str, Any]:
    wall = row["end"] - row["start"]
    return {
        "wall_s": round(wall, 2),
        "overhead_per_job_s": round((wall - n * SLEEP) / n, 3),
        "gaps_s": gaps(row),
        "upper_quartile_gap_s": upper_quartile(gaps(row)),
        "rpcs": row["rpcs"],
        "rpcs_per_job": round(sum(row["rpcs"].values()) / n, 2),
    }


def floor_steps(row: dict[str, Any], n: int) -> dict[str, Any]:
    ids, t, sl = chain(row), row["times"], row["slurm"]
    steps: dict[str, list[float]] = {}
    for a, b in zip(ids, ids[1:], strict=False):
        for name, value in [
            ("SLURM: command end -> job complete", sl[a]["completed"] - t[a]["end"]),
            ("SLURM: complete -> next job allocated (its scheduling pass)", sl[b]["allocated"] - sl[a]["completed"]),
            ("SLURM: allocated -> command start (launch, script start)", t[b]["start"] - sl[b]["allocated"]),
        ]:
            steps.setdefault(name, []).append(value)
    return {**_common(row, n), "per_job": {k: _mean(v) for k, v in steps.items()}}


def _between(ev: list[dict[str, Any]], name: str, t0: float, t1: float) -> list[dict[str, Any]]:
    return [e for e in ev if e["event"] == name and e["t0"] >= t0 - 1e-6 and e["t1"] <= t1 + 1e-6]


def _spent(events: list[dict[str, Any]]) -> float:
    return sum(e["t1"] - e["t0"] for e in events)


def multinode_steps(row: dict[str, Any], n: int) -> dict[str, Any]:
    """The steps from one job's command end to the next job's command start, each a mean over the chain."""
    ids, t, sl, ev = chain(row), row["times"], row["slurm"], row["events"]
    ends = {e["jobid"]: e for e in ev if e["event"] == "plugin_end"}
    reports = {e["jobid"]: e for e in ev if e["event"] == "report_success"}
    submitted = {e["jobid"]: e for e in ev if e["event"] == "submitted"}
    runs = [e for e in ev if e["event"] == "run_job"]
    steps: dict[str, list[float]] = {}
    for a, b in zip(ids, ids[1:], strict=False):
        end, report = ends[a], reports[a]
        seen = next(e for e in ev if e["event"] == "poll" and a in e["finished"])
        run = next(r for r in runs if r["t0"] <= submitted[b]["t0"] <= r["t1"])
        plan, prepare = _between(ev, "plan", run["t0"], run["t1"]), _between(ev, "prepare", run["t0"], run["t1"])
        sbatch = [e for e in _between(ev, "slurm_command", run["t0"], run["t1"]) if e["argv"][0] == "sbatch"]
        loop = [e for e in ev if e["event"] in ("snakemake_finish_jobs", "snakemake_select")]
        loop = [e for e in loop if report["t0"] <= e["t0"] <= run["t0"]]
        for name, value in [
            ("job: command end -> exit marker (the job script's tail)", end["marker_mtime"] - t[a]["end"]),
            ("plugin: exit marker -> status cycle done (wake)", seen["t1"] - end["marker_mtime"]),
            ("plugin: the job's end (registry, provenance)", end["t1"] - end["t0"]),
            ("Snakemake: end reported -> next job handed over", run["t0"] - end["t1"]),
            ("  of which output checks, DAG update, job selection", _spent(loop)),
            ("plugin: plan", _spent(plan)),
            ("plugin: script, provenance and record written", _spent(prepare)),
            ("sbatch", _spent(sbatch)),
            ("plugin: rest of the submission", run["t1"] - run["t0"] - _spent([*plan, *prepare, *sbatch])),
            ("SLURM: submitted -> allocated (its scheduling pass)", sl[b]["allocated"] - run["t1"]),
            ("SLURM: allocated -> command start (launch, script start)", t[b]["start"] - sl[b]["allocated"]),
        ]:
            steps.setdefault(name, []).append(value)
    first = min(runs, key=lambda r: r["t0"])
    at = {e["event"]: e for e in ev if e["event"] in ("executor_init", "main_returned", "exit_handlers")}
    last_end = t[ids[-1]]["end"]
    return {
        **_common(row, n),
        "per_job": {k: _mean(v) for k, v in steps.items()},
        "start": {
            "snakemake start -> plugin's executor made (Python, imports, DAG)": round(
                at["executor_init"]["t0"] - row["start"], 3
            ),
            "executor made (state folder, every job planned, sbatch --test-only)": round(
                at["executor_init"]["t1"] - at["executor_init"]["t0"], 3
            ),
            "-> first job handed over and submitted": round(first["t1"] - at["executor_init"]["t1"], 3),
        },  # fmt: skip
        "end": {
            "last command end -> its end noticed": round(ends[ids[-1]]["t0"] - last_end, 3),
            "-> Snakemake's main returned (rule all, shutdown)": round(
                at["main_returned"]["t0"] - ends[ids[-1]]["t0"], 3
            ),
            "-> exit handlers (its non-daemon threads ended)": round(
                at["exit_handlers"]["t0"] - at["main_returned"]["t0"], 3
            ),
            "-> process gone (interpreter teardown)": round(row["end"] - at["exit_handlers"]["t0"], 3),
        },  # fmt: skip
        "cpu_s": cpu(ev),
        "slurm_commands": _commands(ev),
        "processes": sorted(
            {
                " ".join(Path(a).name if i == 0 else a for i, a in enumerate(e["argv"]))
                for e in ev
                if e["event"] == "process"
            }
        ),  # fmt: skip
    }


def cpu(ev: list[dict[str, Any]]) -> dict[str, float]:
    """CPU time of Snakemake's process: up to the first job's submission, per further job, in all."""
    runs = sorted((e for e in ev if e["event"] == "run_job"), key=lambda e: e["t0"])
    total = next(e["cpu"] for e in ev if e["event"] == "exit_handlers")
    return {
        "to_first_submission": round(runs[0]["cpu"], 3),
        "per_job": round((runs[-1]["cpu"] - runs[0]["cpu"]) / max(1, len(runs) - 1), 4),
        "total_before_teardown": round(total, 3),
    }


def _commands(ev: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    found: dict[str, list[float]] = {}
    for e in ev:
        if e["event"] == "slurm_command":
            words = e["argv"][:2] if e["argv"][1].startswith("-") else e["argv"][:1]
            found.setdefault(" ".join(words), []).append(e["t1"] - e["t0"])
    return {k: {"calls": len(v), "mean_s": _mean(v)} for k, v in sorted(found.items())}


def profile_top(path: Path, count: int = 15) -> dict[str, list[dict[str, Any]]]:
    """The functions that cost most: by their own time (all code), and by time inside them (the plugin's)."""
    stats = pstats.Stats(str(path))
    rows = []
    for (file, line, func), (_, calls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = file.split("site-packages/")[-1].split("wt-overhead/")[-1]
        rows.append({"function": f"{where}:{line}({func})", "calls": calls,
                     "own_s": round(tottime, 3), "inside_s": round(cumtime, 3)})  # fmt: skip
    plugin = [r for r in rows if "snakemake_executor" in r["function"]]
    return {
        "by_own_time": sorted(rows, key=lambda r: -r["own_s"])[:count],
        "plugin_by_time_inside": sorted(plugin, key=lambda r: -r["inside_s"])[:count],
    }


def import_cpu(pythonpath: str | None) -> float:
    """CPU time of importing the adapter after what Snakemake has imported before it (median of 5)."""
    code = (
        "import time, snakemake_interface_executor_plugins.executors.remote, snakemake_interface_executor_plugins"
        ".settings, snakemake_interface_common.exceptions, yaml, json, subprocess, csv, uuid, platform, argparse,"
        " importlib.metadata, hashlib, ctypes\n"
        "t = time.process_time(); import snakemake_executor_plugin_multinode; print(time.process_time() - t)"
    )
    env = os.environ if pythonpath is None else {**os.environ, "PYTHONPATH": pythonpath}
    found = [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout)
        for _ in range(5)
    ]
    return round(statistics.median(found), 3)


def breakdown(n: int, inject_delay: float = 0.0, profile: bool = True) -> dict[str, Any]:
    """The floor and multinode side by side (and, with `profile`, a profiled multinode run after them)."""
    load = Path("/proc/loadavg").read_text().split()[:3]
    floor_row = measured(FLOOR, n, floor)
    ours = measured(MULTINODE, n, lambda k, wd: multinode(k, wd, inject_delay=inject_delay))
    result = {
        "jobs": n,
        "loadavg_before": load,
        FLOOR: floor_steps(floor_row, n),
        MULTINODE: multinode_steps(ours, n),
    }
    result["per_job_ratio"] = per_job_ratio(result)
    result[MULTINODE]["import_cpu_s"] = import_cpu(None)
    if profile:
        with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
            prof = Path(tmp) / "profile.pstats"
            (Path(tmp) / "wd").mkdir()
            multinode(n, Path(tmp) / "wd", prof, inject_delay)
            result["profile_of_a_second_multinode_run"] = profile_top(prof)
    result["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    return result


def checkouts(n: int, given: list[str]) -> list[dict[str, Any]]:
    """Snakemake's process with each checkout's plugin, one chain each, one after the other: its CPU time, and the
    gaps between one job's end and the next job's start (each a scheduling pass of slurmctld, or less)."""
    rows = []
    for item in given:
        label, _, folder = item.partition("=")
        run = measured(label, n, lambda k, wd, where=folder: multinode(k, wd, pythonpath=where))
        found = gaps(run)
        rows.append({
            "checkout": label, "import_cpu_s": import_cpu(folder), **cpu(run["events"]), "gaps_s": found,
            "mean_gap_s": _mean(found), "upper_quartile_gap_s": upper_quartile(found),
            "loadavg_before": run["loadavg_before"],
        })  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--checkout", action="append", default=[], metavar="LABEL=DIR")
    ap.add_argument("--inject-delay", type=float, default=0.0)
    args = ap.parse_args()
    result = breakdown(args.jobs, args.inject_delay)
    if args.checkout:
        result["cpu_by_checkout"] = checkouts(args.jobs, args.checkout)
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "probe":  # inside Snakemake's process: probe EVENTS PROFILE DELAY -- ARGS
        split = sys.argv.index("--")
        profile = Path(sys.argv[3]) if sys.argv[3] else None
        sys.exit(probe_main(Path(sys.argv[2]), profile, float(sys.argv[4]), sys.argv[split + 1 :]))
    sys.exit(main())
