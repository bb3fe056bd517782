"""Job arrays on the real local SLURM cluster: jobs of one rule that Snakemake hands over together and that ask for
the same resources go as one `sbatch --array`; each element keeps its own log, markers, record, failure report and
reattach. The jobs wait for a release file the test creates; the test waits for events."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from snakemake_executor_multinode.sandbox.spec import ClusterSpec
from tests.helpers import TEST_NODES, Snakemake, jobs_from, lines, records, wait_for

N = TEST_NODES * ClusterSpec.cpus + 6  # more than the suite's cluster has CPUs: some elements wait while others run
SNAKEFILE = f"""
rule all:
    input: expand("shard/{{i}}.txt", i=range({N}))
rule shard:
    output: "shard/{{i}}.txt"
    shell:
        "echo $SLURM_ARRAY_JOB_ID >> ran/{{wildcards.i}}; while [ ! -e release ]; do sleep 0.2; done; "
        "[ {{wildcards.i}} != 3 ] || {{{{ echo 'shard 3: bad input' >&2; exit 7; }}}}; echo ok > {{output}}"
"""


def workflow(tmp_path: Path) -> Path:
    wd = tmp_path / "wf"
    (wd / "ran").mkdir(parents=True)
    (wd / "Snakefile").write_text(SNAKEFILE)
    return wd


def started(wd: Path) -> int:
    return len(list((wd / "ran").iterdir()))


def test_a_fan_out_is_one_array_whose_elements_run_once_each_and_fail_alone(slurm_cluster, tmp_path):
    wd = workflow(tmp_path)
    sweeps = ("--multinode-sweep-seconds", "1", "--multinode-pending-notice-seconds", "0")
    run = Snakemake(wd, "--keep-going", *sweeps, jobs=N)
    try:
        _, line = run.wait_line("rule shard: SLURM job array", timeout=180)
        array = line.split("SLURM job array ")[1].split()[0]
        wait_for(lambda: started(wd) >= 4, "elements running", 300)
        # a waiting element is known to the sweeps as itself (squeue -r), not lost: its wait is explained
        run.wait_line(f"SLURM job {array}_", "is waiting:", timeout=180)
        status = subprocess.run(
            [sys.executable, "-m", "snakemake_executor_multinode.cli", "status"], cwd=wd, capture_output=True,
            text=True, check=True,
        ).stdout  # fmt: skip
        assert f"{array}_0" in status and "RUNNING" in status, status
        (wd / "release").touch()
        rc = run.wait(600)
    finally:
        run.stop()
    assert rc != 0  # shard 3 failed
    assert sorted(int(p.name) for p in (wd / "ran").iterdir()) == list(range(N))
    assert all(lines(p) == [array] for p in (wd / "ran").iterdir())  # each element ran once, in the one array
    assert sorted(p.name for p in (wd / "shard").iterdir()) == sorted(f"{i}.txt" for i in range(N) if i != 3)
    recs = records(wd)
    assert sorted(r["jobid"] for r in recs) == sorted(f"{array}_{i}" for i in range(N))  # a record per element
    (failed,) = [r for r in recs if r["wildcards"] == {"i": "3"}]
    failure = [line for _, line in run.matching("SLURM job", failed["jobid"], "failed")]
    assert failure and "job script exit 7" in failure[0], run.text
    log = Path(failed["log"]).read_text()
    assert "shard 3: bad input" in log and f"job {failed['jobid']}," in log  # the element's own log
    assert jobs_from(slurm_cluster, wd) == {f"{array}_{i}" for i in range(N)}  # one submission: the array's elements


def test_a_rerun_after_a_killed_snakemake_reattaches_to_every_element(slurm_cluster, tmp_path):
    wd = workflow(tmp_path)
    (wd / "Snakefile").write_text(SNAKEFILE.replace("[ {wildcards.i} != 3 ]", "true"))
    first = Snakemake(wd, jobs=N)
    try:
        _, line = first.wait_line("rule shard: SLURM job array", timeout=180)
        array = line.split("SLURM job array ")[1].split()[0]
        wait_for(lambda: started(wd) >= 1, "an element running", 300)
        os.kill(first.pid, signal.SIGKILL)
        assert first.wait(60) == -signal.SIGKILL
    finally:
        first.stop()
    subprocess.run([sys.executable, "-m", "snakemake", "--unlock"], cwd=wd, check=True, capture_output=True)
    second = Snakemake(wd, jobs=N)
    try:
        second.wait_line("reattached to SLURM job", timeout=180)
        wait_for(lambda: len(second.matching("reattached to SLURM job")) == N, "every element reattached", 180)
        (wd / "release").touch()
        rc = second.wait(600)
    finally:
        second.stop()
    assert rc == 0, second.text
    assert not second.matching("SLURM job array"), second.text  # nothing submitted again
    assert all(lines(p) == [array] for p in (wd / "ran").iterdir()) and started(wd) == N
    assert jobs_from(slurm_cluster, wd) == {f"{array}_{i}" for i in range(N)}
