"""low_level_zero bf16: ColossalAI 0.5.0 starts the ZeRO fp32 masters on the bf16 grid (its model wrapper casts the
model before the optimizer copies them); lm.boost re-seeds them from the fp32 init. llz_repro.py runs the real
LowLevelZeroPlugin on CPU (a shim names ColossalAI's CPU accelerator "cuda"); docs/training.md, "ZeRO's fp32
masters", has the numbers."""

from __future__ import annotations

import sys

import plugins
import pytest

from .helpers import HANG_S, REPO, run, torchrun_argv

REPRO = REPO / "tests" / "training" / "llz_repro.py"


@pytest.mark.slow
def test_stock_zero_masters_lag_the_reference_and_reseeded_ones_match_it_step_for_step() -> None:
    """ColossalAI's own plugin trains exactly like bf16_master from a bf16-rounded init (its first warm-up update
    mostly rounds away); lm.boost's low_level_zero trains exactly like bf16_master."""
    proc = run([sys.executable, str(REPRO), "--check"], timeout=HANG_S)
    assert proc.returncode == 0 and "check: passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.slow
def test_reseeded_masters_are_each_ranks_padded_shard_of_the_fp32_init() -> None:
    proc = run(torchrun_argv(REPRO, "--check-shards", nproc=3), timeout=HANG_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("master shards equal the fp32 init") == 3, proc.stdout


def test_only_low_level_zero_bf16_reseeds() -> None:
    reseeding = {
        (name, precision)
        for name, spec in plugins.PLUGIN_TABLE.items()
        for precision in spec.precisions
        if plugins.fp32_weights({"plugin": name, "precision": precision}, plugins.nn.Linear(2, 2)) is not None
    }
    assert reseeding == {("low_level_zero", "bf16")}
