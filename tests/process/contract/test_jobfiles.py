"""A job's files are named in one place (contract/jobfiles.py): the job script's shell words name the same files as
the Python paths the watchers read, and no other module of the core spells a file name of its own.

Here the tests that start processes (the process tier); the others: tests/unit/contract/test_jobfiles.py."""

from __future__ import annotations

import subprocess

from snakemake_executor_multinode.contract.jobfiles import (
    JobFiles,
    ShellJobFiles,
    StateFolders,
    marker,
    marker_shell,
)


def shell(*words: str, **env: str) -> list[str]:
    """What bash makes of each shell word, with `env` set."""
    assigns = "".join(f"{k}={v!r}; " for k, v in env.items())
    script = assigns + "; ".join(f"printf '%s\\n' {w}" for w in words)
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()


def test_the_job_scripts_words_name_the_files_the_watchers_read(tmp_path):
    log_dir = tmp_path / "logs dir" / "rule_train" / "_"
    first = ShellJobFiles.of("'" + str(log_dir) + "'", attempt=2)
    files = JobFiles.of(log_dir, "57", attempt=2)
    got = shell(first.prefix, first.log, first.metrics, first.runs, first.gpu_samples("node1"), MULTINODE_JOB_KEY="57")
    assert got == [str(p) for p in (files.prefix, files.log, files.metrics, files.runs, files.gpu_samples("node1"))]


def test_a_restarted_run_writes_under_the_restart_prefix_the_watchers_look_for(tmp_path):
    files = JobFiles.of(tmp_path, "57", 1)
    word = '"$MULTINODE_LOG_STEM"' + ShellJobFiles.restart_suffix("$SLURM_RESTART_COUNT")
    run = ShellJobFiles(word)
    got = shell(run.log, run.node_out("node2"), MULTINODE_LOG_STEM=str(files.prefix), SLURM_RESTART_COUNT="3")
    assert got == [str(files.restart(3).log), str(files.restart(3).node_out("node2"))]
    assert shell(ShellJobFiles.this_run().log, MULTINODE_LOG_STEM=str(files.prefix)) == [str(files.log)]


def test_markers_in_the_script_are_the_markers_the_tracker_reads(tmp_path):
    state = StateFolders(tmp_path)
    got = shell(marker_shell(".exit"), MULTINODE_STATE_DIR=str(state.state), MULTINODE_JOB_KEY="41_3")
    assert got == [str(marker(state.state, "41_3", ".exit"))] == [str(state.marker("41_3", ".exit"))]
