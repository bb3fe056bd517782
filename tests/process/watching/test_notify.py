"""The notify command (watching/notify.py): one JSON object per event on its stdin, run in the background, killed
after its timeout, warned of once; a missing command stops the run before anything is submitted. Verdicts wait for
events (a file the command writes, its process gone), never for a duration."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import STALL_MARKER, JobFiles, StateFolders
from snakemake_executor_multinode.planning.settings import SettingsError
from snakemake_executor_multinode.session import Session, Settings
from snakemake_executor_multinode.slurm.client import JobState
from snakemake_executor_multinode.watching.job_status import Outcome
from snakemake_executor_multinode.watching.notify import Notice, Notices, Notifier, command
from snakemake_executor_multinode.watching.registry import Submission
from tests.helpers import alive, wait_for

FIELDS = {"event", "run", "job", "rule", "nodes", "reason", "log", "time"}


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)
    return path


def recorder(tmp_path: Path) -> tuple[list[str], Path]:
    """A notify command that appends each notice to events.jsonl (the argument only shows that words pass)."""
    events = tmp_path / "events.jsonl"
    path = script(tmp_path, "record.sh", f'[ "$1" = --tag ] || exit 9; cat >> {events}')
    return [str(path), "--tag"], events


def told(events: Path) -> list[dict]:
    return [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []


def test_each_notice_reaches_the_command_as_one_json_object_on_stdin_in_order(tmp_path):
    argv, events = recorder(tmp_path)
    said: list[str] = []
    n = Notifier(argv, 30, said.append)
    n.send(Notice("started", "run1", "41", "train", "node[1-2]", "first run", "/logs/41.log"))
    n.send(Notice("finished", "run1", "41", "train", "node[1-2]", "job script exit 0", "/logs/41.log"))
    n.close()
    first, second = told(events)
    assert set(first) == FIELDS and said == []
    assert (first["event"], first["job"], first["rule"], first["nodes"], first["log"]) == (
        "started", "41", "train", "node[1-2]", "/logs/41.log",
    )  # fmt: skip
    assert (second["event"], second["reason"]) == ("finished", "job script exit 0")


def test_the_caller_goes_on_while_the_command_runs(tmp_path):
    """The command cannot end before the test creates `release`, which it does only once send() has returned."""
    done = tmp_path / "done"
    release = tmp_path / "release"
    wait = script(tmp_path, "wait.sh", f"cat >/dev/null; while [ ! -e {release} ]; do sleep 0.1; done; touch {done}")
    n = Notifier([str(wait)], 600, print)
    n.send(Notice("started", "run1", "41", "train"))
    assert not done.exists()
    release.touch()
    wait_for(done.exists, "the command's end after the release", 60)
    n.close()


def test_a_hanging_command_is_killed_with_its_children_after_its_timeout_and_warned_of_once(tmp_path):
    pids = tmp_path / "pids"
    # the command and a child of its own both hang; each writes its pid first: the event the test waits for
    hang = script(tmp_path, "hang.sh", f"sleep 600 & echo $! >> {pids}; echo $$ >> {pids}; wait")
    said: list[str] = []
    n = Notifier([str(hang)], 1, said.append)
    n.send(Notice("started", "run1", "41", "train"))
    started = wait_for(lambda: len(lines := pids.read_text().split() if pids.exists() else []) == 2 and lines,
                       "the hanging command's pids", 60)  # fmt: skip
    child, parent = (int(p) for p in started)
    wait_for(lambda: not alive(parent, "hang.sh") and not alive(child, "sleep"), "the killed command and child", 60)
    n.send(Notice("finished", "run1", "41", "train"))
    n.close()
    assert len(said) == 1, said
    assert str(hang) in said[0] and "did not end within 1 s (--multinode-notify-timeout) and was killed" in said[0]


def test_a_failing_command_is_warned_of_once_with_its_error_and_every_notice_is_still_tried(tmp_path):
    tries = tmp_path / "tries"
    fail = script(tmp_path, "fail.sh", f"cat >> {tries}; echo 'webhook said 404' >&2; exit 3")
    said: list[str] = []
    n = Notifier([str(fail)], 30, said.append)
    for event in ("started", "failed", "run_finished"):
        n.send(Notice(event, "run1", "41", "train"))
    n.close()
    assert len(tries.read_text().splitlines()) == 3
    assert len(said) == 1 and "exited with 3: webhook said 404" in said[0] and str(fail) in said[0], said


def test_a_notify_command_that_does_not_exist_is_an_error_naming_the_setting(tmp_path):
    with pytest.raises(SettingsError, match=r"^--multinode-notify='no-such-notifier --x': no command 'no-such"):
        command("no-such-notifier --x")
    with pytest.raises(SettingsError, match=r"names no command"):
        command("  ")
    with pytest.raises(SettingsError, match=r"not a command line"):
        command("notify 'unclosed")
    assert command("true --x") == [shutil.which("true"), "--x"]
    # the session refuses it at its start: before any plan, so before anything is submitted
    with pytest.raises(SettingsError, match=r"--multinode-notify='./missing.sh'"):
        Session(Settings(snapshot="off", notify="./missing.sh"), tmp_path)
    with pytest.raises(SettingsError, match=r"--multinode-notify-timeout=0: more than 0 seconds"):
        Session(Settings(snapshot="off", notify="true", notify_timeout=0), tmp_path)


def sub_with_log(tmp_path: Path) -> Submission:
    log = tmp_path / "logs" / "41.attempt1.log"
    log.parent.mkdir(parents=True)
    return Submission("run1", "train", {}, ("out.txt",), "name", 1, "script", jobid="41", log=str(log))


def test_a_jobs_events_are_told_once_each_in_the_order_the_run_sees_them(tmp_path):
    argv, events = recorder(tmp_path)
    state = StateFolders(tmp_path).state
    state.mkdir(parents=True)
    clock = [0.0]
    notices = Notices(Notifier(argv, 30, print), "run1", state, clock=lambda: clock[0])
    sub = sub_with_log(tmp_path)
    files = JobFiles.from_log(sub.log)
    running = Outcome("41", False)
    notices.cycle([(sub, running)])  # not started yet: nothing
    files.runs.write_text('{"event": "start", "job": "41", "restart": 0, "nodes": "n[1-2]"}\n')
    for _ in range(3):  # the files are read every CHECK_SECONDS; each start is told once
        clock[0] += 5
        notices.cycle([(sub, running)])
    files.replacements.write_text('{"event": "replaced", "node": "n2", "spare": "n3", "why": "exited with 1"}\n')
    (state / f"41{STALL_MARKER}").write_text("stalled: no progress for 1m on any rank\n")
    clock[0] += 5
    notices.cycle([(sub, running)])
    with files.runs.open("a") as fh:  # the next run started before the cycle that sees the requeue: told after it
        fh.write('{"event": "end", "restart": 0, "exit": 143}\n')
        fh.write('{"event": "start", "job": "41", "restart": 1, "nodes": "n[1,3]"}\n')
    notices.cycle([(sub, Outcome("41", False, note="requeued (the run ended with exit 143), restart 1"))])
    # the job ends before a cycle read the second start (within CHECK_SECONDS): its end tells it first
    ended = Outcome("41", True, False, 1, JobState("41", "FAILED", nodes="n[1,3]"),
                    stalled="stalled: no progress for 1m on any rank")  # fmt: skip
    notices.end(sub, ended)
    notices.run_end()
    got = told(events)
    assert [(e["event"], e["nodes"]) for e in got] == [
        ("started", "n[1-2]"), ("node_replaced", "n2"), ("stalled", "n[1-2]"), ("requeued", "n[1-2]"),
        ("started", "n[1,3]"), ("failed", "n[1,3]"), ("run_finished", ""),
    ]  # fmt: skip
    assert all(set(e) == FIELDS and e["run"] == "run1" for e in got)
    assert {e["job"] for e in got[:-1]} == {"41"} and got[-1]["job"] is None and got[-1]["rule"] is None
    assert got[1]["reason"] == "n2 replaced by n3 (exited with 1)"
    assert got[3]["reason"].startswith("requeued (the run ended with exit 143)")
    assert got[0]["log"] == sub.log and got[4]["log"] == str(files.restart(1).log)
    assert got[4]["reason"] == "restart 1" and "job script exit 1" in got[5]["reason"]
    assert got[6]["reason"] == "0 job(s) finished, 1 failed"


def test_without_the_setting_nothing_is_read_or_told(tmp_path):
    notices = Notices(None, "run1", tmp_path)
    sub = sub_with_log(tmp_path)
    JobFiles.from_log(sub.log).runs.write_text('{"event": "start", "job": "41", "restart": 0, "nodes": "n1"}\n')
    notices.cycle([(sub, Outcome("41", False))])
    notices.end(sub, Outcome("41", True, True, 0))
    notices.run_end()
    assert notices.ended == {"finished": 0, "failed": 0}
