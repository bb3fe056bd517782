"""train.py's config contract, the CPU refusal of GPU-only plugins, model/data/schedule building blocks."""

from __future__ import annotations

import sys
from pathlib import Path

import lm
import pytest
import torch
import train
import yaml

from .helpers import SCRIPTS, TINY, run, torchrun_argv, train_argv


def test_default_config_prints_as_yaml_with_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert train.main(["--print-default-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == lm.DEFAULT_CONFIG
    required = (
        "plugin tp pp sp sp_mode precision n_layer n_head d_model seq_len vocab steps micro_batch "
        "grad_accum lr warmup schedule ckpt_every seed compile log_every"
    ).split()
    assert set(required) <= set(printed)


def test_train_docstring_documents_every_config_key() -> None:
    doc = train.__doc__
    missing = [key for key in lm.DEFAULT_CONFIG if key not in doc]
    assert not missing


@pytest.mark.parametrize("plugin", ["gemini", "low_level_zero"])
def test_gpu_only_plugin_on_cpu_exits_2_naming_the_plugin_and_why(plugin: str, tmp_path: Path, data_dir: Path) -> None:
    proc = run(
        [
            sys.executable,
            "-X",
            "importtime",  # every module the run imports, on stderr
            str(SCRIPTS / "train.py"),
            *train_argv(tmp_path, data_dir, {"plugin": plugin, "precision": "bf16"}),
        ]
    )
    assert proc.returncode == 2
    assert f"plugin {plugin!r} cannot run on this CPU-only machine" in proc.stderr
    assert "CUDA" in proc.stderr or "accelerator device" in proc.stderr
    # refused before ColossalAI loads, so before any process group exists (train.py makes it through ColossalAI)
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert {"torch", "lm"} <= imported  # the import log sees train.py's imports
    assert not {m for m in imported if m.split(".")[0] == "colossalai"}
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow
def test_gpu_only_plugin_under_torchrun_fails_with_worker_exit_code_2(tmp_path: Path, data_dir: Path) -> None:
    proc = run(torchrun_argv(SCRIPTS / "train.py", *train_argv(tmp_path, data_dir, {"plugin": "gemini"})))
    assert proc.returncode != 0
    assert "exitcode  : 2" in proc.stderr  # torchrun's failure report names the worker's code
    assert "plugin 'gemini' cannot run on this CPU-only machine" in proc.stderr


INVALID = {
    "unknown_key": {"steps_total": 3},
    "unknown_plugin": {"plugin": "fsdp"},
    "tp_without_hybrid": {"plugin": "torch_ddp", "tp": 2},
    "seq_len_not_divisible_by_sp": {"plugin": "hybrid", "sp": 2, "seq_len": 63},
    "vocab_below_the_data_vocab": {"vocab": 200},
    "vocab_not_divisible_by_tp": {"plugin": "hybrid", "tp": 2, "vocab": 321},
    "gpu_kernels_on_cpu": {"kernels": ["liger_fused_ce"]},
    "hybrid_with_the_native_model": {"plugin": "hybrid", "model_impl": "native"},
    "ckpt_async_not_a_bool": {"ckpt_async": "yes"},
}


@pytest.mark.parametrize("bad", list(INVALID.values()), ids=list(INVALID))
def test_invalid_config_exits_2_before_training(
    bad: dict, tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)  # as under torchrun with 2 processes
    assert train.main(train_argv(tmp_path, data_dir, bad)) == 2
    assert "train.py: config error:" in capsys.readouterr().err
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.slow
def test_native_model_matches_transformers_llama_on_the_same_weights() -> None:
    cfg = lm.merge_config(TINY)
    mcfg = lm.ModelConfig.from_train_config(cfg)
    torch.manual_seed(0)
    hf = lm.hf_llama(mcfg, "sdpa").eval()
    native = lm.NativeLlama(mcfg).eval()
    native.load_state_dict(hf.state_dict(), strict=True)  # same parameter names and shapes
    ids = torch.randint(0, lm.DATA_VOCAB, (2, cfg["seq_len"]))
    with torch.no_grad():
        a, b = hf(input_ids=ids, labels=ids), native(input_ids=ids, labels=ids)
    torch.testing.assert_close(b.logits, a.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(b.loss, a.loss, rtol=0, atol=1e-6)


def test_lr_schedule_warms_up_linearly_then_cosine_decays_to_the_floor() -> None:
    f = lm.WarmupCosine(total=100, warmup=10, min_ratio=0.1, schedule="cosine")
    assert [f(s) for s in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    assert f(10) == pytest.approx(1.0)
    assert f(55) == pytest.approx(0.55)
    assert f(100) == pytest.approx(0.1) and f(150) == pytest.approx(0.1)
    assert all(f(s) >= f(s + 1) for s in range(10, 120))


def test_batches_are_a_function_of_seed_and_step_and_ranks_split_the_global_batch(data_dir: Path) -> None:
    tokens = lm.load_tokens(data_dir, "train")
    whole = lm.batch_for_step(tokens, 7, 1, 64, 8, 0, 8)
    halves = [lm.batch_for_step(tokens, 7, 1, 64, 8, r * 4, 4) for r in range(2)]
    assert torch.equal(torch.cat(halves), whole)
    assert torch.equal(lm.batch_for_step(tokens, 7, 1, 64, 8, 0, 8), whole)
    assert not torch.equal(lm.batch_for_step(tokens, 8, 1, 64, 8, 0, 8), whole)


def test_plugin_decisions_come_from_the_table_not_from_name_branches() -> None:
    import re

    import plugins

    files = [SCRIPTS / n for n in ("lm.py", "train.py", "checkpoint.py", "evaluate.py", "preprocess.py")]
    files.append(Path(__file__).with_name("causality_check.py"))
    branch = re.compile(r"""(cfg|config)\[["']plugin["']\]\s*(==|!=|in\b|not in\b)|\bplugin\s*(==|!=)\s*["']""")
    lines = [(f.name, line.strip()) for f in files for line in f.read_text().splitlines()]
    offenders = [f"{name}: {line}" for name, line in lines if branch.search(line)]
    assert not offenders
    assert set(plugins.PLUGINS) == {"torch_ddp", "low_level_zero", "gemini", "hybrid"}
    for spec in plugins.PLUGIN_TABLE.values():  # every row answers every question
        assert spec.devices and spec.precisions and spec.model_kind in spec.model_kinds and spec.checkpoint_io
        assert spec.grad_clip in ("loop", "plugin")
        assert ("cpu" in spec.devices) == (spec.cpu_refusal == "")
