"""Causality of the model as each plugin wraps it: changing only the last token changes no earlier logit.

One torchrun (2 CPU ranks) checks every plugin configuration the CPU can run, through causality_check.py,
which builds model, optimizer and plugin with the same lm.py code as train.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .helpers import HANG_S, TINY, run, torchrun_argv

MODEL = {k: TINY[k] for k in ("n_layer", "n_head", "d_model")} | {"seq_len": 32}
CONFIGS: dict[str, dict[str, Any]] = {
    "torch_ddp": {"plugin": "torch_ddp"},
    "torch_ddp_bf16": {"plugin": "torch_ddp", "precision": "bf16"},
    "hybrid_dp": {"plugin": "hybrid"},
    "hybrid_sp2_all_to_all": {"plugin": "hybrid", "sp": 2, "sp_mode": "all_to_all"},
    "hybrid_tp2": {"plugin": "hybrid", "tp": 2},
    "hybrid_tp2_sp_split_gather": {"plugin": "hybrid", "tp": 2, "sp": 2, "sp_mode": "split_gather"},
    "hybrid_pp2": {"plugin": "hybrid", "pp": 2, "grad_accum": 2},
}
# The trap the check must catch: shardformer's sequence-parallel attention over transformers' SDPA model
# without a mask attends to the future.
CONTROL = {"plugin": "hybrid", "sp": 2, "_control": "sdpa_no_mask"}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("causality") / "results.json"
    specs = [f"{name}={json.dumps(MODEL | cfg)}" for name, cfg in {**CONFIGS, "control": CONTROL}.items()]
    proc = run(torchrun_argv(Path(__file__).with_name("causality_check.py"), str(out), *specs), timeout=HANG_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_changing_the_last_token_changes_no_earlier_logit_inside_the_booster(
    name: str, results: dict[str, dict[str, Any]]
) -> None:
    r = results[name]
    assert r["earlier_max_diff"] == 0.0, r
    assert r["last_max_diff"] > 1e-3, r  # the check is sensitive: the last position does change


@pytest.mark.slow
def test_the_check_detects_a_non_causal_model(results: dict[str, dict[str, Any]]) -> None:
    assert results["control"]["earlier_max_diff"] > 1e-3
