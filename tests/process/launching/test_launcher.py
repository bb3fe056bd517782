"""`multinode torchrun`: what it starts on each node (the real multi-node runs are in test_executor_cluster).

Here the tests that start processes (the process tier); the others: tests/unit/launching/test_launcher.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.launching import launcher, stall
from snakemake_executor_multinode.launching.launcher import (
    main,
    nproc_for,
    run_step,
    split_torchrun_args,
    srun_command,
)
from tests.helpers import ALLOC, REPO, SRUN_FAILURE


def fake_python(tmp_path: Path) -> Path:
    """Stands in for the interpreter a step task execs: prints its argv and whether it inherited USR2 ignored."""
    exe = tmp_path / "python"
    exe.write_text(
        "#!/bin/bash\n"
        'printf "%s\\n" "$@"\n'
        "mask=$(awk '/^SigIgn/ {print $2}' /proc/self/status)\n"
        'echo "USR2-ignored=$(( (0x$mask >> 11) & 1 ))"\n'
    )
    exe.chmod(0o755)
    return exe


def run_task(argv: list[str], node: str, nodeid: int, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """What one task of the srun step runs on its node, given SLURM's per-task variables."""
    task = argv[argv.index("bash") :]
    env = os.environ | {"SLURM_NODEID": str(nodeid), "SLURMD_NODENAME": node}
    return subprocess.run(task, env=env, capture_output=True, text=True, check=True, cwd=cwd)


def test_one_srun_step_starts_every_node_and_each_node_takes_its_rank_from_slurm(tmp_path):
    argv = srun_command(ALLOC, [], ["train.py", "--lr", "3e-4"], python=str(fake_python(tmp_path)))
    assert argv[:9] == [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=64",  # explicit: srun 22.05 does not inherit it
        "--mem=0",
        "--kill-on-bad-exit=1",
        "--export=ALL",
        "--job-name=torchrun",
    ]
    python = str(tmp_path / "python")
    for node, rank in (("node110", 0), ("node111", 1)):
        task = run_task(argv, node, rank)
        assert task.stdout.splitlines() == [
            "-m",
            # labels every line [node rankR], keeps the node's own file
            "snakemake_executor_multinode.launching.nodelog",
            "--nproc=8",
            "--",
            python,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            "--nproc_per_node=8",
            f"--node_rank={rank}",
            "--master_addr=10.0.0.110",
            "--master_port=24242",
            "train.py",
            "--lr",
            "3e-4",
            "USR2-ignored=1",  # torchrun's agent ignores USR2: the pre-time-limit signal reaches only the workers
        ]


def test_script_arguments_reach_torchrun_verbatim_through_the_tasks_shell(tmp_path):
    nasty = ["train.py", "a b", "$(touch PWNED)", "'q'", '"$SLURM_NODEID"', "--node_rank=$SLURM_NODEID"]
    argv = srun_command(ALLOC, [], nasty, python=str(fake_python(tmp_path)))
    out = run_task(argv, "node111", 1, cwd=tmp_path).stdout.splitlines()
    assert out[out.index("--master_port=24242") + 1 : -1] == nasty and not (tmp_path / "PWNED").exists()


def test_user_torchrun_options_pass_through_and_nproc_can_be_overridden(tmp_path):
    opts, script = split_torchrun_args(["--nproc_per_node", "2", "--monitor-interval=1", "train.py", "--nnodes", "x"])
    assert opts == ["--nproc_per_node", "2", "--monitor-interval=1"] and script == ["train.py", "--nnodes", "x"]
    out = run_task(
        srun_command(ALLOC, opts, script, python=str(fake_python(tmp_path))), "node110", 0
    ).stdout.splitlines()
    assert "--nproc_per_node=2" in out and "--monitor-interval=1" in out and "--nproc_per_node=8" not in out
    assert nproc_for(ALLOC, opts) == 2


def test_help_shows_torchruns_options_and_what_the_launcher_fills_in():
    out = subprocess.run(
        [sys.executable, "-m", "snakemake_executor_multinode.cli", "torchrun", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "the launcher fills in" in out and "--node_rank         SLURM_NODEID" in out
    assert "--max-restarts MAX_RESTARTS" in out or "--max-restarts" in out.split("torchrun's options")[1]


def test_the_launcher_reads_its_options_without_importing_torch():
    code = (
        "import sys\n"
        "from snakemake_executor_multinode.cli import main\n"
        "from snakemake_executor_multinode.launching.launcher import split_torchrun_args, srun_command, Allocation\n"
        "opts, script = split_torchrun_args(\n"
        "    ['--nproc_per_node=2', '--rdzv_backend=c10d', '--max-restarts', '1', 'train.py']\n"
        ")\n"
        "srun_command(Allocation('1', ('a', 'b'), 2, 4, '10.0.0.1', 20004), opts, script)\n"
        "assert not [m for m in sys.modules if m == 'torch' or m.startswith('torch.')], 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def fake_srun(tmp_path: Path, body: str) -> list[str]:
    exe = tmp_path / "srun"
    exe.write_text(f"#!/bin/bash\n{body}\n")
    exe.chmod(0o755)
    return [str(exe)]


def test_the_failing_node_is_logged_and_written_for_the_status_tracker(tmp_path, capfd):
    marker = tmp_path / "failed-node"
    srun = fake_srun(tmp_path, f"printf '%s' '{SRUN_FAILURE}' >&2; exit 143")
    code = run_step(srun, {protocol.FAILED_NODE_FILE_VAR: str(marker)}, ["node1", "node2"])
    assert code == 3 and marker.read_text() == "node2\n"
    err = capfd.readouterr().err
    assert "node node2 (node_rank 1) failed with exit code 3" in err and "FAILED: node node2 (node_rank 1)" in err
    assert "srun: error: node2: task 1: Exited with exit code 3" in err  # srun's own report passes through
    marker.write_text("node7\n")  # an earlier launch in the same job failed first: it stays named
    run_step(srun, {protocol.FAILED_NODE_FILE_VAR: str(marker)}, ["node1", "node2"])
    assert marker.read_text() == "node7\n"


@pytest.mark.parametrize("on_sigterm", ["", "trap '' TERM;"], ids=["srun-stops", "srun-waits-on"])
def test_a_failure_stops_the_step_and_the_launcher_does_not_wait_on_it(tmp_path, monkeypatch, capfd, on_sigterm):
    monkeypatch.setattr(launcher, "STOP_WAIT_S", 0.5)
    srun = fake_srun(
        tmp_path,
        f"{on_sigterm} echo 'srun: error: node2: task 1: Exited with exit code 1' >&2; sleep 60; touch {tmp_path}/done",
    )
    code = run_step(srun, {}, ["node1", "node2"])
    # the launcher returned without waiting for srun: its SIGTERM, or its kill after STOP_WAIT_S, ended srun early
    assert code == 1 and not (tmp_path / "done").exists()
    assert ("srun still waits" in capfd.readouterr().err) == bool(on_sigterm)


def stalled_step(tmp_path: Path, preempt: Path) -> tuple[int, str]:
    """A step that makes no progress under on_stall requeue, run by the launcher's supervision: (its exit code, the
    stall marker's text). The fake srun ends on the launcher's gentle stop (SIGUSR1), as srun's tasks do."""
    stem = str(JobFiles.of(tmp_path, "9", 1).prefix)
    nodes = ["node1", "node2"]
    for node in nodes:  # every node's stacks are in: the verdict need not wait for them
        stall.done_file(stem, node).write_text("done\n")
    env = {
        protocol.LOG_STEM_VAR: stem,
        protocol.STALL_TIMEOUT_VAR: "1",
        protocol.ON_STALL_VAR: "requeue",
        protocol.STALL_FILE_VAR: str(tmp_path / "9.stalled"),
        protocol.PREEMPT_FILE_VAR: str(preempt),
    }
    srun = fake_srun(tmp_path, "trap 'exit 1' USR1; while :; do sleep 0.1; done")
    with pytest.MonkeyPatch.context() as mp:  # the training has begun (when: tests/unit/launching/test_stall.py)
        mp.setattr(stall.LaunchStart, "check", lambda self: True)
        code = run_step(srun, env, nodes)
    return code, (tmp_path / "9.stalled").read_text()


def test_a_stall_under_on_stall_requeue_asks_the_job_script_to_requeue(tmp_path, capfd):
    code, verdict = stalled_step(tmp_path, tmp_path / "9.preempted")
    assert code == protocol.EXIT_STALLED and (tmp_path / "9.preempted").read_text() == "stalled\n"
    assert verdict.startswith("stalled: no progress for 1s on any rank")
    err = capfd.readouterr().err
    assert "; requeued to resume" in err and "ERROR" not in err, err


def test_a_stall_whose_requeue_request_cannot_be_written_fails_loudly_naming_the_file(tmp_path, capfd):
    """The requeue request cannot be written (the state folder is broken): no requeue can happen, and the log and
    Snakemake's error (the stall marker) say so and name the file; the step fails with the stall's exit code."""
    (tmp_path / "state").write_text("a file where the state folder should be")
    preempt = tmp_path / "state" / "9.preempted"
    code, verdict = stalled_step(tmp_path, preempt)
    assert code == protocol.EXIT_STALLED and not preempt.exists()
    err = capfd.readouterr().err
    assert f"ERROR: cannot write the requeue request {preempt}: " in err, err
    assert "requeued to resume" not in err and "FAILED: stalled: no progress for 1s" in err, err
    assert f"; not requeued: cannot write {preempt}" in verdict and verdict.count("\n") == 1, verdict


def test_a_clean_run_after_a_checkpoint_exits_with_the_preempted_code(tmp_path, monkeypatch):
    fake_srun(tmp_path, "exit 0")
    preempt = tmp_path / "preempted"
    preempt.write_text("step 5\n")
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("NODELIST", "node1\nnode2")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "20077")
    monkeypatch.setenv(protocol.PREEMPT_FILE_VAR, str(preempt))
    assert main(["train.py"]) == protocol.EXIT_PREEMPTED
    preempt.unlink()
    assert main(["train.py"]) == 0


def test_outside_slurm_it_is_a_one_node_torchrun_whose_labelled_lines_go_to_the_terminal(tmp_path):
    script = tmp_path / "w.py"
    # One line written in two pieces: the labeller still prints it whole, once.
    script.write_text(
        "import os, sys\nsys.stdout.write(f\"WORLD {os.environ['WORLD_SIZE']} {os.environ['GROUP_RANK']} \")\n"
        "sys.stdout.write(f\"rank {os.environ['RANK']} here\\n\")\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "MULTINODE_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake_executor_multinode.cli", "torchrun", "--nproc_per_node=2", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "no SLURM allocation" in proc.stderr
    node = socket.gethostname().split(".")[0]
    assert sorted(line for line in proc.stdout.splitlines() if "here" in line) == [
        f"[{node} rank0] WORLD 2 0 rank 0 here",
        f"[{node} rank1] WORLD 2 0 rank 1 here",
    ]
    assert not list(tmp_path.glob("*.out"))  # no node file outside a job


def test_a_node_that_does_not_answer_is_blamed_not_the_live_node_whose_rank_failed_first(tmp_path, monkeypatch, capfd):
    # A node died: the live node's rank fails first (its peer vanished) and srun names the live node.
    asked: list[tuple[list[str], int]] = []
    monkeypatch.setattr(launcher.liveness, "slurmd_port", lambda env: 6818)
    monkeypatch.setattr(
        launcher.liveness, "unreachable", lambda nodes, port: asked.append((list(nodes), port)) or ["node2"]
    )
    monkeypatch.setattr(launcher.socket, "gethostname", lambda: "node1")
    marker = tmp_path / "failed-node"
    srun = fake_srun(tmp_path, "echo 'srun: error: node1: task 0: Exited with exit code 1' >&2; exit 1")
    code = run_step(srun, {protocol.FAILED_NODE_FILE_VAR: str(marker)}, ["node1", "node2", "node3"])
    assert code == 1 and marker.read_text() == "node2\n"
    assert asked == [(["node2", "node3"], 6818)]  # every node but the launcher's own, once
    err = capfd.readouterr().err
    assert "node node2 (node_rank 1) does not answer" in err and "node node1 failed after it" in err
    assert "FAILED: node node2 (node_rank 1) does not answer: the node is down" in err


def test_a_node_failure_slurm_reports_itself_is_said_as_a_node_that_is_down_not_as_an_exit_code(
    tmp_path, monkeypatch, capfd
):
    # No live rank failed on its lost peer (it hung instead): SLURM declares the node failed after SlurmdTimeout.
    monkeypatch.setattr(launcher.liveness, "slurmd_port", lambda env: 6818)
    monkeypatch.setattr(launcher.liveness, "unreachable", lambda nodes, port: ["node2"])
    monkeypatch.setattr(launcher.socket, "gethostname", lambda: "node1")
    marker = tmp_path / "failed-node"
    srun = fake_srun(
        tmp_path,
        "echo 'srun: error: Node failure on node2' >&2; echo 'srun: error: node1: task 0: Killed' >&2; exit 1",
    )
    end = launcher.launch_step(srun, {protocol.FAILED_NODE_FILE_VAR: str(marker)}, ["node1", "node2"])
    assert end.failure is not None and end.failure.node == "node2" and end.failure.node_down
    assert marker.read_text() == "node2\n"
    err = capfd.readouterr().err
    assert "node node2 (node_rank 1) is down (SLURM reports a node failure); stopping the others" in err
    assert "FAILED: node node2 (node_rank 1) does not answer: the node is down" in err
    assert "exited with" not in err


def test_a_node_answers_when_its_slurmd_port_accepts_and_a_name_that_does_not_resolve_is_no_evidence():
    import socket

    from snakemake_executor_multinode.launching import liveness

    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))  # bound, not listening: a connect is refused, as on a node whose slurmd died
        assert liveness.answers("127.0.0.1", listening.getsockname()[1])
        assert not liveness.answers("127.0.0.1", closed.getsockname()[1])
    assert liveness.answers("no-such-node.invalid", 6818)
    # asked in parallel: each probe returns only once all three are being asked (a serial loop breaks the barrier)
    together = threading.Barrier(3, timeout=60)
    found = liveness.unreachable(["a", "b", "c"], 1, probe=lambda node, port: (together.wait(), node == "b")[1])
    assert found == ["a", "c"]


def test_outside_slurm_the_run_gets_a_job_s_files_and_says_its_last_progress(tmp_path):
    script = tmp_path / "w.py"
    script.write_text(
        "import json, os\n"
        "with open(os.environ['MULTINODE_METRICS_FILE'], 'a') as f:\n"
        "    print(json.dumps({'step': 3, 'steps': 10, 'loss': 0.5}), file=f)\n"
        "print('hello from', os.environ['RANK'])\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "MULTINODE_", "SNAKEMAKE_MULTINODE_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake_executor_multinode.cli", "torchrun", "--nproc_per_node=1", str(script)],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "[multinode torchrun] last progress: step 3/10 loss 0.5" in proc.stderr
    (out,) = (tmp_path / ".snakemake/multinode/torchrun").glob("local-*.out")  # <stem>.<host>.out, as in a job
    assert "rank0] hello from 0" in out.read_text() and "rank0] hello from 0" in proc.stdout
