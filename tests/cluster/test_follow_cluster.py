"""Following a run on the real local SLURM cluster: `multinode logs` of a running 2-node `multinode torchrun` job,
followed with -f for one rank until the job ends.

The job's ranks wait for a release file the test creates; the test waits for events (a line printed, the follower's
end). The timeouts only stop hangs: no verdict depends on how long anything takes.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from snakemake_executor_multinode.slurm.client import ACTIVE_STATES
from tests.helpers import MULTINODE, background, copied_workflow, squeue_states, wait_for

pytestmark = pytest.mark.cluster


def logs(wd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*MULTINODE, "logs", *args], cwd=wd, capture_output=True, text=True, timeout=120)


def test_logs_follow_prints_one_ranks_lines_and_exits_when_the_job_ends(slurm_cluster, tmp_path):
    wd = copied_workflow("follow", tmp_path)
    nothing = logs(wd)  # no run has submitted anything from here
    assert nothing.returncode == 2 and nothing.stderr.startswith("multinode logs: no job: no run has submitted")
    with background(wd) as sm:
        # every rank has said BEFORE and waits: the job runs on its 2 nodes
        shown = wait_for(
            lambda: (r := logs(wd)).returncode == 0 and len(re.findall(r"\] BEFORE rank=\d", r.stdout)) == 4 and r,
            "every rank's BEFORE line in `multinode logs`",
            timeout=300,
            proc=sm.proc,
        )
        jobid = re.search(r"job (\d+), rule ranks", shown.stdout)[1]
        assert logs(wd, jobid).stdout == logs(wd, "ranks").stdout == logs(wd, "results/ranks.txt").stdout
        follower = subprocess.Popen(
            [*MULTINODE, "logs", "-f", "--rank", "1"], cwd=wd, stdout=subprocess.PIPE, text=True
        )
        try:
            assert follower.stdout is not None
            first = follower.stdout.readline()  # a line written before the follower started
            assert follower.poll() is None  # the job waits for the release: the follower goes on
            (wd / "release").touch()
            rest, _ = follower.communicate(timeout=300)
        finally:
            if follower.poll() is None:
                follower.kill()
        assert follower.returncode == 0
        # the follower ended because the job did: SLURM no longer runs it
        assert squeue_states(slurm_cluster, [jobid]).get(jobid, "ENDED") not in ACTIVE_STATES
        node = re.search(r"\[(\S+) rank1\] BEFORE", shown.stdout)[1]
        assert [first.rstrip("\n"), *rest.splitlines()] == [
            f"[{node} rank1] BEFORE rank=1",
            f"[{node} rank1] AFTER rank=1",
        ]
        assert sm.wait() == 0
    # one node's lines: its two ranks' and its torchrun's own, nothing of the other node
    other = logs(wd, "--node", node).stdout.splitlines()
    assert {line.split("]")[0] for line in other} == {f"[{node}", f"[{node} rank0", f"[{node} rank1"}
    # a job none of the runs submitted: one line naming what was looked for
    missing = logs(wd, "999999")
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.splitlines() == [f"multinode logs: no job is SLURM job 999999 in the runs of {wd}"]
