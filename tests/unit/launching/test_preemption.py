"""What a preempted run says and records (launching/preemption.py): the notice's line, how long saves take, and the
launcher's verdict (checkpointed in time, the grace time too short, a training that ignores the signal). The real
preemption: tests/cluster/test_preemption_cluster.py."""

from __future__ import annotations

import json

import pytest

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.launching import preemption
from snakemake_executor_multinode.slurm.client import Preemption

T0 = 1_800_000_000.0
NOTICE = Preemption(T0, T0 + 20)


def notice(env):
    return preemption.notice_line(env, NOTICE, "node1")


@pytest.mark.parametrize(("signal", "name"), [("USR2", "USR2"), ("USR1", "USR1"), ("SIGUSR1", "USR1"), ("TERM", "USR2"),
                                               ("10", "USR2"), ("", "USR2")])  # fmt: skip
def test_the_checkpoint_signal_is_the_rules_where_torchruns_agent_ignores_it_else_usr2(signal, name):
    assert preemption.checkpoint_signal({protocol.CHECKPOINT_SIGNAL_VAR: signal}) == name


def test_the_first_node_to_record_the_notice_writes_it_and_the_runs_line_the_others_nothing(tmp_path):
    env = {"SLURM_JOB_ID": "57", "SLURM_RESTART_COUNT": "0", protocol.PREEMPT_NOTICE_FILE_VAR: str(tmp_path / "n"),
           protocol.RUNS_FILE_VAR: str(tmp_path / "runs")}  # fmt: skip
    assert preemption.record(env, NOTICE, "node2") is None
    assert preemption.record(env, NOTICE, "node1") is None
    assert json.loads((tmp_path / "n").read_text())["node"] == "node2"
    assert [json.loads(line)["node"] for line in (tmp_path / "runs").read_text().splitlines()] == ["node2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n", "runs"]  # no temporary file left


def test_a_notice_that_cannot_be_written_is_an_error_to_log(tmp_path):
    env = {"SLURM_JOB_ID": "57", protocol.PREEMPT_NOTICE_FILE_VAR: str(tmp_path / "missing" / "n")}
    error = preemption.record(env, NOTICE, "node1")
    assert error is not None and error.startswith(f"cannot write the preemption notice {tmp_path / 'missing' / 'n'}")


SAVES = [
    {"event": "checkpoint_begin", "step": 5, "wall": T0 - 30},
    {"event": "checkpoint_end", "step": 5, "wall": T0 - 26},
    {"step": 6, "wall": T0 - 25},
    {"event": "checkpoint_begin", "step": 10, "wall": T0 - 10},
    {"event": "checkpoint_end", "step": 10, "wall": T0 - 4},
    {"event": "checkpoint_begin", "step": 11, "wall": T0 + 1},  # the save on the signal, not finished
]


def test_saves_are_timed_from_their_metrics_and_an_unfinished_one_is_known():
    assert preemption.save_seconds(SAVES) == ([4.0, 6.0], T0 + 1)
    assert preemption.save_seconds(SAVES[:5]) == ([4.0, 6.0], None)
    # a save an earlier run left unfinished is no save of this run's
    assert preemption.save_seconds([*SAVES, {"event": "resume", "step": 10, "wall": T0 + 60}]) == ([4.0, 6.0], None)


def test_a_grace_time_too_short_is_said_with_the_saves_it_cut_and_what_to_ask_for(tmp_path):
    env = {"SLURM_JOB_ID": "57"}
    said = preemption.too_short({**notice(env), "grace_s": 5}, SAVES, T0 + 31)
    assert said.startswith("preempted: the grace time ended before the training's checkpoint (SLURM's preemption "
                           "SIGTERM at ")  # fmt: skip
    assert "grace time 5 s" in said
    assert "this job's saves took 5.0 s on average, 6.0 s at most (2 saves)" in said
    assert "was still running 30.0 s later, when SLURM ended the run" in said
    assert "the grace time (5 s) is shorter than a save" in said
    assert "GraceTime of at least 75 s" in said  # 30 s (the cut save) x 1.5 + 30


def test_the_verdict_tells_a_checkpoint_in_time_from_a_training_that_ignores_the_signal(tmp_path):
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("\n".join(json.dumps(r) for r in SAVES[:5]) + "\n")
    env = {"SLURM_JOB_ID": "57", protocol.METRICS_FILE_VAR: str(metrics)}
    said = preemption.verdict(notice(env), 0, True, env, T0 + 8)
    assert said.startswith("training checkpointed on preemption (") and "its save took 6.0 s" in said
    early = preemption.verdict(notice(env), 1, False, env, T0 + 3)  # before the grace time's end
    assert "the training ended with exit 1 before the grace time's end, without a checkpoint" in early
    assert "SIGUSR2" in early
    late = preemption.verdict(notice(env), 143, False, env, T0 + 35)
    assert late.startswith("preempted: the grace time ended before the training's checkpoint")


def test_a_checkpoint_on_the_jobs_own_signal_while_slurm_preempts_it_is_the_preemption(tmp_path, monkeypatch):
    """A site with preempt_send_user_signal preempts with the job's USR2, which no labeller asks about: the launcher
    asks SLURM once, after a checkpoint, so that the job waits for SLURM instead of requeueing itself (its budget)."""
    env = {"SLURM_JOB_ID": "57", protocol.PREEMPT_NOTICE_FILE_VAR: str(tmp_path / "n")}
    asked: list[str] = []
    monkeypatch.setattr(preemption, "ask", lambda e: asked.append("?") or NOTICE)
    assert preemption.noticed(env, False, "node1") is None and asked == []  # no checkpoint: nothing to ask
    found = preemption.noticed(env, True, "node1")
    assert found is not None and found["grace_s"] == 20 and (tmp_path / "n").exists() and asked == ["?"]
    monkeypatch.setattr(preemption, "ask", lambda e: None)  # the time limit's signal
    assert preemption.noticed({**env, protocol.PREEMPT_NOTICE_FILE_VAR: str(tmp_path / "m")}, True, "node1") is None


def test_a_damaged_notice_is_said_and_stands_as_a_preemption_of_unknown_time(tmp_path):
    from snakemake_executor_multinode.contract import state_files

    said: list[str] = []
    state_files.report_to(said.append)
    try:
        (tmp_path / "n").write_bytes(b'{"event": "preem')  # cut short
        found = preemption.read({protocol.PREEMPT_NOTICE_FILE_VAR: str(tmp_path / "n")})
    finally:
        state_files.report_to(None)
    assert found == {"event": "preempted"} and preemption.when(found) == "SLURM's preemption SIGTERM"
    assert said and said[0].startswith(f"damaged state file {tmp_path / 'n'}: not valid JSON")
    assert said[0].endswith("ignored: the preemption is said without its times")
