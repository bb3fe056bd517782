"""`multinode logs` without a cluster: which job a JOB argument names, which lines --rank and --node keep, and -f
following a job across its requeue's new log until slurmctld says it ended. The real run is in
tests/cluster/test_follow_cluster.py."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from snakemake_executor_multinode.cli.main import main
from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.slurm.client import JobState, QueryError
from snakemake_executor_multinode.watching import logs, status_view
from snakemake_executor_multinode.watching.registry import Submission
from tests.helpers import record

LOG = b"""\
[multinode] job 41, rule train, attempt 1, restart 0
[node1] [multinode torchrun] launching on node1, node_rank=0
[node1 rank0] step 1
[node1 rank1] step 1
[node2 rank10] step 1
[node2 local_rank0] gone before its rank was seen
[node2] torchrun says
plain [node1 rank1] inside a line
"""


def kept(**only) -> list[bytes]:
    keep = logs.line_filter(**only)
    return [line for line in LOG.splitlines() if keep(line)]


def test_rank_keeps_that_global_ranks_lines_only():
    assert kept(rank=1) == [b"[node1 rank1] step 1"]
    assert kept(rank=10) == [b"[node2 rank10] step 1"]  # not rank 1's, nor rank 0's


def test_node_keeps_its_ranks_and_its_torchruns_lines():
    assert kept(node="node2") == [
        b"[node2 rank10] step 1",
        b"[node2 local_rank0] gone before its rank was seen",
        b"[node2] torchrun says",
    ]


def test_no_filter_keeps_the_whole_log():
    assert kept() == LOG.splitlines()


def test_job_is_found_by_id_rule_or_output_and_without_one_the_newest(tmp_path):
    a = record(tmp_path, "r1", "prep", "40", 1.0)
    b = record(tmp_path, "r1", "train", "41", 2.0, outputs=("results/model.pt",))
    c = record(tmp_path, "r2", "train", "52", 3.0, outputs=("results/model-b.pt",))
    d = record(tmp_path, "r2", "prep", "53", 4.0)
    found = status_view.find_job
    assert found(tmp_path, None) == d
    assert found(tmp_path, "41") == b
    assert found(tmp_path, "train") == c  # the rule's newest job
    assert found(tmp_path, "results/model.pt") == b
    assert found(tmp_path, "./results//model.pt") == b
    assert found(tmp_path, str(tmp_path / "results/model.pt")) == b
    assert found(tmp_path, "prep") == d and a != d


@pytest.mark.parametrize(
    ("which", "message"),
    [
        ("77", "no job is SLURM job 77 in the runs of {wd}"),
        ("results/none.txt", "no job is rule or output 'results/none.txt' in the runs of {wd}"),
    ],
)
def test_no_such_job_is_one_line_naming_what_was_looked_for_exit_2(tmp_path, capsys, which, message):
    record(tmp_path, "r1", "train", "41", 1.0)
    assert main(["logs", "-d", str(tmp_path), which]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"multinode logs: {message.format(wd=tmp_path)}\n"


def test_a_job_without_its_log_yet_is_one_line_exit_2(tmp_path, capsys):
    sub = record(tmp_path, "r1", "train", "41", 1.0)
    assert main(["logs", "-d", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err == f"multinode logs: no log yet: SLURM job 41 (rule train) has not written {sub.log}\n"
    )


def test_logs_prints_every_run_of_a_requeued_job_oldest_first(tmp_path, capsysbinary):
    sub = record(tmp_path, "r1", "train", "41", 1.0)
    first = Path(sub.log)
    first.parent.mkdir(parents=True)
    first.write_bytes(b"[node1 rank1] run 0\n")
    JobFiles.from_log(first).restart(1).log.write_bytes(b"[node2 rank1] run 1\n[node2 rank0] run 1\n")
    assert main(["logs", "--rank", "1", "-d", str(tmp_path), "41"]) == 0
    assert capsysbinary.readouterr().out == b"[node1 rank1] run 0\n[node2 rank1] run 1\n"


class Script:
    """slurmctld's answers and the job's writes, one step per poll of the follower."""

    def __init__(self, sub: Submission, steps: list) -> None:
        self.sub, self.steps, self.asked = sub, steps, 0

    def live(self, ids):
        self.asked += 1
        state = self.state
        if state is None:
            raise QueryError("slurmctld restarting")
        return {} if state == "forgotten" else {"41": JobState("41", state)}

    def sleep(self, _seconds: float) -> None:
        write, self.state = self.steps.pop(0)
        write()


def test_follow_goes_on_across_a_requeues_new_log_and_ends_with_the_job(tmp_path, monkeypatch):
    monkeypatch.setattr(logs, "STATE_S", 0.0)  # slurmctld asked at every poll: the script says what it answers
    sub = record(tmp_path, "r1", "train", "41", 1.0)
    first, restart = Path(sub.log), JobFiles.from_log(sub.log).restart(1).log
    first.parent.mkdir(parents=True)

    def append(path: Path, data: bytes):
        return lambda: path.open("ab").write(data)

    script = Script(
        sub,
        [
            (append(first, b"[node1 rank1] a\n[node1 rank0] a\n[node1 rank1] half"), "RUNNING"),
            (append(first, b" done\n"), None),  # slurmctld does not answer: still followed
            (lambda: None, "REQUEUED"),  # the job's next run has not started
            (append(restart, b"[node2 rank1] b\n"), "RUNNING"),
            (append(restart, b"[node2 rank1] last, no newline"), "forgotten"),  # ended, and slurmctld forgot it
        ],
    )
    script.state = "PENDING"  # before the job writes anything: its log is waited for
    out = io.BytesIO()
    logs.follow(sub, logs.line_filter(rank=1), out, script, sleep=script.sleep)  # type: ignore[arg-type]
    assert (
        out.getvalue() == b"[node1 rank1] a\n[node1 rank1] half done\n[node2 rank1] b\n[node2 rank1] last, no newline\n"
    )
    assert script.steps == []


def test_follow_of_a_job_that_ended_without_a_log_is_an_error(tmp_path):
    sub = record(tmp_path, "r1", "train", "41", 1.0)
    script = Script(sub, [])
    script.state = "forgotten"
    with pytest.raises(logs.NoLog, match="no log: SLURM job 41 .rule train. ended without writing"):
        logs.follow(sub, logs.line_filter(), io.BytesIO(), script, sleep=script.sleep)  # type: ignore[arg-type]
