"""`multinode status` and `multinode cancel` without a cluster: the registry's runs, SLURM's answers (recorded on the
local cluster, slurm-wlm 22.05.8) parsed into rows, and the table. The real runs are in
tests/cluster/test_status_view_cluster.py."""

from __future__ import annotations

import argparse
import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from snakemake_executor_multinode.cli import runs
from snakemake_executor_multinode.contract.jobfiles import EXIT_MARKER, STATE_DIR, JobFiles, marker
from snakemake_executor_multinode.slurm.client import QueryError, SlurmClient
from snakemake_executor_multinode.watching import status_view
from snakemake_executor_multinode.watching.registry import Registry
from tests.helpers import FakeSlurm, record

# sacct --duplicates -P -n -X -o JobIDRaw,State,Reason,ElapsedRaw,TimelimitRaw,NNodes,AllocTRES,ReqTRES
# 239 was requeued once (scontrol requeue) and ran again; 227 is held, 228 waits for a dependency; 440 is a 2 x 2
SACCT = """\
227|PENDING|JobHeldUser|0|Partition_Limit|1||billing=1,cpu=1,mem=1G,node=1
228|PENDING|Dependency|0|Partition_Limit|1||billing=1,cpu=1,mem=1G,node=1
239|REQUEUED|None|3|Partition_Limit|1|billing=1,cpu=1,mem=1G,node=1|billing=1,cpu=1,mem=1G,node=1
239|COMPLETED|BeginTime|30|UNLIMITED|1|billing=1,cpu=1,mem=1G,node=1|billing=1,cpu=1,mem=1G,node=1
440|RUNNING|None|13|30|2|billing=4,cpu=4,gres/gpu=4,mem=4G,node=2|billing=4,cpu=4,gres/gpu=4,mem=4G,node=2
448|PENDING|Dependency|0|30|1||billing=1,cpu=1,mem=1G,node=1
"""
# squeue -h -t all -O JobID:|,State:|,Reason:|,RestartCnt:|,TimeUsed:|,TimeLimit:|,NumNodes:|,tres-per-node:|
SQUEUE = """\
440|RUNNING|None|2|0:13|30:00|2|gres:gpu:2|
448|PENDING|Dependency|0|0:00|30:00|1|N/A|
"""
NO_ACCOUNTING = "sacct: error: Slurm accounting storage is disabled"
CTLD_DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


def test_sacct_rows_give_state_reason_shape_time_and_restarts():
    client = SlurmClient(runner=FakeSlurm(sacct=(0, SACCT, "")))
    views = status_view.slurm_views(client, ["227", "228", "239", "440", "448"])
    assert views["239"].state == "COMPLETED" and views["239"].restarts == 1  # its runs, oldest first
    assert views["239"].limit_s is None and views["239"].elapsed_s == 30
    assert (views["227"].state, views["227"].reason, views["227"].restarts) == ("PENDING", "JobHeldUser", 0)
    assert (views["440"].nodes, views["440"].gpus_per_node) == (2, 2)  # AllocTRES counts the whole job
    assert (views["440"].elapsed_s, views["440"].limit_s) == (13, 1800)
    assert views["448"].gpus_per_node == 0  # pending: ReqTRES, no GPU in it


def test_slurmctld_answers_for_the_jobs_it_holds_in_one_squeue():
    fake = FakeSlurm(squeue=(0, SQUEUE, ""))
    views = status_view.slurm_views(SlurmClient(runner=fake), ["448", "440", "440"])
    assert [c[0] for c in fake.calls] == ["squeue"]  # every job known: no sacct
    cmd = fake.calls[0]
    assert cmd[cmd.index("-j") + 1] == "440,448" and cmd[cmd.index("-O") + 1].startswith("JobID:|,State:|")
    assert views["440"].state == "RUNNING" and (views["440"].nodes, views["440"].gpus_per_node) == (2, 2)
    assert (views["440"].elapsed_s, views["440"].limit_s, views["440"].restarts) == (13, 1800, 2)
    assert views["448"].reason == "Dependency" and views["448"].gpus_per_node == 0


def test_the_jobs_slurmctld_forgot_come_from_one_sacct():
    fake = FakeSlurm(squeue=(0, SQUEUE, ""), sacct=(0, SACCT, ""))
    views = status_view.slurm_views(SlurmClient(runner=fake), ["239", "440", "448"])
    assert [c[0] for c in fake.calls] == ["squeue", "sacct"]
    cmd = fake.called("sacct")[0]
    assert cmd[:2] == ["sacct", "--duplicates"] and "-X" in cmd and cmd[cmd.index("-j") + 1] == "239"
    assert views["239"].state == "COMPLETED" and views["239"].restarts == 1


def test_without_accounting_the_jobs_slurmctld_forgot_are_left_out():
    fake = FakeSlurm(squeue=(0, SQUEUE, ""), sacct=(1, "", NO_ACCOUNTING))
    views = status_view.slurm_views(SlurmClient(runner=fake), ["239", "440"])
    assert "239" not in views and views["440"].state == "RUNNING"


def test_with_slurmctld_down_accounting_answers_and_with_both_down_the_query_fails():
    fake = FakeSlurm(squeue=(1, "", CTLD_DOWN), sacct=(0, SACCT, ""))
    assert status_view.slurm_views(SlurmClient(runner=fake), ["440"])["440"].state == "RUNNING"
    down = FakeSlurm(squeue=(1, "", CTLD_DOWN), sacct=(1, "", NO_ACCOUNTING))
    with pytest.raises(QueryError, match="Unable to contact slurm controller"):
        status_view.slurm_views(SlurmClient(runner=down), ["440"])


def test_latest_is_the_run_that_started_last_and_runs_without_submissions_do_not_count(tmp_path):
    record(tmp_path, "aaaa1111", "train", "10", at=100.0)
    record(tmp_path, "bbbb2222", "train", "20", at=200.0)
    Registry(tmp_path, "cccc3333")  # a later start with nothing to do
    table = status_view.run_table(tmp_path)
    assert list(table) == ["aaaa1111", "bbbb2222"]
    assert status_view.resolve_run(table, "latest") == "bbbb2222"
    assert status_view.resolve_run(table, "aaa") == "aaaa1111"
    with pytest.raises(status_view.RunNotFound, match="no run with id 'zz'"):
        status_view.resolve_run(table, "zz")
    with pytest.raises(status_view.RunNotFound, match="no run has submitted"):
        status_view.resolve_run(status_view.run_table(tmp_path / "empty"), "latest")


def test_rows_say_what_slurm_and_the_files_say(tmp_path):
    run = "aaaa1111"
    train = record(tmp_path, run, "train", "440", at=1.0)
    record(tmp_path, run, "evaluate", "448", at=2.0, wildcards={"split": "val"})
    record(tmp_path, run, "lost", None, at=3.0)
    old = record(tmp_path, run, "old", "12", at=4.0)
    log = Path(train.log)
    log.parent.mkdir(parents=True)
    log.touch()
    JobFiles.from_log(log).restart(1).log.touch()  # the rerun after a requeue writes its own log
    JobFiles.from_log(log).restart(2).log.touch()
    Path(old.log).parent.mkdir(parents=True)
    JobFiles.from_log(old.log).restart(1).log.touch()
    metrics = JobFiles.from_log(log).metrics
    metrics.write_text(json.dumps({"step": 3, "steps": 10, "loss": 4.7, "step_ms": 2000}) + "\n")
    (tmp_path / STATE_DIR).mkdir(parents=True)
    marker(tmp_path / STATE_DIR, "12", EXIT_MARKER).write_text("0 0\n")
    fake = FakeSlurm(sacct=(1, "", NO_ACCOUNTING), squeue=(0, SQUEUE, ""))
    rows = {
        r.rule: r for r in status_view.collect(tmp_path, status_view.run_table(tmp_path)[run], SlurmClient(runner=fake))
    }
    assert rows["train"].state == "RUNNING" and rows["train"].restarts == 2  # squeue's RestartCnt
    assert rows["train"].log == str(JobFiles.from_log(log).restart(2).log)  # the current run's log
    assert rows["train"].progress == "step 3/10 loss 4.7 ETA 14s"  # ETA while it runs
    assert (rows["evaluate"].state, rows["evaluate"].reason, rows["evaluate"].wildcards) == (
        "PENDING",
        "Dependency",
        "split=val",
    )
    assert rows["lost"].state == "UNSUBMITTED" and rows["lost"].jobid is None
    assert (rows["old"].state, rows["old"].reason) == ("ENDED", "exit 0")  # SLURM forgot it; the marker did not
    assert rows["old"].restarts == 1  # counted from its restart logs
    text = status_view.render(run, list(rows.values()), tmp_path)
    lines = text.splitlines()
    assert lines[0].startswith(f"run {run}: 4 job(s), ")
    assert lines[1].split() == ["RULE", "JOBID", "STATE", "NODESxGPUS", "ELAPSED/LIMIT", "RESTARTS", "PROGRESS", "LOG"]
    train_line = next(line for line in lines if line.startswith("train "))
    assert "440" in train_line and "2x2" in train_line and "0:00:13/0:30:00" in train_line
    assert "logs/rule_train/_/440.attempt1.restart2.log" in train_line
    assert "PENDING (Dependency)" in text and "evaluate[split=val]" in text


def test_a_finished_training_shows_its_last_step_without_an_eta(tmp_path):
    sub = record(tmp_path, "r1", "train", "239", at=1.0)
    Path(sub.log).parent.mkdir(parents=True)
    JobFiles.from_log(sub.log).metrics.write_text(json.dumps({"step": 10, "steps": 10, "step_ms": 5}) + "\n")
    rows = status_view.collect(tmp_path, [sub], SlurmClient(runner=FakeSlurm(sacct=(0, SACCT, ""))))  # squeue: gone
    assert (rows[0].state, rows[0].restarts, rows[0].progress) == ("COMPLETED", 1, "step 10/10")


def test_watch_redraws_a_terminal_and_appends_to_a_pipe():
    out: list[str] = []
    count = iter(range(3))

    def sleep(seconds: float) -> None:
        if next(count) == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        status_view.watch(lambda: "table", 5, out.append, tty=True, sleep=sleep)
    assert out == ["\x1b[H\x1b[2Jtable"] * 2
    out.clear()

    def stop(seconds: float) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        status_view.watch(lambda: "table", 5, out.append, tty=False, sleep=stop)
    assert out == ["table\n"]


def test_cancel_cancels_the_runs_queued_and_running_jobs_and_no_other(tmp_path, monkeypatch, capsys):
    record(tmp_path, "mine0001", "train", "440", at=1.0)
    record(tmp_path, "mine0001", "evaluate", "448", at=2.0)
    record(tmp_path, "mine0001", "done", "239", at=3.0)
    record(tmp_path, "other002", "train", "227", at=4.0)  # newer, and running: not the run asked for
    fake = FakeSlurm(sacct=(0, SACCT, ""))
    monkeypatch.setattr(runs, "_client", lambda: SlurmClient(runner=fake))
    args = argparse.Namespace(directory=tmp_path, run="mine", checkpoint=False, wait=300.0)
    assert runs.cancel_command(args) == 0
    assert fake.called("scancel") == [["scancel", "440", "448"]]  # 239 had ended; 227 is another run's
    assert "run mine0001: cancelled SLURM job(s) 440 448" in capsys.readouterr().out


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S%z")


def test_a_running_jobs_goodput_so_far_is_the_ledger_of_its_runs_as_its_runs_file_times_them(tmp_path):
    files = JobFiles.from_log(tmp_path / "501.attempt1.log")
    t0 = 1_800_000_000
    runs_lines = [
        {"event": "start", "job": "501", "restart": 0, "nodes": "n[1-2]", "time": iso(t0)},
        {"event": "start", "job": "501", "restart": 1, "nodes": "n[1-2]", "time": iso(t0 + 400)},
    ]  # the first run requeued itself: no end line; its log's last write ends it
    files.runs.write_text("".join(json.dumps(x) + "\n" for x in runs_lines))
    files.log.write_text("[multinode] requeued\n")
    os.utime(files.log, (t0 + 300, t0 + 300))
    metrics = [
        {"step": 40, "wall": t0 + 100},
        {"event": "checkpoint_begin", "step": 40, "wall": t0 + 100},
        {"event": "checkpoint_end", "step": 40, "wall": t0 + 150},
        {"event": "resume", "step": 40, "wall": t0 + 450},
        {"step": 50, "wall": t0 + 600},
    ]
    files.metrics.write_text("".join(json.dumps(x) + "\n" for x in metrics))
    spans = status_view.run_spans(files, 2, 4, now=t0 + 700)
    assert [(s.start - t0, s.end - t0) for s in spans] == [(0, 300), (400, 700)]
    shown = status_view.goodput_so_far(str(files.log), 2, 4, now=t0 + 700)
    assert shown == "25% of 1.33 GPU-h (startup 25%, checkpoint 8%, teardown 42%)"
    row = status_view.JobRow("train", "", 1, "501", "RUNNING", goodput=shown)
    text = status_view.render("r", [row], tmp_path)
    assert "goodput so far (productive share of the allocation; the rest):" in text
    assert f"  train (job 501): {shown}" in text


def test_a_running_job_without_metrics_has_its_goodput_unknown(tmp_path):
    files = JobFiles.from_log(tmp_path / "7.attempt1.log")
    files.runs.write_text(json.dumps({"event": "start", "restart": 0, "time": iso(1_800_000_000)}) + "\n")
    shown = status_view.goodput_so_far(str(files.log), 1, 0, now=1_800_003_600)
    # no rank printed a line yet (or the job has a launcher of its own): nothing tells startup from work
    assert shown == "unknown (no metrics) of 1.00 node-h (unknown 100%)"
    files.first_output("node1").write_text(f"{1_800_000_000 + 360}\n")  # `multinode torchrun`: the first rank line
    shown = status_view.goodput_so_far(str(files.log), 1, 0, now=1_800_003_600)
    assert shown == "unknown (no metrics) of 1.00 node-h (startup 10%, unknown 90%)"
