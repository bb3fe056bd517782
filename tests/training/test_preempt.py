"""SIGUSR2 protocol: checkpoint at an agreed step, rank 0 writes $MULTINODE_PREEMPT_FILE, every rank exits 0;
the rerun resumes from that step and completes."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from pathlib import Path

import checkpoint
import lm
import plugins
import psutil
import pytest

from .helpers import ENV, HANG_S, REPO, SCRIPTS, TINY, events, metrics, torchrun_argv, train, train_argv

STEPS = 200
CPU_PLUGINS = [name for name, spec in plugins.PLUGIN_TABLE.items() if "cpu" in spec.devices]


def ignore_usr2() -> None:
    # As the launcher starts torchrun (`trap "" USR2; exec torchrun ...`): the agent ignores the signal,
    # the workers inherit SIG_IGN until train.py installs its handler.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def signal_tree(pid: int, sig: signal.Signals) -> None:
    root = psutil.Process(pid)
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(sig)


def wait_for_metrics(path: Path, lines: int, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= lines:
            return
        assert proc.poll() is None, "training ended before it was signalled"
        time.sleep(0.05)
    raise AssertionError(f"no {lines} metrics lines after {timeout} s")


@pytest.mark.slow
@pytest.mark.parametrize("plugin", CPU_PLUGINS)
def test_sigusr2_checkpoints_writes_the_preempt_file_exits_0_and_the_rerun_completes(
    plugin: str, tmp_path: Path, data_dir: Path
) -> None:
    cfg = {**TINY, "plugin": plugin, "steps": STEPS}
    out, preempt_file = tmp_path / "run", tmp_path / "preempted"
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen(
        torchrun_argv(SCRIPTS / "train.py", *train_argv(out, data_dir, cfg)),
        cwd=REPO,
        env={**ENV, "MULTINODE_PREEMPT_FILE": str(preempt_file)},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=ignore_usr2,
    )
    try:
        wait_for_metrics(out / "metrics.jsonl", 3, proc)
        # Like SLURM's --signal: every process of the job step gets it, the agent and the workers (torchrun
        # starts each worker in its own session, so a process-group kill would miss them).
        sent = time.time()
        signal_tree(proc.pid, signal.SIGUSR2)
        rc = proc.wait(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            signal_tree(proc.pid, signal.SIGKILL)
    text = (tmp_path / "first.log").read_text()
    assert rc == 0, text[-5000:]  # torchrun exits 0 only when every worker did

    step = int(preempt_file.read_text())
    assert 3 <= step < STEPS
    assert f"SIGUSR2: checkpointed step {step}, exiting for requeue" in text
    assert [s for s, _ in checkpoint.complete_checkpoints(out / "ckpt")] == [step]
    assert (out / "ckpt" / f"step_{step:08d}" / checkpoint.MODEL).is_dir()  # sharded through the Booster
    assert not (out / "model.pt").exists()
    assert max(r["step"] for r in metrics(out / "metrics.jsonl")) == step
    # the signal's time, as rank 0 got it, recorded before its checkpoint (the goodput benchmark reads it)
    said = [e for e in events(out / "metrics.jsonl") if e["event"] == "signal"]
    assert [(e["step"], e["signal"]) for e in said] == [(step, "SIGUSR2")], said
    assert sent <= said[0]["received"] <= said[0]["wall"]

    proc2 = train(out, data_dir, cfg)  # the requeued job
    assert f"at step {step}" in proc2.stdout
    assert [r["step"] for r in metrics(out / "metrics.jsonl")] == list(range(1, STEPS + 1))
    resumes = [(e["step"], e["restore_s"] >= 0) for e in events(out / "metrics.jsonl") if e["event"] == "resume"]
    assert resumes == [(step, True)]  # the rerun says where it resumed from, and how long loading took
    assert lm.load_final_model(out / "model.pt")[1]["step"] == STEPS
