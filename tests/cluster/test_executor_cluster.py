"""`snakemake --executor multinode` on the real local SLURM cluster (5 namespaced nodes, fake GPUs)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import JobFiles, StateFolders
from tests.helpers import (
    ANY_FIRST_SCRIPT,
    REPO,
    background,
    copied_workflow,
    job_logs,
    jobs_from,
    log_times,
    node_index,
    run_log_names,
    slurm,
    snakemake,
    timelimit_ranks_waiting,
    wait_for,
)

pytestmark = pytest.mark.cluster


def sacct_fields(cl, jobid: str, workdir: Path, *fields: str) -> dict[str, str]:
    """The job's latest accounting record. Only records of jobs submitted from `workdir` count: a job id can
    name two jobs in sacct when a restarted slurmctld hands it out again, and others share the test cluster."""
    out = slurm(cl, "sacct", "-D", "-X", "-n", "-P", "-j", jobid, "-o", ",".join(("WorkDir", *fields)))
    records = [line.split("|") for line in out.splitlines()]
    mine = [dict(zip(fields, r[1:], strict=True)) for r in records if r[0] == str(workdir.resolve())]
    return mine[-1] if mine else {}


def finished_in_sacct(cl, jobid: str, workdir: Path, *fields: str) -> dict[str, str]:
    """The job's sacct record once it shows the job ended with every field filled in (slurmdbd records a job's
    end and its submit line a moment after the job ends)."""

    def done() -> dict[str, str]:
        rec = sacct_fields(cl, jobid, workdir, "State", "End", *fields)
        ended = rec and rec["State"] not in ("PENDING", "RUNNING", "REQUEUED")
        return rec if ended and all(v not in ("", "Unknown") for v in rec.values()) else {}

    return wait_for(done, f"complete sacct record of the finished job {jobid}", 120)


@pytest.mark.snakemake8
def test_gpu_rule_becomes_one_two_node_job_with_one_torchrun_per_node(slurm_cluster, tmp_path):
    wd = copied_workflow("torchrun", tmp_path)
    snakemake(wd)
    result = json.loads((wd / "results" / "allreduce.json").read_text())
    assert result["world_size"] == 4 and result["sum"] == 1 + 2 + 3 + 4
    ranks = sorted(result["ranks"], key=lambda r: r["rank"])
    head, other = ranks[0]["host"], ranks[2]["host"]  # the two nodes SLURM gave the job (whichever were free)
    assert [r["host"] for r in ranks] == [head, head, other, other] and head != other, ranks
    assert [r["node_rank"] for r in ranks] == [0, 0, 1, 1]
    assert [r["local_rank"] for r in ranks] == [0, 1, 0, 1]
    # cpus_per_task=4 shared by 2 GPU processes per node
    assert {r["omp"] for r in ranks} == {"2"}
    log = job_logs(wd, "allreduce")[0].read_text()
    for line in (
        "NODE_NUM=2",
        f"NODELIST: {head} {other}",
        f"MASTER_ADDR={slurm_cluster.spec.node_ip(node_index(slurm_cluster, head))}",
        f"launching on {head}, node_rank=0",
        f"launching on {other}, node_rank=1",
    ):
        assert line in log


def assert_chain_result(wd: Path) -> None:
    """tests/workflows/chain's train job saw 2 nodes, 2 GPUs per node and 2 of the node's GPUs (which 2 depends on
    the other jobs sharing the test cluster's nodes)."""
    nodes, gpus, visible = (wd / "results" / "evaluated.txt").read_text().split()
    devices = visible.split(",")
    assert (nodes, gpus) == ("2", "2") and len(set(devices)) == 2 and all(d.isdigit() for d in devices), visible


def test_three_rule_chain_runs_cpu_and_multinode_jobs_in_order(slurm_cluster, tmp_path):
    wd = copied_workflow("chain", tmp_path)
    # Markers, not SLURM queries, report completion: with the sacct/squeue sweep put off for an hour, the run can
    # only finish (within the hang guard) if every job's end is noticed from its marker.
    snakemake(wd, "--multinode-sweep-seconds", "3600")
    assert (wd / "results" / "data.txt").read_text().startswith("data-from-node")
    assert_chain_result(wd)
    # each job's script sits beside its log: what ran can be read back
    logs = {}
    for rule in ("preprocess", "train", "evaluate"):
        found = job_logs(wd, rule)
        assert len(found) == 1 and found[0].with_suffix(".sh").exists()
        logs[rule] = found[0]
    # in order: each job started after the one before it had ended (each job script prints both times; the next
    # job is submitted only after the marker that is written after the end time is printed)
    (_, pre_end), (train_start, train_end), (eval_start, _) = (log_times(logs[r]) for r in logs)
    assert pre_end <= train_start and train_end <= eval_start
    # and a second run has nothing to do
    again = snakemake(wd)
    assert "Nothing to be done" in again.stdout + again.stderr


def test_whole_pipeline_submitted_at_once_is_chained_by_afterok(slurm_cluster, tmp_path):
    wd = copied_workflow("chain", tmp_path)
    snakemake(wd, "--immediate-submit", "--notemp")
    scripts = {
        rule: next((StateFolders(wd).logs / f"rule_{rule}").rglob("*.sh"))
        for rule in ("preprocess", "train", "evaluate")
    }
    ids = {rule: path.name.split(".")[0] for rule, path in scripts.items()}
    # what each job was submitted with (sacct keeps it; squeue's dependency field empties once it is satisfied)
    rec = {r: finished_in_sacct(slurm_cluster, ids[r], wd, "Submit", "Eligible", "Start", "SubmitLine") for r in ids}
    assert "--dependency" not in rec["preprocess"]["SubmitLine"]
    assert f"--dependency=afterok:{ids['preprocess']} " in rec["train"]["SubmitLine"]
    assert f"--dependency=afterok:{ids['train']} " in rec["evaluate"]["SubmitLine"]
    assert {r["State"] for r in rec.values()} == {"COMPLETED"}
    # SLURM held each job until the one before it had ended (slurmctld's own records, ISO times compare as text)
    assert rec["preprocess"]["End"] <= rec["train"]["Eligible"] <= rec["train"]["Start"]
    assert rec["train"]["End"] <= rec["evaluate"]["Eligible"] <= rec["evaluate"]["Start"]
    wait_for(lambda: (wd / "results" / "evaluated.txt").exists(), "results/evaluated.txt", 60)
    assert_chain_result(wd)


def test_wildcards_with_shell_metacharacters_neither_break_the_job_nor_run_anything(slurm_cluster, tmp_path):
    nasty = "a b;$(touch PWNED)'x\"`touch PWNED2`"
    wd = tmp_path / "nasty"
    wd.mkdir()
    (wd / "Snakefile").write_text(
        'rule make:\n    output: "out/{name}.txt"\n    resources: nodes=1, gpus=1\n'
        '    shell: "echo {wildcards.name:q} > {output:q}"\n'
    )
    snakemake(wd, f"out/{nasty}.txt")
    assert (wd / "out" / f"{nasty}.txt").read_text().strip() == nasty
    assert not list(wd.rglob("PWNED*"))


def test_failing_job_reports_slurm_state_exit_code_and_log(slurm_cluster, tmp_path):
    wd = tmp_path / "fail"
    wd.mkdir()
    (wd / "Snakefile").write_text('rule broken:\n    output: "out.txt"\n    shell: "echo about to fail; exit 3"\n')
    proc = snakemake(wd, check=False)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "SLURM state FAILED" in text and "job script exit 3" in text
    log = job_logs(wd, "broken")[0]
    assert str(log) in text and "about to fail" in log.read_text()  # kept on failure
    # the end of the log is quoted in Snakemake's error message, not only its path
    assert "last lines of the log:\n" in text and "    about to fail" in text


def test_failing_node_stops_the_others_and_is_named(slurm_cluster, tmp_path):
    wd = tmp_path / "nodefail"
    wd.mkdir()
    # node2's rank fails once node1's rank is asleep; node1's rank would sleep longer than the run may take
    (wd / "fail.py").write_text(
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "if os.environ['GROUP_RANK'] == '1':\n"
        "    while not Path('survivor.pid').exists():\n"
        "        time.sleep(0.2)\n"
        "    print('rank 1: giving up, the shard is unreadable', flush=True)\n"
        "    sys.exit(3)\n"
        "Path('survivor.tmp').write_text(str(os.getpid()))\n"
        "os.replace('survivor.tmp', 'survivor.pid')\n"
        "time.sleep(900)\n"
        "Path('survivor.slept').write_text('the sleep completed')\n"
    )
    (wd / "Snakefile").write_text(
        'rule train:\n    output: "out.txt"\n    resources: nodes=2, gpus=1, max_restarts=0\n'
        '    shell: "multinode torchrun fail.py && touch {output}"\n'
    )
    proc = snakemake(wd, check=False)  # its 300 s hang guard is far below the survivor's sleep
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "failing node node2" in text
    # Snakemake's error quotes the rank torchrun names as the root cause, from node2's own labelled file
    assert (
        "last lines of node2 rank1 (" in text and "    [node2 rank1] rank 1: giving up, the shard is unreadable" in text
    )
    log = job_logs(wd, "train")[0]
    assert "node node2 (node_rank 1) failed" in log.read_text()
    job = log.name.split(".")[0]
    assert finished_in_sacct(slurm_cluster, job, wd)["State"] == "FAILED"
    # the surviving rank was stopped: its process is gone and its sleep never completed
    pid = int((wd / "survivor.pid").read_text())

    def survivor_gone() -> bool:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:
            return True
        return stat.rsplit(")", 1)[1].split()[0] == "Z" or b"fail.py" not in cmdline  # reaped soon, or reused

    wait_for(survivor_gone, f"end of the surviving rank (pid {pid})", 60)
    assert not (wd / "survivor.slept").exists()


def test_time_limit_signal_checkpoints_requeues_and_the_rerun_resumes(slurm_cluster, tmp_path):
    """SLURM's own pre-time-limit signal (sbatch --signal=USR2@60, sent by slurmctld's periodic time-limit check),
    to a worker that does no computing and ends only once the signal has come: without the signal the job would
    run into its time limit (TIMEOUT) and the run would fail. Nothing here depends on how fast anything runs."""
    wd = copied_workflow("timelimit", tmp_path)
    logdir = StateFolders(wd).logs / "rule_train"
    with background(wd, jobs=1) as sm:
        script = wait_for(lambda: next(logdir.rglob(ANY_FIRST_SCRIPT), None), "submitted job script", 120, sm.proc)
        job = script.name.split(".")[0]
        assert jobs_from(slurm_cluster, wd) == {job}
        assert "#SBATCH --signal=USR2@60" in script.read_text().splitlines()
        # The rule's runtime (10 min) keeps the signal away while torchrun starts, however long that takes. Once
        # both workers wait for it, the running job gets a short limit, 90-150 s from now: slurmctld's check (every
        # 30 s; it signals once the time left is within the 60 s lead plus one check) sends USR2 within ~90 s,
        # with more than 60 s left to checkpoint and requeue.
        wait_for(lambda: timelimit_ranks_waiting(wd), "both workers waiting for SIGUSR2", 300, sm.proc)
        start = datetime.fromisoformat(slurm(slurm_cluster, "squeue", "-h", "-j", job, "-o", "%S").strip())
        limit = math.ceil(((datetime.now() - start).total_seconds() + 90) / 60)
        slurm(slurm_cluster, "scontrol", "update", f"JobId={job}", f"TimeLimit={limit}")
        first = JobFiles.of(script.parent, job, 1).log
        wait_for(lambda: "[multinode] requeued" in first.read_text(), "requeue after the signal", 300, sm.proc)
        # the rerun needs no signal: give it back a long limit, so its start-up may take as long as it takes
        slurm_cluster.run("scontrol", "update", f"JobId={job}", "TimeLimit=10", check=False)
        sm.wait(600)
    assert sm.proc.returncode == 0, sm.text
    assert [p.name for p in job_logs(wd, "train")] == run_log_names(job, 1)
    first_text = first.read_text()
    for rank in (0, 1):
        assert f"worker rank {rank}: got SIGUSR2 at restart 0, checkpointed" in first_text
    assert "[multinode] checkpointed after SIGUSR2 (checkpoint)" in first_text
    assert "[multinode] requeued; the next run resumes from the checkpoint" in first_text
    rerun = JobFiles.of(script.parent, job, 1).restart(1).log.read_text()
    assert "restart 1," in rerun and "[multinode] exit 0," in rerun
    for rank in (0, 1):
        assert (
            f"worker rank {rank}: resumed from checkpoint results/ckpt/rank{rank}.json (SIGUSR2 at restart 0)" in rerun
        )
    done = json.loads((wd / "results" / "done.json").read_text())
    assert done == {
        "restart": 1,
        "checkpoints": {f"rank{r}": {"signal": "SIGUSR2", "restart": 0, "rank": r} for r in (0, 1)},
    }
    assert finished_in_sacct(slurm_cluster, job, wd)["State"] == "COMPLETED"


def test_checkpoint_without_requeue_is_resumed_by_snakemake_retries(slurm_cluster, tmp_path):
    """max-requeues 0: the checkpointed job ends with exit 85 and Snakemake's --retries resumes it as attempt 2
    (a new job). The signal comes from scancel --signal=USR2, as SLURM's --signal sends it: to every step process."""
    wd = copied_workflow("timelimit", tmp_path)
    logdir = StateFolders(wd).logs / "rule_train"
    with background(wd, "--multinode-max-requeues", "0", "--retries", "1", jobs=1) as sm:
        script = wait_for(lambda: next(logdir.rglob(ANY_FIRST_SCRIPT), None), "submitted job script", 120, sm.proc)
        job = script.name.split(".")[0]
        wait_for(lambda: timelimit_ranks_waiting(wd), "both workers waiting for SIGUSR2", 300, sm.proc)
        slurm(slurm_cluster, "scancel", "--signal=USR2", job)
        sm.wait(600)
    assert sm.proc.returncode == 0, sm.text
    logs = {p.name.split(".", 1)[1]: p for p in job_logs(wd, "train")}  # one log per job: attempt 2 is a new job
    assert sorted(logs) == ["attempt1.log", "attempt2.log"] and logs["attempt1.log"].name == f"{job}.attempt1.log"
    retry = logs["attempt2.log"].name.split(".")[0]
    assert retry != job
    assert f"SLURM job {job} failed" in sm.text and "job script exit 85" in sm.text
    first = logs["attempt1.log"].read_text()
    assert "[multinode] checkpointed after SIGUSR2 (checkpoint)" in first
    assert "[multinode] not requeued" in first and "[multinode] exit 85," in first
    assert "requeued;" not in first
    second = logs["attempt2.log"].read_text()
    for rank in (0, 1):
        assert (
            f"worker rank {rank}: resumed from checkpoint results/ckpt/rank{rank}.json (SIGUSR2 at restart 0)" in second
        )
    done = json.loads((wd / "results" / "done.json").read_text())
    assert done["restart"] == 0 and set(done["checkpoints"]) == {"rank0", "rank1"}
    assert finished_in_sacct(slurm_cluster, job, wd, "ExitCode")["ExitCode"] == "85:0"
    assert finished_in_sacct(slurm_cluster, retry, wd)["State"] == "COMPLETED"


def test_ctrl_c_cancels_every_submitted_job(slurm_cluster, tmp_path):
    wd = tmp_path / "cancel"
    wd.mkdir()
    (wd / "Snakefile").write_text(
        'rule all:\n    input: expand("out/{i}.txt", i=range(2))\n'
        'rule sleep:\n    output: "out/{i}.txt"\n    shell: "sleep 300; touch {output}"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--executor", "multinode", "--jobs", "2"],
        cwd=wd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        scripts: list[Path] = []
        while len(scripts) < 2 and time.monotonic() < deadline:
            scripts = [p for p in (wd / ".snakemake").rglob(ANY_FIRST_SCRIPT)]
            time.sleep(0.3)
        ids = [p.name.split(".")[0] for p in scripts]
        assert len(ids) == 2
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    # The two jobs went as one job array. Asked by the array's id, sacct lists its started elements and, for tasks
    # that never started (Ctrl-C came first), one record of the array (24.11: <id>_[0-1]; 22.05: the bare <id>):
    # all of them cancelled.
    arrays = sorted({i.split("_")[0] for i in ids})
    assert len(arrays) == 1 and sorted(ids) == [f"{arrays[0]}_0", f"{arrays[0]}_1"], ids
    deadline = time.monotonic() + 180  # stops a hang only: SLURM's own clean-up decides when
    rows: list[str] = []
    while time.monotonic() < deadline:
        rows = slurm_cluster.run("sacct", "-X", "-n", "-P", "-j", arrays[0], "-o", "JobID,State").stdout.splitlines()
        if rows and all(row.split("|")[1].startswith("CANCELLED") for row in rows):
            break
        time.sleep(0.5)
    assert rows and all(row.split("|")[1].startswith("CANCELLED") for row in rows), rows
    # a record by the bare id (22.05, an array cancelled before SLURM split it) stands for every task
    tasks = {t for row in rows for t in tasks_of(row.split("|")[0]) or {0, 1}}
    assert tasks == {0, 1}, rows


def tasks_of(key: str) -> set[int]:
    """The array tasks an squeue id names: 7_1 -> {1}, 7_[0-1] -> {0, 1}."""
    _, _, spec = key.partition("_")
    found: set[int] = set()
    if not spec:
        return found  # the array itself, by its bare id
    for part in spec.strip("[]").split("%")[0].split(","):
        low, _, high = part.partition("-")
        found |= set(range(int(low), int(high or low) + 1))
    return found


def test_more_nodes_than_the_partition_has_is_refused_by_slurm_before_any_submission(slurm_cluster, tmp_path):
    wd = tmp_path / "toobig"
    wd.mkdir()
    (wd / "Snakefile").write_text(
        'rule all:\n    input: "x"\n'
        'rule first:\n    output: "w"\n    shell: "touch {output}"\n'
        'rule big:\n    input: "w"\n    output: "x"\n    resources: nodes=9, own_launcher=True\n'
        '    shell: "touch {output}"\n'
    )
    proc = snakemake(wd, check=False)
    assert proc.returncode != 0
    text = proc.stderr + proc.stdout
    assert "rule 'big': resource nodes=9 is invalid: partition 'gpu' has 5 nodes" in text
    assert "Node count specification invalid" in text  # SLURM's own words, asked with sbatch --test-only
    assert jobs_from(slurm_cluster, wd) == set() and not (wd / "w").exists()  # not even the upstream job ran


def test_bad_resources_stop_the_run_before_anything_is_submitted(slurm_cluster, tmp_path):
    wd = tmp_path / "bad"
    wd.mkdir()
    (wd / "Snakefile").write_text(
        'rule all:\n    input: "b.txt"\n'
        'rule a:\n    output: "a.txt"\n    shell: "touch {output}"\n'
        'rule b:\n    input: "a.txt"\n    output: "b.txt"\n    resources: nodes=2, gpus=4, cpus_per_task=2\n'
        '    shell: "touch {output}"\n'
    )
    proc = snakemake(wd, check=False)
    assert proc.returncode != 0
    assert "rule 'b': resource cpus_per_task=2 is invalid: must be at least gpus=4" in proc.stderr + proc.stdout
    assert jobs_from(slurm_cluster, wd) == set()
    assert not (wd / "a.txt").exists()


@pytest.mark.one_release
@pytest.mark.snakemake8
def test_snakemake_own_executor_test_workflows_pass(slurm_cluster, tmp_path):
    """snakemake.common.tests' simple (a -> b -> c, report output, a '/' in a wildcard) and groups workflows."""
    code = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(REPO / "tests" / "snakemake_suite.py"),
            "--basetemp",
            str(tmp_path / "suite"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"PYTHONPATH": str(REPO)},
    )
    assert code.returncode == 0, code.stdout[-4000:] + code.stderr[-2000:]
    assert "2 passed" in code.stdout


HAND_WRITTEN = """#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --gres=gpu:2 --cpus-per-task=2
cd {wd}
{launch}
"""


@pytest.mark.parametrize(
    "launch",
    [
        "multinode torchrun allreduce.py results/allreduce.json",  # from the batch script: one srun per node
        "srun --ntasks-per-node=1 multinode torchrun allreduce.py results/allreduce.json",  # one task per node
    ],
    ids=["batch-script", "srun-step"],
)
def test_multinode_torchrun_uses_a_hand_written_allocation(slurm_cluster, tmp_path, launch):
    wd = copied_workflow("torchrun", tmp_path)
    (wd / "results").mkdir()
    script = wd / "job.sbatch"
    script.write_text(HAND_WRITTEN.format(wd=wd, launch=launch))
    job = slurm_cluster.run("sbatch", "--parsable", "-o", str(wd / "job.log"), str(script)).stdout.strip()
    deadline = time.monotonic() + 120
    state = ""
    while time.monotonic() < deadline:
        state = slurm_cluster.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%T").stdout.strip()
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        time.sleep(0.5)
    assert state == "COMPLETED", (wd / "job.log").read_text()
    result = json.loads((wd / "results" / "allreduce.json").read_text())
    assert result["world_size"] == 4
    # node ranks follow the allocation's node order, whichever nodes SLURM gave the job
    nodelist = slurm_cluster.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%N").stdout.strip()
    first, second = slurm_cluster.run("scontrol", "show", "hostnames", nodelist).stdout.split()
    assert sorted((r["host"], r["node_rank"]) for r in result["ranks"]) == [
        (first, 0),
        (first, 0),
        (second, 1),
        (second, 1),
    ]
