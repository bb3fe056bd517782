"""A full disk on the real local SLURM cluster (issue 38, part 3): the checkpoint folder, the metrics file and the
plugin's own state folder (.snakemake/multinode), each on a small tmpfs the test mounts and always unmounts.

Each slurmd runs in a private mount namespace, so a tmpfs mounted on the host is also moved into every node's
namespace (tests/helpers.py, small_filesystem): the nodes and Snakemake share that one small filesystem, as a
cluster's nodes share theirs. The trainings are workflows/scripts/train.py under `multinode torchrun` (torch_ddp, CPU
+ gloo, the tiny test model, one rank on each of 2 nodes). Timing is by events: the training's own metrics events
and the job script's start and exit lines; a hang would show as the barrier's 30 minutes, a slow machine as seconds.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import StateFolders
from tests.helpers import (
    Snakemake,
    figures,
    fill,
    job_logs,
    jobs_from,
    log_times,
    small_filesystem,
    snakemake,
    train_rule,
    training_folder,
    wait_for,
)
from tests.training.helpers import TINY, checkpoint_bytes

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.one_release]

NEEDED = re.compile(r"(?:at least )?(\d+) bytes needed \(([^)]*)\), (\d+) bytes free in ([^;\s]+)")


def training(tmp_path: Path, name: str, config: dict, metrics: str) -> Path:
    wd = tmp_path / name
    training_folder(wd)
    # max_restarts 0: the failure ends the job at once (by default the training would be restarted in the job, and
    # fail again on the same full disk until the crash-loop rule ends it)
    resources = "runtime=30, max_restarts=0"
    (wd / "Snakefile").write_text(train_rule(config, output="done.txt", metrics=metrics, resources=resources))
    return wd


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def every_rank_said(wd: Path, message: str) -> None:
    """Both ranks printed `message` as their error: they agreed on the failure (diskspace.failures). A rank that waited
    out the agreement for a peer stuck in a collective would say only its own failure, and the peer nothing."""
    [log] = job_logs(wd, "train")
    said = re.findall(r"^\[\S+ rank(\d+)\] train\.py: (.*)$", log.read_text(), re.M)
    assert {rank for rank, line in said if line == message} == {"0", "1"}, said


def ended_after(wd: Path, wall: float) -> float:
    """Seconds from `wall` (Unix time) to the end of the job's one run, as its job script printed it."""
    [log] = job_logs(wd, "train")
    return log_times(log)[1].timestamp() - wall


def test_a_checkpoint_that_does_not_fit_fails_the_job_at_once_naming_it_and_the_previous_one_stays(
    slurm_cluster, tmp_path
):
    """keep_ckpts 1: the old checkpoint stays until the new one verifies, so the folder needs room for two. It has
    room for one and a half: step 2's fits, step 4's does not. Its files are written in the background (ckpt_async,
    the default), beside steps 5 and 6: the failure ends the training at the next save, step 6's, on every rank."""
    import checkpoint  # workflows/scripts: tests.training.helpers puts it on sys.path

    config = {**TINY, "plugin": "torch_ddp", "steps": 8, "ckpt_every": 2, "keep_ckpts": 1}
    wd = training(tmp_path, "ckpt-full", config, "metrics.jsonl")
    size = int(1.5 * checkpoint_bytes(config))
    with small_filesystem(wd / "ckpt", size, slurm_cluster) as ckpt:
        proc = snakemake(wd, timeout=900, check=False)
        text = proc.stdout + proc.stderr
        assert proc.returncode != 0, text
        found = re.search(r"train\.py: (cannot save checkpoint ckpt/step_00000004: no space left on device .*)", text)
        assert found, text[-6000:]
        message = found[1]
        needed, how, free, where = NEEDED.search(message).groups()  # type: ignore[union-attr]
        previous = ckpt / "step_00000002"
        assert (int(needed), how, where) == (
            checkpoint.tree_bytes(previous), "the size of the previous checkpoint, step_00000002", "ckpt"
        )  # fmt: skip
        assert int(free) < int(needed)
        # rank 0's shards never fit (named by file: the background writer knows which); rank 1's own file may fail
        # too, by timing ("rank 0 and 1 other rank")
        assert re.search(r"\(rank 0(?: and 1 other rank)?, writing (model|optimizer)/\S+\)", message), message
        assert message.endswith("the partial save was removed; the previous checkpoint ckpt/step_00000002 is kept")
        assert re.search(r"SLURM job \d+ failed: .*job script exit 1", text), text[-6000:]
        assert sorted(p.name for p in ckpt.iterdir()) == ["step_00000002"]  # no temp dir left taking the space
        assert checkpoint.verify(previous) is None
        begin = [r for r in records(wd / "metrics.jsonl") if r.get("event") == "checkpoint_begin"]
        assert [r["step"] for r in begin] == [2, 4, 6]  # 4's write failed beside the training; 6's save said it
        every_rank_said(wd, message)  # at once: no rank waited for another (a barrier would wait 30 minutes)
        took = ended_after(wd, begin[-1]["wall"])
        figures("checkpoint folder full", checkpoint_bytes=needed, free=free, save_to_job_end_s=round(took, 1))
    assert not (wd / "done.txt").exists()


def test_a_metrics_line_that_does_not_fit_fails_the_job_at_once_and_the_file_keeps_whole_lines(slurm_cluster, tmp_path):
    config = {**TINY, "plugin": "torch_ddp", "steps": 60, "ckpt_every": 0}
    wd = training(tmp_path, "metrics-full", config, "m/metrics.jsonl")
    with small_filesystem(wd / "m", 64 << 10, slurm_cluster) as folder:
        fill(folder, leave=8 << 10)  # room for about 30 lines
        proc = snakemake(wd, timeout=900, check=False)
        text = proc.stdout + proc.stderr
        assert proc.returncode != 0, text
        found = re.search(
            r"train\.py: (cannot write the metrics file m/metrics\.jsonl: no space left on device; .*)", text
        )
        assert found, text[-6000:]
        needed, how, free, where = NEEDED.search(found[1]).groups()  # type: ignore[union-attr]
        assert (how, where) == ("the line", "m") and int(free) < int(needed), found[1]
        lines = records(folder / "metrics.jsonl")  # every line whole: the failed one was cut off again
        steps = [r["step"] for r in lines if "event" not in r]
        assert steps == list(range(1, len(steps) + 1)) and 5 < len(steps) < 60, steps
        every_rank_said(wd, found[1])  # at once: no rank waited for another
        took = ended_after(wd, lines[-1]["wall"])
        figures("metrics file full", line_bytes=needed, free=free, lines=len(steps), last_line_to_job_end_s=took)
    assert not (wd / "done.txt").exists()


HELLO = """
rule hello:
    output: "out.txt"
    resources: nodes=1, runtime=10
    shell: "touch started; while [ ! -e go ]; do sleep 0.2; done; echo ok > {output}"
"""


def test_a_full_state_folder_stops_the_job_before_sbatch_naming_the_file_without_a_stack(slurm_cluster, tmp_path):
    wd = tmp_path / "state-full"
    wd.mkdir()
    (wd / "Snakefile").write_text(HELLO)
    with small_filesystem(StateFolders(wd).root, 64 << 10) as state:
        fill(state)
        proc = snakemake(wd, timeout=300, check=False)
        text = proc.stdout + proc.stderr
        assert proc.returncode != 0, text
        found = re.search(r"rule 'hello': not submitted: cannot write (\S+): no space left on device; .*", text)
        assert found, text
        needed, how, free, where = NEEDED.search(found[0]).groups()  # type: ignore[union-attr]
        assert (
            Path(found[1]).suffix == ".sh" and state in Path(found[1]).parents and Path(where) == Path(found[1]).parent
        )
        assert how == "the file" and int(needed) > 1000 and int(free) == 0
        figures("state folder full at submission", script_bytes=needed)
        assert "Traceback" not in text and not re.search(r'^\s*File "', text, re.M), text
        assert jobs_from(slurm_cluster, wd) == set()  # nothing submitted
    assert not (wd / "out.txt").exists()


def test_an_exit_marker_that_cannot_be_written_does_not_hang_the_job_nor_snakemake(slurm_cluster, tmp_path):
    """The state folder fills while the job runs: its job script cannot write the exit marker and says so in the log;
    Snakemake learns of the end from SLURM at its next sweep (2 s here), cannot record it either, and fails the job
    saying that. The log folder is elsewhere, so the log can tell."""
    wd = tmp_path / "marker-full"
    wd.mkdir()
    (wd / "Snakefile").write_text(HELLO)
    with small_filesystem(StateFolders(wd).root, 64 << 10, slurm_cluster) as state:
        sm = Snakemake(wd, "--multinode-logdir", "logs", "--multinode-sweep-seconds", "2")
        try:
            wait_for(lambda: (wd / "started").exists(), "the job's start", 300, sm.proc)
            fill(state)
            (wd / "go").touch()
            go = time.monotonic()
            at, line = sm.wait_line("its end could not be recorded", timeout=300)
            assert sm.wait(timeout=120) != 0
        finally:
            sm.stop()
        found = re.search(
            r"SLURM job (\d+) succeeded, but its end could not be recorded: cannot write (\S+): no space", line
        )
        assert found, sm.text
        assert state / "runs" in Path(found[2]).parents
        needed, how, free, _ = NEEDED.search(line).groups()  # type: ignore[union-attr]
        assert how == "the file" and int(free) == 0
        [log] = sorted((wd / "logs").rglob("*.log"))
        said = re.search(
            r"^\[multinode\] cannot write the exit marker (\S+): (\d+) bytes needed, (\d+) bytes free in",
            log.read_text(),
            re.M,
        )
        assert said, log.read_text()
        assert Path(said[1]) == StateFolders(wd).marker(found[1], ".exit") and said[3] == "0"
        assert not list((state / "state").glob("*.exit*"))  # no half-written marker left
        took = at - go  # a figure only: the lines above prove the route (the marker refused, the end found by sacct)
        figures("exit marker not written", marker_bytes=said[2], record_bytes=needed, go_to_error_s=round(took, 1))
