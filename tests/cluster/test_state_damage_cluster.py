"""Damaged plugin state (issue 38, docs/reliability.md; the table of these tests: docs/evidence.md): every kind of
file under .snakemake/multinode/ cut short, overwritten with garbage bytes, or given to another user (uid 65534; the
suite runs as root, whom no permission stops: the plugin notices the owner itself), and what the next Snakemake run
and `multinode status | report | clean | logs | provenance` do with it.

The state is made once, as a user leaves it after the worst moment to lose Snakemake: a job `prep` ran and was seen
to end, then the 2-node job `work` was submitted, Snakemake was SIGKILLed while it ran, and the job finished while
Snakemake was away (`snakemake --unlock` done). The folder (outputs, Snakemake's metadata and the plugin's state,
hard links kept) is saved once; each case restores it at the same path (job scripts and records name it), damages
one file and reruns the way the user would (`--rerun-incomplete`). The rerun must take the finished job's result:
no job is submitted again (registry and squeue), whatever was damaged. Where the damaged file is one the command
reads, its output names the file (`damaged state file <path>: <why>; ignored: <what it does instead>`). A state
folder that is another user's or no folder stops the run before it plans or submits anything, naming the folder.
Never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import JobFiles, StateFolders
from snakemake_executor_multinode.watching import provenance
from snakemake_executor_multinode.watching.registry import Index
from tests.helpers import (
    MULTINODE,
    Cluster,
    Snakemake,
    figures,
    jobs_from,
    lines,
    records,
    squeue_states,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.one_release]

WAIT_FOR = "while [ ! -e release ]; do sleep 0.2; done"
SNAKEFILE = f"""
rule all:
    input: "out.txt"

rule prep:
    output: "prep.txt"
    resources: own_launcher=True
    shell: "echo $SLURM_JOB_ID >> runs.txt; echo prep > {{output}}"

rule work:
    input: "prep.txt"
    output: "out.txt"
    resources: nodes=2, own_launcher=True
    shell: "echo $SLURM_JOB_ID >> runs.txt; {WAIT_FOR}; echo done > {{output}}"
"""
OTHER_UID = 65534
# The rerun's sweep comes every 2 s: a job whose exit marker is left out is found ended by sacct without a 30 s wait.
RERUN = ("--rerun-incomplete", "--multinode-sweep-seconds", "2")


@dataclass(frozen=True)
class Made:
    wd: Path
    pristine: Path
    prep: str  # its SLURM job id
    work: str
    work_name: str  # the job name of the submission, unique to it
    work_log: Path


def _git(wd: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(wd), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True,
                   capture_output=True)  # fmt: skip


@pytest.fixture(scope="module")
def made(slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Made]:
    base = tmp_path_factory.mktemp("state-damage")
    wd = base / "wf"
    wd.mkdir()
    (wd / "Snakefile").write_text(SNAKEFILE)
    (wd / ".gitignore").write_text(".snakemake/\n*.txt\nrelease\n")
    _git(wd, "init", "-q")  # the code snapshot (--multinode-snapshot git) freezes the Snakefile
    _git(wd, "add", ".")
    _git(wd, "commit", "-qm", "workflow")
    first = Snakemake(wd)
    try:
        work, _ = first.submitted("work", timeout=300)
        wait_for(lambda: len(lines(wd / "runs.txt")) == 2, "the 2-node job running", 300)
        os.kill(first.pid, signal.SIGKILL)
        assert first.wait(60) == -signal.SIGKILL
    finally:
        first.stop()
        (wd / "release").touch()  # the job ends also when the test does not get this far
    wait_for(lambda: squeue_states(slurm_cluster, [work]).get(work) == "COMPLETED", f"job {work} COMPLETED", 120)
    prep = lines(wd / "runs.txt")[0]
    unlock = subprocess.run([sys.executable, "-m", "snakemake", "--unlock"], cwd=wd, capture_output=True, text=True)
    assert unlock.returncode == 0, unlock.stdout + unlock.stderr
    report = subprocess.run([*MULTINODE, "report"], cwd=wd, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stdout + report.stderr  # reports/<run>.{csv,md}
    (rec,) = [r for r in records(wd) if r["jobid"] == work]
    assert StateFolders(wd).marker(work, ".exit").read_text().startswith("0 0 ")
    pristine = base / "pristine"
    subprocess.run(["cp", "-a", str(wd), str(pristine)], check=True)  # -a: the snapshot's hard links kept
    yield Made(wd, pristine, prep, work, rec["job_name"], Path(rec["log"]))


# --- the table: each kind of file, where it lies, which commands read it ----------------------------------------
@dataclass(frozen=True)
class Kind:
    name: str
    path: Callable[[Made], Path]  # the file damaged
    said_by: tuple[str, ...]  # the commands whose output must name it (damage it reads)
    named: Callable[[Made], Path] | None = None  # the file the line names, when not the damaged one
    damages: tuple[str, ...] = ("truncated", "garbage", "wrong owner")
    silent_for: tuple[str, ...] = ()  # damages no command can notice (content never read)
    exits: dict[str, int] = field(default_factory=dict)  # a command's exit code when not 0 (it says why)
    rerun: bool = True  # False: no run reads it (output of the job, or a report); the commands alone, to save time


def _state(m: Made) -> StateFolders:
    return StateFolders(m.wd)


def _one(pattern: str) -> Callable[[Made], Path]:
    def found(m: Made) -> Path:
        (path,) = _state(m).root.glob(pattern)
        return path

    return found


def _object_of_snakefile(m: Made) -> Path:
    snap = _one("snapshots/*/Snakefile")(m)
    (obj,) = [p for p in _state(m).objects.glob("*/*") if p.stat().st_ino == snap.stat().st_ino]
    return obj


KINDS = [
    Kind("registry record", lambda m: next(_state(m).runs.glob(f"*/{m.work_name}.json")),
         ("status", "report", "clean", "logs"), exits={"logs": 2}),
    Kind("reattach index", lambda m: Index(_state(m).index).path(["out.txt"]), ("snakemake",)),
    Kind("index lock", lambda m: _state(m).index / ".lock", ("snakemake",), damages=("garbage", "wrong owner"),
         silent_for=("garbage",)),
    Kind("exit marker", lambda m: _state(m).marker(m.work, ".exit"), ("snakemake",)),
    Kind("provenance of a job", lambda m: _state(m).provenance / "jobs" / f"{m.work_name}.json", ("snakemake",)),
    Kind("provenance of an output", lambda m: provenance.record_path(m.wd, "prep.txt"), ("provenance",),
         exits={"provenance": 1}),
    Kind("code snapshot file", _one("snapshots/*/Snakefile"), ("snakemake",)),
    Kind("code snapshot object", _object_of_snakefile, ("snakemake",), named=_one("snapshots/*/Snakefile")),
    Kind("snapshot stat cache", lambda m: _state(m).objects / "stat-cache.json", ("snakemake",)),
    Kind("efficiency report", _one("reports/*.md"), ("report",), silent_for=("truncated", "garbage"), rerun=False),
    Kind("job log", lambda m: m.work_log, (), silent_for=("truncated", "garbage", "wrong owner"), rerun=False),
    Kind("job runs lines", lambda m: JobFiles.from_log(m.work_log).runs, (),
         silent_for=("truncated", "garbage", "wrong owner")),
    Kind("job script", lambda m: JobFiles.from_log(m.work_log).script, (),
         silent_for=("truncated", "garbage", "wrong owner"), rerun=False),
]  # fmt: skip


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def garble(path: Path) -> None:
    path.write_bytes(bytes(range(128, 256)) * max(1, path.stat().st_size // 128))


def give_away(path: Path) -> None:
    os.chown(path, OTHER_UID, OTHER_UID)


DAMAGE = {"truncated": truncate, "garbage": garble, "wrong owner": give_away}
CASES = [pytest.param(kind, how, id=f"{kind.name}-{how}") for kind in KINDS for how in kind.damages]


def restore(m: Made) -> None:
    shutil.rmtree(m.wd)
    subprocess.run(["cp", "-a", str(m.pristine), str(m.wd)], check=True)


def run(m: Made, *cmd: str) -> subprocess.CompletedProcess:
    # errors="replace": `multinode logs` prints a garbled log as it is
    return subprocess.run(list(cmd), cwd=m.wd, capture_output=True, text=True, errors="replace", timeout=600)


def multinode(m: Made, *args: str) -> subprocess.CompletedProcess:
    return run(m, *MULTINODE, *args)


def together(m: Made, commands: dict[str, tuple[str, ...]]) -> dict[str, subprocess.CompletedProcess]:
    """`multinode <args>` for each command at once; their ends, by name."""
    procs = {
        name: subprocess.Popen([*MULTINODE, *args], cwd=m.wd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, errors="replace")
        for name, args in commands.items()
    }  # fmt: skip
    done = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


def rerun(m: Made) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--executor", "multinode", "--jobs", "1", "--latency-wait", "5"]
    return run(m, *cmd, *RERUN)


def said(proc: subprocess.CompletedProcess, path: Path) -> bool:
    return any("damaged state file" in line and str(path) in line for line in (proc.stdout + proc.stderr).splitlines())


def job_ids(m: Made) -> set[str]:
    """The job ids of every record that reads (the damaged one aside)."""
    found = set()
    for path in _state(m).runs.glob("*/*.json"):
        try:
            found.add(json.loads(path.read_text())["jobid"])
        except (ValueError, KeyError, TypeError):
            continue
    return found


def no_new_job(m: Made, cl: Cluster, proc: subprocess.CompletedProcess) -> None:
    text = proc.stdout + proc.stderr
    assert "rule work: SLURM job" not in text and "rule prep: SLURM job" not in text, text
    assert job_ids(m) <= {m.prep, m.work}, job_ids(m)
    assert jobs_from(cl, m.wd) <= {m.prep, m.work}


@pytest.mark.parametrize(("kind", "how"), CASES)
def test_damaged_state_is_said_and_left_out_and_no_job_runs_twice(made, slurm_cluster, kind: Kind, how: str):
    restore(made)
    target = kind.path(made)
    DAMAGE[how](target)
    named = (kind.named or kind.path)(made)
    quiet = how in kind.silent_for
    commands = {  # together: each only reads the state (report writes its own file)
        "status": ("status",), "report": ("report",), "clean": ("clean", "--dry-run"), "logs": ("logs", made.work),
        "provenance": ("provenance", "prep.txt"),
    }  # fmt: skip
    outputs = together(made, commands)
    took = None
    # a file cut short fails the same parse as garbage (the readers' unit tests show both): the commands read it, the
    # Snakemake rerun (seconds a case) is left to the garbage and owner cases
    rerun_it = kind.rerun and how != "truncated"
    if rerun_it:
        started = time.monotonic()
        outputs["snakemake"] = rerun(made)
        took = time.monotonic() - started
    outputs["clean for real"] = multinode(made, "clean")
    for command, proc in outputs.items():
        text = proc.stdout + proc.stderr
        assert "Traceback" not in text, f"{command}:\n{text}"
        wanted = kind.exits.get(command, 0) if how not in kind.silent_for else 0
        assert proc.returncode == wanted, f"{command} exit {proc.returncode}:\n{text}"
    for command in [c for c in kind.said_by if c in outputs] if not quiet else ():
        assert said(outputs[command], named), f"{command} does not name {named}:\n{outputs[command].stderr}"
    if kind.name == "provenance of an output":
        assert "damaged" in outputs["provenance"].stderr and str(named) in outputs["provenance"].stderr
    if rerun_it:
        sm = outputs["snakemake"].stdout + outputs["snakemake"].stderr
        assert f"reattached to SLURM job {made.work} (finished while Snakemake was away" in sm, sm
        assert (made.wd / "out.txt").read_text() == "done\n"
    no_new_job(made, slurm_cluster, outputs.get("snakemake", outputs["clean for real"]))
    figures(f"{kind.name} {how}", rerun_s=f"{took:.1f}" if took else "-", said_by=",".join(
        c for c, p in outputs.items() if said(p, named)) or "-")  # fmt: skip


# --- a state folder that is no folder of ours: the run stops before planning anything --------------------------
def _folder_given_away(m: Made) -> Path:
    folder = _state(m).runs
    os.chown(folder, OTHER_UID, OTHER_UID)
    return folder


def _folder_made_a_file(m: Made) -> Path:
    folder = _state(m).state
    shutil.rmtree(folder)
    folder.write_bytes(bytes(range(128, 256)))
    return folder


@pytest.mark.parametrize(
    "damage", [_folder_given_away, _folder_made_a_file], ids=["runs folder wrong owner", "state folder a file"]
)
def test_a_state_folder_that_is_not_ours_stops_the_run_before_it_submits_naming_it(made, slurm_cluster, damage):
    restore(made)
    folder = damage(made)
    proc = rerun(made)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in text, text
    assert str(folder) in text and "Nothing was submitted" in text, text
    no_new_job(made, slurm_cluster, proc)
    for args in (("status",), ("report",), ("clean", "--dry-run")):
        out = multinode(made, *args)
        assert "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
