"""A damaged checkpoint on the real local SLURM cluster (issue 38, part 1): a 2-node `--executor multinode` rule
trains workflows/scripts/train.py (torch_ddp, CPU + gloo, a tiny model, one rank per node) with checkpoints every
2 steps and stops after step 6 (stop_after: checkpoint, exit 0, no final model). The test truncates the newest
checkpoint's model shard and reruns the rule's other target, the same training to the end: the resume skips the
damaged checkpoint with a line naming the file, resumes from step 4 and finishes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import job_logs, snakemake, training_folder
from tests.training.helpers import TINY

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

STEPS, STOP, EVERY = 8, 6, 2
CONFIG = {**TINY, "plugin": "torch_ddp", "steps": STEPS, "ckpt_every": EVERY, "keep_ckpts": 3}
SHARD = "model/pytorch_model-00001.bin"

# One --ckpt-dir named here, whatever the target: "stopped" adds stop_after, "final" trains to the end. (The example
# workflow keys its checkpoint folder by the whole train config, stop_after included.)
SNAKEFILE = """
import json
CFG = {config!r}

rule train:
    output: "done-{{tag}}.txt"
    params: cfg=lambda wc: json.dumps({{**CFG, **({{"stop_after": {stop}}} if wc.tag == "stopped" else {{}})}})
    resources: nodes=2, gpus=1, cpus_per_task=1, mem_mb=3000, runtime=30
    shell:
        "multinode torchrun scripts/train.py --data-dir data --out model.pt --ckpt-dir ckpt "
        "--metrics ckpt/metrics.jsonl --config-json {{params.cfg:q}} && echo ok > {{output}}"
"""


def workflow(tmp_path: Path) -> Path:
    wd = tmp_path / "damage"
    training_folder(wd)
    (wd / "Snakefile").write_text(SNAKEFILE.format(config=CONFIG, stop=STOP))
    return wd


def test_a_truncated_shard_of_the_newest_checkpoint_is_skipped_and_the_training_finishes(slurm_cluster, tmp_path):
    wd = workflow(tmp_path)
    snakemake(wd, "done-stopped.txt", timeout=600)
    ckpts = sorted(p.name for p in (wd / "ckpt").glob("step_*"))
    assert ckpts == [f"step_{s:08d}" for s in (2, 4, 6)], ckpts
    assert not (wd / "model.pt").exists()
    shard = wd / "ckpt" / f"step_{STOP:08d}" / SHARD
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[: size // 2])

    snakemake(wd, "done-final.txt", timeout=600)
    logs = job_logs(wd, "train")
    assert len(logs) == 2, logs
    second = max(logs, key=lambda p: p.stat().st_mtime).read_text()
    skipped = [line for line in second.splitlines() if "checkpoint: skipping damaged" in line]
    assert len(skipped) == 1, second[-4000:]
    assert skipped[0].endswith(f"ckpt/step_{STOP:08d}: {SHARD}: size {size // 2} != {size} (saved)"), skipped
    assert f"resumed from ckpt/step_{STOP - EVERY:08d} at step {STOP - EVERY}" in second, second[-4000:]
    assert f"done: step {STEPS}" in second
    records = [json.loads(line) for line in (wd / "ckpt" / "metrics.jsonl").read_text().splitlines() if line]
    assert [r["step"] for r in records if r.get("event") == "resume"] == [STOP - EVERY]
    assert [r["step"] for r in records if "event" not in r] == list(range(1, STEPS + 1))
    assert (wd / "model.pt").exists()
