"""The job script, the launcher, the job status watch and the training speak one protocol (protocol.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract import jobfiles, protocol
from snakemake_executor_multinode.contract import node_events as node_events_
from snakemake_executor_multinode.planning import jobscript
from snakemake_executor_multinode.planning.request import build_request
from tests.helpers import REPO

PACKAGE = REPO / "snakemake_executor_multinode"
TEMPLATE = PACKAGE / "planning" / "templates" / "job.sh"
# Everything outside protocol.py that names a MULTINODE_* variable.
LAUNCHER, TRACKER = PACKAGE / "launching" / "launcher.py", PACKAGE / "watching" / "job_status.py"
SPEAKERS = [TEMPLATE, LAUNCHER, TRACKER, REPO / "workflows" / "scripts" / "train.py"]


def rendered(tmp_path: Path) -> str:
    req = build_request("train", {"nodes": 2, "gpus": 1})
    ctx = jobscript.ScriptContext(
        command="true", workdir=tmp_path, log_dir=Path("logs"), state_dir=tmp_path / "state", job_name="t"
    )
    return jobscript.render(req, ctx, [])


def test_every_multinode_variable_anyone_reads_or_writes_is_defined_once_in_the_protocol():
    for path in SPEAKERS:
        used = set(re.findall(r"\bMULTINODE_[A-Z_]+\b", path.read_text()))
        assert used <= set(protocol.VARIABLES), f"{path.name}: {used - set(protocol.VARIABLES)}"
    template_vars = set(re.findall(r"\bMULTINODE_[A-Z_]+\b", TEMPLATE.read_text()))
    # the job script sets every one; the container's and the network and node checks' come from the profile
    # (environment.py), the launcher's from the request (JobRequest.launcher_variables), the training's from the
    # launcher
    from_elsewhere = {
        *protocol.CONTAINER_VARIABLES,
        *protocol.NETWORK_CHECK_VARIABLES,
        *protocol.NODE_CHECK_VARIABLES,
        *protocol.LAUNCHER_VARIABLES,
        *protocol.TRAINING_VARIABLES,
    }
    assert template_vars == set(protocol.VARIABLES) - from_elsewhere


def test_the_job_script_exports_what_the_launcher_reads_of_the_rules_resources(tmp_path):
    req = build_request("train", {"nodes": 2, "gpus": 1, "stall_timeout": "20m", "on_stall": "requeue"})
    ctx = jobscript.ScriptContext(
        command="true", workdir=tmp_path, log_dir=Path("logs"), state_dir=tmp_path / "state", job_name="t"
    )
    exports = [line for line in jobscript.render(req, ctx, []).splitlines() if protocol.ON_STALL_VAR in line]
    names = " ".join(f'"${name}"' for name in protocol.LAUNCHER_VARIABLES)
    out = subprocess.run(["bash", "-c", f"{exports[-1]}\nprintf '%s\\n' {names}"], capture_output=True, text=True)
    assert out.stdout.split() == ["1200", "requeue", "3", "3", "warn", "1.5", "120"]  # no spares: no training nodes


def test_python_modules_take_markers_exit_codes_and_ports_from_the_protocol():
    for path in (LAUNCHER, TRACKER, PACKAGE / "planning" / "jobscript.py"):
        text = path.read_text()
        assert not re.search(r"\b85\b|\.exit\b|failed-node|\.preempted|40000|20000", text), path.name
    template = TEMPLATE.read_text()
    assert not re.search(r"\b85\b|\.exit\b|failed-node|\.preempted|40000|20000", template)


def bash(script: str) -> str:
    """What bash prints for `script` (the job script's words), stripped."""
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("suffix", jobfiles.MARKERS)
@pytest.mark.parametrize(
    ("env", "key"), [("SLURM_JOB_ID=42", "42"), ("SLURM_JOB_ID=57 MULTINODE_ARRAY_KEY=40_2", "40_2")]
)
def test_the_job_script_writes_markers_where_the_tracker_reads_them(tmp_path, suffix, env, key):
    """A job's markers are named by its id; an array element's by <array job id>_<task id>, as the plugin knows it."""
    script = rendered(tmp_path)
    assert jobfiles.marker_shell(suffix) in script
    head = script.split("MULTINODE_JOB_NAME=", 1)[0].split("\n# The job's key", 1)[1]  # the template's key lines
    state = tmp_path / "state"
    shell_path = bash(f"{env}\n{head}\nMULTINODE_STATE_DIR={state}; echo {jobfiles.marker_shell(suffix)}")
    assert Path(shell_path) == jobfiles.marker(state, key, suffix)


def test_the_job_script_exits_with_the_protocols_preempted_code(tmp_path):
    assert f"exit {protocol.EXIT_PREEMPTED}\n" in rendered(tmp_path)


@pytest.mark.parametrize("job_id", [1, 57, 9999, 10000, 123456789])
def test_the_job_script_and_the_launcher_derive_the_same_port(job_id):
    shell = bash(f"SLURM_JOB_ID={job_id}; echo {protocol.master_port_shell()}")
    assert int(shell) == protocol.master_port(job_id)
    assert protocol.PORT_BASE <= int(shell) < protocol.PORT_BASE + protocol.PORT_SPAN


def test_steps_of_one_job_and_neighbouring_jobs_get_distinct_ports():
    ports = {protocol.master_port(job, step) for job in range(100, 110) for step in range(protocol.PORTS_PER_JOB)}
    assert len(ports) == 10 * protocol.PORTS_PER_JOB


def test_ports_differ_within_a_cycle_of_job_ids_and_repeat_after_it():
    """What the comments claim (protocol.py, the job script): distinct within PORT_CYCLE ids, the same after it."""
    cycle = protocol.PORT_CYCLE
    assert cycle == 10_000
    assert len({protocol.master_port(job) for job in range(5, 5 + cycle)}) == cycle
    assert protocol.master_port(7) == protocol.master_port(7 + cycle)


def run_job_script(
    tmp_path: Path,
    restart: int,
    own_requeues: int | None = None,
    command: str = f'touch "${protocol.PREEMPT_FILE_VAR}"',
    crashes: str | None = None,
    crash_window_s: int | None = None,
    resources: dict | None = None,
    node_events: Sequence[node_events_.NodeEvent | str] | None = None,
) -> tuple[int, list[str], Path, str]:
    """The rendered job script, run with bash as slurmd would run it (by default a restart of a job whose training
    checkpointed on the pre-time-limit signal); `scontrol` is a stand-in that records its arguments and, for a
    requeue, ends the run as slurmctld does (SIGTERM). `crashes`: the crash marker earlier runs left; `node_events`:
    what the launcher recorded of the job's nodes (an event, or a raw line).
    Returns (exit code, scontrol calls, the state folder, the script's output)."""
    # max_requeues 3, crash loop: 3 runs within 300 s
    req = build_request("train", {"nodes": 1, "gpus": 1, **(resources or {})})
    if crash_window_s is not None:
        req = dataclasses.replace(req, crash_loop_s=crash_window_s)
    state = tmp_path / "state"
    ctx = jobscript.ScriptContext(
        command=command, workdir=tmp_path, log_dir=Path("logs"), state_dir=state, job_name="t",
    )  # fmt: skip
    script = tmp_path / "job.sh"
    script.write_text(jobscript.render(req, ctx, []))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol.calls"
    (bin_dir / "scontrol").write_text(
        f'#!/bin/bash\necho "$*" >> {calls}\ncase "$1" in show) echo node1 ;; requeue) kill -TERM "$PPID" ;; esac\n'
    )
    (bin_dir / "scontrol").chmod(0o755)
    # the job's `multinode` is this checkout's (the node events' reader the script asks)
    (bin_dir / "multinode").write_text(f'#!/bin/sh\nexec {sys.executable} -m snakemake_executor_multinode.cli "$@"\n')
    (bin_dir / "multinode").chmod(0o755)
    state.mkdir()
    (tmp_path / "logs").mkdir()  # the plugin makes the log folder before it submits
    for event in node_events or ():
        path = jobfiles.JobFiles.of(tmp_path / "logs", "42", req.attempt).replacements
        if isinstance(event, str):
            with open(path, "a") as fh:
                fh.write(event)
        else:
            node_events_.append(path, event)
    if own_requeues is not None:
        jobfiles.marker(state, "42", jobfiles.SELF_REQUEUE_MARKER).write_text(f"{own_requeues}\n")
    if crashes is not None:
        jobfiles.marker(state, "42", jobfiles.CRASH_MARKER).write_text(f"{crashes}\n")
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": str(restart),
        "SLURM_JOB_NODELIST": "node1", "HOME": str(tmp_path),
        **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),
    }  # fmt: skip
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    scontrol = calls.read_text().splitlines() if calls.exists() else []
    later = "".join(p.read_text() for p in sorted((tmp_path / "logs").glob("*.log")))  # a restart writes its own log
    return proc.returncode, scontrol, state, proc.stdout + proc.stderr + later


def test_preemptions_and_admin_requeues_do_not_use_up_the_jobs_own_requeue_budget(tmp_path):
    """SLURM's restart count is 3 (three preemptions or admin requeues), the job has not requeued itself yet: it
    does now, and counts it."""
    code, calls, state, _ = run_job_script(tmp_path, restart=3, own_requeues=None)
    assert "requeue 42" in calls, calls
    assert jobfiles.marker(state, "42", jobfiles.SELF_REQUEUE_MARKER).read_text().strip() == "1"
    assert code == 143  # ended by slurmctld's SIGTERM, as a requeued run is


def test_a_requeue_is_said_in_the_log_even_when_slurmctlds_sigterm_comes_before_scontrol_returns(tmp_path):
    """The stand-in scontrol sends the SIGTERM while it runs, as slurmctld may under load: the shell runs its trap
    as soon as scontrol ends, before any line after it (seen in CI: the requeued run's log lacked the line)."""
    code, calls, _, out = run_job_script(tmp_path, restart=0)
    assert "requeue 42" in calls and code == 143, out
    assert out.count("[multinode] requeued; the next run resumes from the checkpoint\n") == 1, out
    assert "[multinode] exit" not in out and "not requeued" not in out, out


def test_a_job_that_used_its_own_requeues_stops_and_a_rerun_resumes(tmp_path):
    code, calls, _, _ = run_job_script(tmp_path, restart=1, own_requeues=3)
    assert not any(c.startswith("requeue") for c in calls) and code == protocol.EXIT_PREEMPTED


# --- what happened to the job's nodes decides its own requeue, through the node events' one reader -----------------
WARNED = node_events_.NodeEvent(node_events_.STRAGGLER, "node2", "straggler: node2 5x slower", action="warn")
REPLACED = node_events_.NodeEvent(node_events_.REPLACED, "node2", "does not answer: the node is down", "node3", 1)
CHECKED_NO_SPARE = node_events_.NodeEvent(node_events_.CHECK_FAILED, "node3", "failed its node check: no GPU", "")
CHECKED_SPARE = node_events_.NodeEvent(node_events_.CHECK_FAILED, "node2", "failed its node check: no GPU", "node3")


@pytest.mark.parametrize("events", [[WARNED], [CHECKED_NO_SPARE], [WARNED, CHECKED_NO_SPARE]])
def test_a_warned_straggler_or_a_spare_that_failed_its_check_never_stops_the_jobs_own_requeue(tmp_path, events):
    code, calls, _, out = run_job_script(tmp_path, restart=0, node_events=events)
    assert "requeue 42" in calls and code == 143, out
    assert "not requeued" not in out, out


@pytest.mark.parametrize("events", [[REPLACED], [WARNED, CHECKED_SPARE]])
def test_a_spare_that_took_a_nodes_place_stops_the_jobs_own_requeue_and_the_retry_resumes(tmp_path, events):
    code, calls, _, out = run_job_script(tmp_path, restart=0, node_events=events)
    assert not any(c.startswith("requeue") for c in calls) and code == protocol.EXIT_PREEMPTED, out
    assert "not requeued by itself: a spare replaced a node in this job" in out, out


def test_a_damaged_node_record_takes_the_safe_path_and_says_why(tmp_path):
    """A line cut short (a full disk) may have been a replacement: unknown is never read as "nothing happened"."""
    code, calls, _, out = run_job_script(tmp_path, restart=0, node_events=[WARNED, '{"job": "42", "event": "repl'])
    assert not any(c.startswith("requeue") for c in calls) and code == protocol.EXIT_PREEMPTED, out
    assert "are damaged (line 2): whether a spare replaced a node is unknown" in out, out


def test_a_takeover_the_launcher_could_not_record_stops_the_requeue_as_the_record_would(tmp_path):
    command = f'touch "${protocol.PREEMPT_FILE_VAR}"; exit {protocol.EXIT_UNRECORDED}'
    code, calls, _, out = run_job_script(tmp_path, restart=0, command=command)
    assert not any(c.startswith("requeue") for c in calls) and code == protocol.EXIT_PREEMPTED, out
    assert "not requeued by itself: a spare replaced a node in this job, or its record is unknown" in out, out


# What the log says before a requeue is what happened: which signal the training checkpointed after, or the stall.
STALLED_STEP = (
    f"{sys.executable} -c 'import os; from snakemake_executor_multinode.launching import stall; "
    'stall.record(os.environ, "stalled: no progress for 20s on any rank; stacks in x.log", "requeue")\'; '
    f"exit {protocol.EXIT_STALLED}"
)  # what the launcher does after a stall with on_stall requeue: the verdict and the requeue request, exit 87


def test_a_requeue_after_a_stall_says_the_watchdog_ended_the_step_and_names_no_signal(tmp_path):
    code, calls, _, out = run_job_script(tmp_path, restart=0, command=STALLED_STEP, resources={"on_stall": "requeue"})
    assert "requeue 42" in calls and code == 143, out
    assert "SIG" not in out and "checkpointed" not in out, out  # no signal was sent, nothing says one was
    assert (
        "[multinode] stalled, ended by the progress watchdog (on_stall: requeue): "
        "stalled: no progress for 20s on any rank; stacks in x.log\n"
    ) in out, out


@pytest.mark.parametrize(
    ("signal", "said"),
    [
        (None, "[multinode] checkpointed after SIGUSR2 (step 7)"),  # the default pre-time-limit signal
        ("B:USR1@90", "[multinode] checkpointed after SIGUSR1 (step 7)"),
        ("SIGTERM@60", "[multinode] checkpointed after SIGTERM (step 7)"),
        ("10@60", "[multinode] checkpointed after signal 10 (step 7)"),
        ("none", "[multinode] checkpointed without a pre-time-limit signal (step 7)"),
    ],
)
def test_a_requeue_after_a_checkpoint_names_the_signal_the_rule_asked_for(tmp_path, signal, said):
    resources = {"signal": signal} if signal else {}
    command = f'echo "step 7" > "${protocol.PREEMPT_FILE_VAR}"'
    code, calls, _, out = run_job_script(tmp_path, restart=0, command=command, resources=resources)
    assert "requeue 42" in calls and code == 143, out
    assert said + "\n" in out and out.count("checkpointed") == 1, out


# --- the crash loop: SLURM runs some failed jobs again (RequeueExit, node failure); the job script bounds it --------


def crash_marker(state: Path) -> str:
    return jobfiles.marker(state, "42", jobfiles.CRASH_MARKER).read_text().strip()


def test_the_third_quick_failure_in_a_row_ends_the_job_with_the_crash_loop_code_and_its_last_error(tmp_path):
    code, _, state, out = run_job_script(tmp_path, restart=2, command="exit 3", crashes="2 3")
    assert code == protocol.EXIT_CRASH_LOOP
    assert crash_marker(state) == "3 3"
    assert "crash loop: 3 runs in a row failed within 300 s of their start, the last with exit 3" in out


def test_a_first_quick_failure_keeps_its_own_exit_code_and_starts_the_count(tmp_path):
    code, _, state, _ = run_job_script(tmp_path, restart=1, command="exit 3")
    assert (code, crash_marker(state)) == (3, "1 3")


def test_a_failure_after_the_window_breaks_the_streak(tmp_path):
    code, _, state, _ = run_job_script(tmp_path, restart=2, command="exit 3", crashes="2 3", crash_window_s=0)
    assert (code, crash_marker(state)) == (3, "0 3")


def test_slurms_sigterm_neither_counts_nor_breaks_the_streak(tmp_path):
    """Preemption, admin requeue, scancel: the run ends with 143, which is SLURM's decision, not a crash."""
    code, _, state, _ = run_job_script(tmp_path, restart=2, command="exit 143", crashes="2 3")
    assert (code, crash_marker(state)) == (143, "2 3")


def test_success_ends_the_job_whatever_the_streak(tmp_path):
    code, _, state, _ = run_job_script(tmp_path, restart=2, command="true", crashes="2 3")
    assert (code, crash_marker(state)) == (0, "2 3")


def test_a_first_run_forgets_the_crashes_of_an_earlier_job_with_the_same_id(tmp_path):
    code, _, state, _ = run_job_script(tmp_path, restart=0, command="exit 3", crashes="2 3")
    assert (code, crash_marker(state)) == (3, "1 3")


def test_an_exit_marker_that_cannot_be_written_is_said_and_the_job_ends_with_its_own_code(tmp_path):
    """The state folder full (here: the marker's temp name taken by a folder, so the write fails): the job script
    says so in the log, leaves nothing half-written, and ends at once with the rule's exit code; the job status watch
    learns of the end from SLURM's sweep instead (tests/cluster/test_disk_full_cluster.py)."""
    taken = jobfiles.marker(tmp_path / "state", "42", jobfiles.EXIT_MARKER + ".tmp")
    code, _, state, out = run_job_script(tmp_path, restart=0, command=f"mkdir -p {taken}; exit 3")
    assert code == 3, out
    marker = jobfiles.marker(state, "42", jobfiles.EXIT_MARKER)
    assert not marker.exists()
    said = re.search(
        r"^\[multinode\] cannot write the exit marker (\S+): (\d+) bytes needed, (\d+) bytes free in (\S+);", out, re.M
    )
    assert said, out
    assert (said[1], int(said[2]), said[4]) == (str(marker), len("3 0 t\n"), str(state))
    assert "write error" not in out and "Is a directory" not in out  # one line of ours, not bash's


# --- preemption: SLURM ends the run; the job neither ends itself nor requeues itself -------------------------------


def started_job_script(
    tmp_path: Path, command: str, restart: int = 0, notice: bool = False
) -> tuple[subprocess.Popen, Path, Path]:
    """The rendered job script started with bash as slurmd starts it (scontrol a recording stand-in, `multinode` one
    that says it was asked), for a test that sends it SLURM's SIGTERM; `notice`: an earlier run's preemption notice
    is there. (process, state folder, scontrol calls)."""
    req = build_request("train", {"nodes": 1, "gpus": 1})
    state = tmp_path / "state"
    ctx = jobscript.ScriptContext(
        command=command, workdir=tmp_path, log_dir=Path("logs"), state_dir=state, job_name="t"
    )  # fmt: skip
    (tmp_path / "job.sh").write_text(jobscript.render(req, ctx, []))
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol.calls"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "$*" >> {calls}\n[ "$1" != show ] || echo node1\n')
    (bin_dir / "multinode").write_text('#!/bin/bash\necho "multinode $*"\n')
    for name in ("scontrol", "multinode"):
        (bin_dir / name).chmod(0o755)
    state.mkdir()
    if notice:
        jobfiles.marker(state, "42", jobfiles.PREEMPT_NOTICE_MARKER).write_text("{}\n")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": str(restart),
           "SLURM_JOB_NODELIST": "node1", "HOME": str(tmp_path)}  # fmt: skip
    out = (tmp_path / "out.txt").open("w")
    proc = subprocess.Popen(["bash", str(tmp_path / "job.sh")], cwd=tmp_path, env=env, stdout=out, stderr=out)
    return proc, state, calls


def said(tmp_path: Path, line: str, proc: subprocess.Popen) -> str:
    """The script's output once it has said `line` (the event a test waits for)."""
    deadline = time.monotonic() + 60
    while line not in (text := (tmp_path / "out.txt").read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, text
        time.sleep(0.05)
    return text


PREEMPTED_AND_SAVED = (
    f'echo "{{}}" > "${protocol.PREEMPT_NOTICE_FILE_VAR}"; echo "step 6" > "${protocol.PREEMPT_FILE_VAR}"'
)


def test_a_run_checkpointed_on_preemption_waits_for_slurms_end_neither_requeueing_nor_counting_itself(tmp_path):
    """The labeller noted SLURM's preemption and the training checkpointed: the job script says so and waits; SLURM's
    SIGTERM at the grace time's end ends it with exit 85 (checkpointed). No scontrol requeue, no budget used: SLURM
    requeues (REQUEUE) or ends (CANCEL) the job."""
    proc, state, calls = started_job_script(tmp_path, PREEMPTED_AND_SAVED)
    try:
        said(tmp_path, "SLURM ends this run when its grace time ends", proc)
        time.sleep(0.5)
        assert proc.poll() is None  # it waits for SLURM
        proc.send_signal(signal.SIGTERM)  # the grace time's end
        assert proc.wait(timeout=30) == protocol.EXIT_PREEMPTED
    finally:
        proc.kill()
    out = (tmp_path / "out.txt").read_text()
    assert "[multinode] checkpointed on preemption (step 6)\n" in out
    assert f"[multinode] exit {protocol.EXIT_PREEMPTED}," in out
    assert not any(c.startswith("requeue") for c in (calls.read_text().splitlines() if calls.exists() else []))
    assert not jobfiles.marker(state, "42", jobfiles.SELF_REQUEUE_MARKER).exists()
    exit_marker = jobfiles.marker(state, "42", jobfiles.EXIT_MARKER).read_text().split()
    assert exit_marker[:2] == [str(protocol.EXIT_PREEMPTED), "0"]


def test_a_preempted_run_whose_training_did_not_checkpoint_still_waits_for_slurm(tmp_path):
    """A training that does not handle the checkpoint signal (it died of it): the job does not end now, which SLURM
    would take for a finished job and never requeue."""
    proc, _, _ = started_job_script(tmp_path, f'echo "{{}}" > "${protocol.PREEMPT_NOTICE_FILE_VAR}"; exit 1')
    try:
        said(tmp_path, "[multinode] preempted: the command ended with exit 1, without a checkpoint", proc)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 1
    finally:
        proc.kill()


def test_a_restart_after_a_preemption_names_the_preemptor_and_forgets_the_old_notice(tmp_path):
    proc, state, _ = started_job_script(tmp_path, "true", restart=1, notice=True)  # the previous run's notice
    assert proc.wait(timeout=60) == 0
    assert "multinode preempted-by " in (tmp_path / "out.txt").read_text()  # the line that names the preemptor
    assert not jobfiles.marker(state, "42", jobfiles.PREEMPT_NOTICE_MARKER).exists()
    first = tmp_path / "first"  # a first run: a notice there is an earlier job's of the same id
    first.mkdir()
    proc, state, _ = started_job_script(first, "true", restart=0, notice=True)
    assert proc.wait(timeout=60) == 0
    assert "preempted-by" not in (first / "out.txt").read_text()
    assert not jobfiles.marker(state, "42", jobfiles.PREEMPT_NOTICE_MARKER).exists()


def test_a_checkpoint_for_a_cancel_ends_the_job_with_85_at_once_without_a_requeue(tmp_path):
    """`multinode cancel --checkpoint` wrote its marker and the training checkpointed: the job ends, not requeued, and
    the next snakemake resumes."""
    command = (f'echo "multinode cancel --checkpoint, 10:00:00" > "${protocol.CANCEL_FILE_VAR}"; '
               f'echo "step 7" > "${protocol.PREEMPT_FILE_VAR}"')  # fmt: skip
    code, calls, state, out = run_job_script(tmp_path, restart=0, command=command)
    assert code == protocol.EXIT_PREEMPTED, out
    assert not any(c.startswith("requeue") for c in calls)
    assert "[multinode] checkpointed for a cancel (multinode cancel --checkpoint, 10:00:00); not requeued" in out
    assert not jobfiles.marker(state, "42", jobfiles.SELF_REQUEUE_MARKER).exists()


def test_a_training_that_finished_its_work_as_slurm_preempted_it_ends_the_job_with_success(tmp_path):
    """The notice came, but the command ended well without a checkpoint (its last step): done, not waiting for a
    requeue that would run it again."""
    proc, _, _ = started_job_script(tmp_path, f'echo "{{}}" > "${protocol.PREEMPT_NOTICE_FILE_VAR}"; exit 0')
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert "[multinode] exit 0," in (tmp_path / "out.txt").read_text()


def test_a_run_after_one_that_ended_well_has_nothing_to_do(tmp_path):
    """SLURM 24.11 runs a job once more after it ended with exit 0 where a preemption had requeued it before: the
    command does not run again (its outputs are made), and the log says why."""
    runs = tmp_path / "logs" / "42.attempt1.runs.jsonl"
    runs.parent.mkdir()
    runs.write_text('{"event": "end", "job": "42", "restart": 1, "exit": 0, "time": "2026-12-06T07:11:02+00:00"}\n')
    proc, _, _ = started_job_script(tmp_path, "touch ran", restart=2)
    assert proc.wait(timeout=60) == 0
    assert not (tmp_path / "ran").exists()
    said = (tmp_path / "logs" / "42.attempt1.restart2.log").read_text()  # a restart writes its own log
    assert "[multinode] run 1 of this job ended with exit 0; SLURM ran the job again" in said, said
    again = tmp_path / "again"  # a run that ended with 85 (checkpointed): the next run trains on
    (again / "logs").mkdir(parents=True)
    (again / "logs" / runs.name).write_text(runs.read_text().replace('"exit": 0,', '"exit": 85,'))
    proc, _, _ = started_job_script(again, "touch ran", restart=2)
    assert proc.wait(timeout=60) == 0 and (again / "ran").exists()


# --- each run's end in the runs file: why it ended, where the job script knows (`multinode status` says it) ---------


def runs_lines(tmp_path: Path) -> list[dict]:
    path = jobfiles.JobFiles.of(tmp_path / "logs", "42", 1).runs
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_run_that_requeues_itself_writes_a_requeue_line_saying_why_and_no_end_line(tmp_path):
    code, _, _, out = run_job_script(tmp_path, restart=0)
    assert code == 143, out
    assert [(x["event"], x["restart"]) for x in runs_lines(tmp_path)] == [("start", 0), ("requeue", 0)]
    assert runs_lines(tmp_path)[1]["why"] == "checkpointed before the time limit"


def test_a_stall_that_requeues_the_job_says_so_in_its_requeue_line(tmp_path):
    code, _, _, out = run_job_script(tmp_path, restart=0, command=STALLED_STEP, resources={"on_stall": "requeue"})
    assert code == 143, out
    assert runs_lines(tmp_path)[-1]["why"] == "stalled: ended by the progress watchdog, on_stall requeue"


def test_a_checkpoint_that_is_not_requeued_says_why_in_the_end_line(tmp_path):
    code, _, _, out = run_job_script(tmp_path, restart=1, own_requeues=3)
    assert code == protocol.EXIT_PREEMPTED, out
    end = runs_lines(tmp_path)[-1]
    assert (end["event"], end["exit"]) == ("end", protocol.EXIT_PREEMPTED), end
    assert end["why"] == (
        "checkpointed before the time limit; not requeued: its own requeues are used up (--multinode-max-requeues 3)"
    )
    (tmp_path / "spare").mkdir()
    run_job_script(tmp_path / "spare", restart=0, node_events=[REPLACED])
    assert runs_lines(tmp_path / "spare")[-1]["why"] == (
        "checkpointed before the time limit; not requeued: a spare replaced a node in this job, or its record is "
        "unknown"
    )


@pytest.mark.parametrize(
    ("command", "why"),
    [
        (f'echo node2 > "${protocol.FAILED_NODE_FILE_VAR}"; exit 1', "failing node node2"),
        (f'echo stalled > "${protocol.STALL_FILE_VAR}"; exit {protocol.EXIT_STALLED}',
         "stalled: ended by the progress watchdog"),
        (f'echo stalled > "${protocol.STALL_FILE_VAR}"; echo node2 > "${protocol.FAILED_NODE_FILE_VAR}"; exit 87',
         "stalled: ended by the progress watchdog; failing node node2"),
        (f"printf 'no\\\\\"de' > \"${protocol.FAILED_NODE_FILE_VAR}\"; exit 1", ""),  # no host name: not copied
        ("exit 3", ""),
    ],
)  # fmt: skip
def test_a_failed_run_names_in_its_end_line_the_stall_and_the_node_the_launcher_blamed(tmp_path, command, why):
    code, _, _, out = run_job_script(tmp_path, restart=0, command=command)
    end = runs_lines(tmp_path)[-1]  # a whole JSON line whatever the marker held
    assert (end["event"], end["exit"], end["why"]) == ("end", code, why), out
