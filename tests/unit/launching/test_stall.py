"""The progress watchdog's parts without a cluster: what counts as progress, the workers it asks for stacks, and
the verdict that names the rank whose stack differs (the whole on the real cluster: tests/cluster/
test_stall_cluster.py).
The tests that start processes: tests/process/launching/test_stall.py."""

from __future__ import annotations

from pathlib import Path

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.launching import stall
from tests.helpers import Clock


def test_any_new_line_or_metrics_line_is_progress_and_silence_is_a_stall(tmp_path):
    files = JobFiles(tmp_path / "job")
    node, metrics = files.node_out("node1"), files.metrics
    clock = Clock()
    dog = stall.Watchdog(20, [node, metrics], clock)
    assert not dog.stalled()
    clock.now = 15
    node.write_text("[node1 rank0] step 1\n")
    assert not dog.stalled()  # seen at 15
    clock.now = 30
    metrics.write_text('{"step": 2}\n')
    assert not dog.stalled()  # seen at 30
    clock.now = 49.9
    assert not dog.stalled()
    clock.now = 50.1  # 20 s of silence since the metrics line
    assert dog.stalled()
    assert not stall.Watchdog(0, [node], clock).stalled()  # off


def test_a_fixed_timeout_counts_once_a_rank_has_printed_and_spares_the_start_before(tmp_path):
    """torch's import, the rendezvous, a tracker's start: slower than a short stall_timeout on a loaded node, and no
    stall. The launcher's own line and an earlier launch's lines are no start; a rank's line or a metrics line is."""
    files = JobFiles(tmp_path / "job")
    node1, node2, metrics = files.node_out("node1"), files.node_out("node2"), files.metrics
    node1.write_text("[node1 rank0] the line of an earlier launch\n")
    start = stall.LaunchStart([node1, node2], metrics)
    clock = Clock()
    dog = stall.Watchdog(lambda: stall.fixed_timeout(20, start), [node1, node2, metrics], clock)
    with node1.open("a") as fh:
        fh.write("[node1] [multinode torchrun] launching on node1, node_rank=0\n")
        fh.write("[node1 rank0] stack|     <module> (train.py:1)\n")  # a stack taken on request: no start
        fh.write("[node1 rank0] half a li")  # not whole yet
    clock.now = 600
    assert not dog.stalled() and dog.limit == stall.LONG_S  # 10 min of imports: spared
    assert "before the training's first line" in stall.fixed_rule(start)
    with node1.open("a") as fh:
        fh.write("ne\n")  # the rank's first line
    clock.now = 610
    assert not dog.stalled() and dog.limit == 20  # seen at 610: the timeout counts from here
    clock.now = 630.5
    assert dog.stalled() and stall.fixed_rule(start) == ""
    assert stall.fixed_timeout(0, stall.LaunchStart([node2], None)) == 0  # off stays off


def test_a_metrics_line_or_a_worker_whose_rank_is_not_known_yet_also_begins_the_training(tmp_path):
    files = JobFiles(tmp_path / "job")
    node, metrics = files.node_out("node1"), files.metrics
    by_metrics = stall.LaunchStart([node], metrics)
    assert not by_metrics.check()
    metrics.write_text('{"event": "resume", "step": 40}\n')
    assert by_metrics.check()
    by_local_rank = stall.LaunchStart([node], None)
    node.write_text("[node1 local_rank1] Traceback (most recent call last):\n")
    assert by_local_rank.check()


def test_a_file_that_cannot_be_read_tells_nothing_and_the_start_allowance_stays(tmp_path):
    blocked = tmp_path / "a-file" / "node1.out"  # below a file: NotADirectoryError, not FileNotFoundError
    (tmp_path / "a-file").write_text("")
    start = stall.LaunchStart([blocked], blocked.with_name("metrics.jsonl"))
    assert not start.check() and stall.fixed_timeout(20, start) == stall.LONG_S


def write_stacks(stem: str, tops: dict[str, tuple[str, str]]) -> None:
    for rank, (node, top) in tops.items():
        with open(JobFiles(Path(stem)).node_out(node), "a") as fh:
            fh.write(f'[{node} rank{rank}] stack| Thread 1 (idle): "MainThread"\n')
            fh.write(f"[{node} rank{rank}] stack|     {top}\n")
            fh.write(f"[{node} rank{rank}] stack|     <module> (train.py:9)\n")


def test_the_verdict_names_the_rank_that_differs_from_the_majority(tmp_path):
    stem = str(JobFiles.of(tmp_path, "7", 1).prefix)
    barrier = "barrier (torch/distributed/distributed_c10d.py:5356)"
    write_stacks(
        stem, {"0": ("n1", barrier), "1": ("n1", barrier), "2": ("n2", barrier), "3": ("n2", "get (queue.py:180)")}
    )
    said = stall.verdict(stem, ["n1", "n2"], 600, "job.log")
    assert said == "stalled: no progress for 10m on any rank; stacks in job.log; rank 3 differs: get (queue.py:180)"


def test_without_a_majority_every_place_is_named_and_alike_stacks_name_none(tmp_path):
    stem = str(JobFiles.of(tmp_path, "8", 1).prefix)
    write_stacks(stem, {"0": ("n1", "a (x.py:1)"), "1": ("n2", "b (y.py:2)")})
    assert stall.verdict(stem, ["n1", "n2"], 90, "l").endswith("; rank 0: a (x.py:1); rank 1: b (y.py:2)")
    same = str(JobFiles.of(tmp_path, "9", 1).prefix)
    write_stacks(same, {"0": ("n1", "a (x.py:1)"), "1": ("n2", "a (x.py:1)")})
    assert stall.verdict(same, ["n1", "n2"], 90, "l") == "stalled: no progress for 90s on any rank; stacks in l"


def test_the_workers_are_found_below_the_agent_by_their_rank_not_their_data_loaders():
    envs = {10: {b"RANK": b"0"}, 11: {b"RANK": b"1"}, 12: {b"RANK": b"0"}, 13: {b"PATH": b"/bin"}}
    tree = {1: [13], 13: [10, 11], 10: [12]}  # agent 1 -> a wrapper 13 -> workers 10, 11; 12 is 10's data loader
    assert stall.worker_ranks(1, lambda: tree, envs.__getitem__) == [(10, "0"), (11, "1")]


STEP = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "node1"}


def step_env(rank: str | None, **other: str) -> dict[bytes, bytes]:
    env = {k.encode(): v.encode() for k, v in (STEP | other).items()}
    return env | ({b"RANK": rank.encode()} if rank is not None else {})


def test_workers_in_a_container_are_found_by_their_step_not_below_the_agent():
    """podman: the agent (1) runs the client (2); the workers (10, 11) are below conmon (30), which left the client.
    Their data loader (12), another node's worker (20), another step's (21) and another job's (22) are not theirs."""
    envs = {
        2: {b"PATH": b"/bin"}, 30: {b"PATH": b"/bin"}, 31: step_env(None), 10: step_env("0"), 11: step_env("1"),
        12: step_env("0"), 20: step_env("2", SLURMD_NODENAME="node2"), 21: step_env("0", SLURM_STEP_ID="1"),
        22: step_env("0", SLURM_JOB_ID="8"),
    }  # fmt: skip
    tree = {1: [2], 0: [30, 20, 21, 22], 30: [31], 31: [10, 11], 10: [12]}
    assert stall.worker_ranks(1, lambda: tree, envs.__getitem__, STEP) == [(10, "0"), (11, "1")]
    assert stall.worker_ranks(1, lambda: tree, envs.__getitem__) == []  # outside SLURM: the tree only


def test_the_tree_wins_over_the_step():
    envs = {10: step_env("0"), 11: step_env("1")}
    tree = {1: [10], 0: [11]}
    assert stall.worker_ranks(1, lambda: tree, envs.__getitem__, STEP) == [(10, "0")]


def test_the_verdict_goes_to_the_tracker_and_on_stall_requeue_asks_the_job_script_to_requeue(tmp_path):
    env = {protocol.STALL_FILE_VAR: str(tmp_path / "7.stalled"), protocol.PREEMPT_FILE_VAR: str(tmp_path / "7.pre")}
    stall.record(env, "stalled: no progress for 20s on any rank", "fail")
    assert (tmp_path / "7.stalled").read_text() == "stalled: no progress for 20s on any rank\n"
    assert not (tmp_path / "7.pre").exists()
    stall.record(env, "stalled: again", "requeue")
    assert (tmp_path / "7.pre").read_text() == "stalled\n"  # the job script's requeue path, as after USR2


def test_a_verdict_that_cannot_be_written_is_an_error_naming_the_file_never_silence(tmp_path):
    (tmp_path / "state").write_text("a file where the state folder should be")
    marker = tmp_path / "state" / "7.stalled"
    env = {protocol.STALL_FILE_VAR: str(marker), protocol.PREEMPT_FILE_VAR: str(tmp_path / "7.pre")}
    recorded = stall.record(env, "stalled: no progress for 20s on any rank", "requeue")
    assert recorded.requeue and (tmp_path / "7.pre").read_text() == "stalled\n"  # the requeue still happens
    (error,) = recorded.errors
    assert error.startswith(f"cannot write the stall verdict {marker}: ")


def test_on_stall_requeue_without_a_requeue_file_to_write_is_an_error(tmp_path):
    """Outside the plugin's job script nothing would requeue the job: said, not assumed."""
    env = {protocol.STALL_FILE_VAR: str(tmp_path / "7.stalled")}
    recorded = stall.record(env, "stalled: no progress for 20s on any rank", "requeue")
    assert not recorded.requeue and len(recorded.errors) == 1 and protocol.PREEMPT_FILE_VAR in recorded.errors[0]
    assert "; not requeued: " in (tmp_path / "7.stalled").read_text()
