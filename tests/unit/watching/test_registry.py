"""The run registry: one record per submission, written whole, found again by the run that made it and by later
runs for the same outputs."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import replace

from snakemake_executor_multinode.contract.jobfiles import INDEX_DIR, RUNS_DIR
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


def test_an_adopted_jobs_reported_end_is_found_whichever_record_is_written_first(tmp_path):
    """The adopting run's record keeps the job's submission time: the ended one must win the tie (seen under load:
    the original record was read first and its job taken for one that ended unseen)."""
    for order in ("original first", "adopted first"):
        wd = tmp_path / order.replace(" ", "-")
        earlier = sub("a", "mn-a-work")
        adopted = replace(earlier, run_id="z", adopted_from="a", ended="success", ended_at=2.0)
        for record in [earlier, adopted] if order == "original first" else [adopted, earlier]:
            Registry(wd, record.run_id).record(record)
        found = Registry(wd, "now").latest_for(["out.txt"])
        assert found is not None and found.ended == "success", order


def scan(root, run_id: str, outputs) -> Submission | None:
    """What the index stands for: the best record of another run in the whole history (the former full scan)."""
    mine = [s for s in runs(root) if s.run_id != run_id and s.jobid and sorted(s.outputs) == sorted(outputs)]
    return max(mine, key=lambda s: (s.submitted_at, s.ended is not None), default=None)


def test_the_index_answers_as_reading_the_whole_history_would(tmp_path):
    rng = random.Random(7)
    outputs = [("a.txt",), ("b.txt",), ("a.txt", "b.txt")]
    at = 0.0
    for run in range(12):
        reg = Registry(tmp_path, f"r{run}")
        for n in range(rng.randint(1, 6)):
            at += rng.choice([0.0, 1.0])  # ties too
            out = rng.choice(outputs)
            s = reg.record(sub(f"r{run}", f"j{n}", outputs=out, jobid=rng.choice([None, str(n)]), at=at))
            if s.jobid and rng.random() < 0.3:
                reg.ended(s, "success")
        for out in outputs:
            for asking in (f"r{run}", "new"):
                assert Registry(tmp_path, asking).latest_for(list(out)) == scan(tmp_path / RUNS_DIR, asking, out)


def test_a_folder_written_before_the_index_is_indexed_once_by_the_next_run(tmp_path):
    Registry(tmp_path, "old").record(sub("old", "a", jobid="11"))
    shutil.rmtree(tmp_path / INDEX_DIR)  # as an older version of the plugin left it
    found = Registry(tmp_path, "now").latest_for(["out.txt"])
    assert found is not None and found.jobid == "11"
    assert (tmp_path / INDEX_DIR).is_dir() and not list((tmp_path / INDEX_DIR).parent.glob(".index-*"))


def test_this_runs_own_submission_never_hides_the_earlier_runs_one(tmp_path):
    Registry(tmp_path, "old").record(sub("old", "a", jobid="1", at=1.0))
    now = Registry(tmp_path, "now")
    now.record(sub("now", "b", jobid="2", at=2.0))  # e.g. an earlier attempt of this run
    found = now.latest_for(["out.txt"])
    assert found is not None and found.jobid == "1"
