"""A failed job's message names SLURM's verdict and quotes the failing rank's last lines, then the job log's end."""

from __future__ import annotations

from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.slurm.client import JobState
from snakemake_executor_multinode.watching.failure import failure_message
from snakemake_executor_multinode.watching.job_status import Outcome


def test_the_failing_ranks_lines_come_from_its_nodes_file_then_the_job_logs_end(tmp_path):
    log = JobFiles.of(tmp_path, "41", 1).log
    log.write_text("[multinode] job 41\n[multinode torchrun] node node2 (node_rank 1) failed with exit code 1\n")
    JobFiles.from_log(log).node_out("node2").write_text(
        "[node2 rank2] step 10\n[node2 rank3] RuntimeError: corrupt shard\n"
        "[node2] Root Cause (first observed failure):\n[node2]   rank      : 3 (local_rank: 1)\n"
    )
    outcome = Outcome("41", True, False, 1, JobState("41", "FAILED", "1:0"), failed_node="node2")
    message = failure_message("41", outcome, log)
    assert message.startswith("SLURM job 41 failed: SLURM state FAILED")
    assert "last lines of node2 rank3" in message and "RuntimeError: corrupt shard" in message
    assert "[node2 rank2] step 10" not in message  # another rank's line
    assert message.index("corrupt shard") < message.index("last lines of the log:")


def test_without_a_node_file_the_job_logs_end_is_quoted(tmp_path):
    log = JobFiles.of(tmp_path, "7", 1).log
    log.write_text("".join(f"line {i}\n" for i in range(30)))
    message = failure_message("7", Outcome("7", True, False, 3), log)
    assert "line 29" in message and "line 17" not in message  # the last 12 lines
