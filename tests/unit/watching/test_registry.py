"""The run registry: one record per submission, written whole, found again by the run that made it and by later
runs for the same outputs."""

from __future__ import annotations

import json

from snakemake_executor_multinode.protocol import RUNS_DIR
from snakemake_executor_multinode.watching import registry
from snakemake_executor_multinode.watching.registry import Registry, Submission, runs


def sub(run: str, name: str, outputs=("out.txt",), jobid: str | None = "7", at: float = 1.0) -> Submission:
    return Submission(run, "work", {}, outputs, name, 1, "s.sh", "l.log", jobid, submitted_at=at)


def test_a_record_is_written_whole_and_read_back(tmp_path):
    reg = Registry(tmp_path, "r1")
    reg.record(sub("r1", "mn-r1-work"))
    path = tmp_path / RUNS_DIR / "r1" / "mn-r1-work.json"
    assert json.loads(path.read_text())["jobid"] == "7"
    assert not list(path.parent.glob("*.tmp"))  # written under another name, then renamed
    assert reg.mine() == [sub("r1", "mn-r1-work")]


def test_the_newest_earlier_submission_for_exactly_these_outputs_is_found(tmp_path):
    Registry(tmp_path, "old").record(sub("old", "a", at=1.0, jobid="1"))
    Registry(tmp_path, "mid").record(sub("mid", "b", at=2.0, jobid="2"))
    Registry(tmp_path, "mid").record(sub("mid", "c", outputs=("out.txt", "more.txt"), at=3.0, jobid="3"))
    Registry(tmp_path, "mid").record(sub("mid", "d", at=4.0, jobid=None))  # sbatch never answered
    now = Registry(tmp_path, "now")
    now.record(sub("now", "e", at=5.0, jobid="5"))  # this run's own
    found = now.latest_for(["out.txt"])
    assert found is not None and found.jobid == "2"


def test_an_adopted_job_and_its_reported_end_are_recorded_by_the_run_that_saw_them(tmp_path):
    earlier = Registry(tmp_path, "old").record(sub("old", "a"))
    now = Registry(tmp_path, "now")
    adopted = now.adopt(earlier)
    assert adopted.run_id == "now" and adopted.adopted_from == "old" and adopted.jobid == "7"
    ended = now.ended(adopted, "success")
    assert ended.ended == "success" and ended.ended_at is not None
    assert [s.ended for s in runs(tmp_path / RUNS_DIR) if s.run_id == "now"] == ["success"]
    assert [s.ended for s in runs(tmp_path / RUNS_DIR) if s.run_id == "old"] == [None]


def test_an_adopted_jobs_reported_end_is_found_whichever_record_is_read_first(tmp_path, monkeypatch):
    """The adopting run's record keeps the job's submission time: the ended one must win the tie (seen under load:
    the original record was read first and its job taken for one that ended unseen)."""
    earlier = Registry(tmp_path, "a").record(sub("a", "mn-a-work"))
    adopted = Registry(tmp_path, "z").ended(Registry(tmp_path, "z").adopt(earlier), "success")
    for order in ([earlier, adopted], [adopted, earlier]):  # both directory orders
        monkeypatch.setattr(registry, "runs", lambda root, order=order: iter(order))
        found = Registry(tmp_path, "now").latest_for(["out.txt"])
        assert found is not None and found.ended == "success"
