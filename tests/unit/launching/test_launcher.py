"""`multinode torchrun`: what it starts on each node (the real multi-node runs are in test_executor_cluster)."""

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
    Allocation,
    StepWatch,
    main,
    nproc_for,
    read_allocation,
    run_step,
    split_torchrun_args,
    srun_command,
    step_command,
    torchrun_command,
    worker_env,
)
from snakemake_executor_multinode.launching.torchrun_flags import TAKES_VALUE
from tests.helpers import REPO

ALLOC = Allocation(
    "4242", ("node110", "node111"), gpus_per_node=8, cpus_per_task=64, master_addr="10.0.0.110", master_port=24242
)


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


def test_one_torchrun_builder_for_every_mode():
    assert torchrun_command(["--max-restarts=1"], ["t.py"], nproc="gpu", python="py") == [
        "py",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=gpu",
        "--max-restarts=1",
        "t.py",
    ]
    assert torchrun_command([], ["t.py"], nproc=8, alloc=ALLOC, node_rank=1, python="py")[3:6] == [
        "--nnodes=2",
        "--nproc_per_node=8",
        "--node_rank=1",
    ]


def test_user_torchrun_options_pass_through_and_nproc_can_be_overridden(tmp_path):
    opts, script = split_torchrun_args(["--nproc_per_node", "2", "--monitor-interval=1", "train.py", "--nnodes", "x"])
    assert opts == ["--nproc_per_node", "2", "--monitor-interval=1"] and script == ["train.py", "--nnodes", "x"]
    out = run_task(
        srun_command(ALLOC, opts, script, python=str(fake_python(tmp_path))), "node110", 0
    ).stdout.splitlines()
    assert "--nproc_per_node=2" in out and "--monitor-interval=1" in out and "--nproc_per_node=8" not in out
    assert nproc_for(ALLOC, opts) == 2


@pytest.mark.parametrize(
    ("opts", "says"),
    [
        (["--node_rank=1"], "--node_rank: the launcher gives each node its rank"),
        (["--node-rank", "0"], "--node_rank: the launcher gives each node its rank"),
        (["--standalone"], "--standalone: this allocation has 2 node"),
        (["--nnodes=3"], "--nnodes: '3', but the allocation has 2 node\\(s\\) \\(node110,node111\\)"),
        (["--nnodes=1:2"], "--nnodes: '1:2', but the allocation has 2"),
        (["--master_addr=10.9.9.9"], "--master_addr: '10.9.9.9', but the launcher's rendezvous is 10.0.0.110:24242"),
        (["--master-port", "1234"], "--master_port: '1234'"),
        (["--rdzv_backend=etcd"], "--rdzv_backend: 'etcd' is not available here; allowed: static, c10d"),
        (["--rdzv_endpoint=10.0.0.110:24242"], "--rdzv_endpoint: .* with --rdzv_backend=c10d"),
        (["--rdzv_backend=c10d", "--rdzv_endpoint=h:1"], "--rdzv_endpoint: 'h:1'; the launcher puts the endpoint"),
        (["--tee=3"], "--tee: the launcher keeps every rank's output"),
        (["-r", "3"], None),  # -r is --redirects' short form: see below
        (["--nproc_per_node=many"], "--nproc_per_node: 'many'; allowed: a positive integer, gpu, cpu or auto"),
        (["--max-restarts=2"], "--max_restarts: needs --rdzv_backend=c10d"),
    ],
)
def test_a_flag_that_would_desynchronise_the_nodes_is_refused_saying_why(opts, says):
    if says is None:
        opts, says = ["--redirects", "3"], "--redirects: the launcher keeps every rank's output"
    with pytest.raises(SystemExit, match=says):
        srun_command(ALLOC, opts, ["train.py"])


@pytest.mark.parametrize(
    "opts",
    [
        ["--nnodes=2"],
        ["--nnodes", "2:2"],
        ["--master_addr=10.0.0.110", "--master_port=24242"],
        ["--master-addr", "10.0.0.110"],
        ["--rdzv_backend=static"],
    ],
)
def test_values_the_launcher_would_write_anyway_are_accepted_once(opts):
    argv = srun_command(ALLOC, opts, ["train.py"], python="py")
    line = argv[-2]
    assert line.count("--nnodes=2") == 1 and line.count("--master_addr=10.0.0.110") == 1
    assert line.count("--master_port=24242") == 1 and "--rdzv_backend=static" not in line


def test_nproc_per_node_gpu_cpu_and_auto_count_the_allocation():
    assert nproc_for(ALLOC, ["--nproc_per_node=gpu"]) == 8
    assert nproc_for(ALLOC, ["--nproc-per-node", "cpu"]) == 64
    assert nproc_for(ALLOC, ["--nproc_per_node=auto"]) == 8
    cpu_only = Allocation("1", ("a", "b"), gpus_per_node=0, cpus_per_task=4, master_addr="h", master_port=1)
    assert nproc_for(cpu_only, ["--nproc_per_node=auto"]) == 4
    with pytest.raises(SystemExit, match="--nproc_per_node=gpu: this allocation has no GPUs"):
        nproc_for(cpu_only, ["--nproc_per_node=gpu"])
    assert "--nproc_per_node=8" in srun_command(ALLOC, ["--nproc_per_node=gpu"], ["t.py"])[-2]


def test_c10d_puts_the_endpoint_on_the_head_node_and_lets_torchrun_restart_workers():
    cmd = torchrun_command(["--rdzv_backend=c10d", "--max-restarts=2"], ["t.py"], nproc=2, alloc=ALLOC, python="py")
    assert cmd == [
        "py",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc_per_node=2",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=10.0.0.110:24242",
        "--rdzv_id=4242",
        "--max-restarts=2",
        "t.py",
    ]
    assert "--dynamic" in srun_command(ALLOC, ["--rdzv_backend=c10d"], ["t.py"])[-2]  # the rendezvous numbers the ranks
    mine = torchrun_command(["--rdzv_backend", "c10d", "--rdzv_id", "x"], ["t.py"], nproc=2, alloc=ALLOC)
    assert "--rdzv_id=4242" not in mine and mine.count("--rdzv_backend=c10d") == 1 and ["--rdzv_id", "x"] == mine[-3:-1]


def test_help_shows_torchruns_options_and_what_the_launcher_fills_in():
    out = subprocess.run(
        [sys.executable, "-m", "snakemake_executor_multinode.cli", "torchrun", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "the launcher fills in" in out and "--node_rank         SLURM_NODEID" in out
    assert "--max-restarts MAX_RESTARTS" in out or "--max-restarts" in out.split("torchrun's options")[1]


def test_unknown_option_and_missing_script_are_clear():
    with pytest.raises(SystemExit, match="unknown torchrun option '--bogus'"):
        split_torchrun_args(["--bogus", "train.py"])
    with pytest.raises(SystemExit, match="no training script"):
        split_torchrun_args(["--nproc_per_node=2"])


def test_values_short_options_and_flags_are_told_apart():
    assert split_torchrun_args(["-t", "3", "-r3", "--no-python", "-m", "pkg.train", "x"]) == (
        ["-t", "3", "-r3", "--no-python", "-m"],
        ["pkg.train", "x"],
    )
    assert split_torchrun_args(["--role", "w", "--", "-script-like", "a"]) == (["--role", "w"], ["-script-like", "a"])


def test_the_flag_table_is_torchruns_own_parser():
    run = pytest.importorskip("torch.distributed.run")
    parser = run.get_args_parser()
    theirs = {opt: action.nargs != 0 for action in parser._actions for opt in action.option_strings}
    assert TAKES_VALUE == theirs


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


def test_workers_get_cpus_per_gpu_as_omp_threads():
    env = worker_env(ALLOC, 8, {"OMP_NUM_THREADS": "1"})
    assert env["OMP_NUM_THREADS"] == "8" and env["MASTER_PORT"] == "24242"
    assert worker_env(ALLOC, 4, {})["OMP_NUM_THREADS"] == "16"  # a --nproc_per_node override shares the CPUs too


def test_allocation_from_the_job_script_environment():
    env = {
        "SLURM_JOB_ID": "77",
        "NODELIST": "node1\nnode2",
        "MULTINODE_GPUS_PER_NODE": "2",
        "MULTINODE_CPUS_PER_TASK": "4",
        "MASTER_ADDR": "172.31.250.11",
        "MASTER_PORT": "20077",
    }
    alloc = read_allocation(env)
    assert alloc.nodes == ("node1", "node2") and alloc.gpus_per_node == 2 and alloc.master_port == 20077


def test_hand_written_allocation_counts_gpus_from_slurm():
    env = {
        "SLURM_JOB_ID": "40001",
        "NODELIST": "a b",
        "SLURM_GPUS_ON_NODE": "4",
        "SLURM_CPUS_PER_TASK": "16",
        "MASTER_ADDR": "10.1.1.1",
    }
    alloc = read_allocation(env)
    assert (alloc.gpus_per_node, alloc.cpus_per_task, alloc.master_port) == (4, 16, protocol.master_port(1))


def test_a_users_own_srun_step_runs_this_nodes_torchrun(monkeypatch):
    monkeypatch.setattr(launcher, "hostnames", lambda nodelist: ["a", "b"])
    env = {
        "SLURM_JOB_ID": "40001",
        "SLURM_STEP_ID": "2",
        "SLURM_STEP_NODELIST": "a,b",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_NODEID": "1",
        "SLURM_GPUS_ON_NODE": "2",
        "SLURM_CPUS_PER_TASK": "4",
        "MASTER_ADDR": "10.1.1.1",
    }
    cmd, env_out = step_command(env, [], ["train.py"], python="py")
    assert cmd == [
        "py",
        "-m",
        "snakemake_executor_multinode.launching.nodelog",
        "--nproc=2",
        "--echo",  # a user's own step: srun forwards the node's lines
        "--",
        "py",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc_per_node=2",
        "--node_rank=1",  # SLURM_NODEID, as in the launcher's own step
        "--master_addr=10.1.1.1",
        f"--master_port={protocol.master_port(40001, 2)}",  # job and step: a second step gets another port
        "train.py",
    ]
    assert env_out["OMP_NUM_THREADS"] == "2"
    with pytest.raises(SystemExit, match="one task per node"):
        step_command(env | {"SLURM_STEP_NUM_TASKS": "4"}, [], ["train.py"])


SRUN_FAILURE = (
    "[multinode torchrun] launching on node1, node_rank=0\n"
    "srun: error: node2: task 1: Exited with exit code 3\n"
    "srun: launch/slurm: _step_signal: Terminating StepId=12.0\n"
    "slurmstepd-node1: error: *** STEP 12.0 ON node1 CANCELLED AT 2026-12-03T10:03:33 ***\n"
    "srun: error: node1: task 0: Exited with exit code 143\n"
)


def test_srun_names_the_first_failing_node_and_what_follows_does_not_count():
    watch = StepWatch(["node1", "node2"])
    data = SRUN_FAILURE.encode()
    found = [watch.feed(data[i : i + 7]) for i in range(0, len(data), 7)]  # lines split across reads
    failures = [f for f in found if f]
    assert len(failures) == 1 and (failures[0].node, failures[0].rank, failures[0].code) == ("node2", 1, 3)


def test_a_node_killed_by_a_signal_is_named_with_the_shells_code():
    watch = StepWatch(["node1", "node2", "node3"])
    failed = watch.feed(b"srun: error: node3: task 2: Killed\n")
    assert failed and (failed.node, failed.rank, failed.code) == ("node3", 2, 137)


def test_a_step_cancelled_from_outside_names_no_node():
    watch = StepWatch(["node1", "node2"])
    text = b"slurmstepd-node1: error: *** STEP 5.0 ON node1 CANCELLED AT 2026-12-03 DUE TO TIME LIMIT ***\n"
    assert watch.feed(text + b"srun: error: node1: task 0: Terminated\n") is None and watch.failure is None


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


@pytest.mark.parametrize("step", [False, True], ids=["outside-slurm", "own-srun-step"])
def test_a_container_the_launcher_cannot_apply_is_an_error_not_ignored(monkeypatch, step):
    for key in [k for k in os.environ if k.startswith(("SLURM_", "MULTINODE_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv(protocol.CONTAINER_RUNTIME_VAR, "podman")
    monkeypatch.setenv(protocol.CONTAINER_IMAGE_VAR, "localhost/train:1")
    if step:
        monkeypatch.setenv("SLURM_JOB_ID", "7")
        monkeypatch.setenv("SLURM_JOB_NODELIST", "a")
        monkeypatch.setenv("SLURM_STEP_ID", "0")
    where = "inside your own srun step" if step else "outside SLURM"
    with pytest.raises(SystemExit, match=f"{where} the profile's container .* cannot be applied"):
        main(["train.py"])


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


def test_when_every_node_answers_srun_s_failing_node_is_blamed(monkeypatch):
    failed = launcher.Failure("node2", 1, 3, "Exited with exit code 3")
    monkeypatch.setattr(launcher.liveness, "slurmd_port", lambda env: 6818)
    assert launcher.blame(failed, ("node1", "node2"), {}, find_dead=lambda nodes, port: []) == failed
    assert launcher.blame(failed, ("node1", "node2"), {}, find_dead=lambda nodes, port: ["node2"]) == failed


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


def test_the_python_that_holds_multinode_runs_torchrun_and_another_activated_environment_is_said(capfd):
    launcher.check_python({"VIRTUAL_ENV": "/envs/other"}, prefix="/envs/mine", torch_found=True)
    err = capfd.readouterr().err
    assert (
        f"WARNING: VIRTUAL_ENV=/envs/other is activated, but torchrun and the training run with {sys.executable}" in err
    )
    launcher.check_python({"CONDA_PREFIX": "/envs/mine/"}, prefix="/envs/mine", torch_found=True)  # the same one
    assert capfd.readouterr().err == ""


def test_a_python_without_torch_is_an_error_before_anything_starts():
    with pytest.raises(SystemExit, match="has no torch: install the plugin into the environment that has your torch"):
        launcher.check_python({}, torch_found=False)


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
