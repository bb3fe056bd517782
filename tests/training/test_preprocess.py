"""preprocess.py: a deterministic byte-level corpus; shards merge back into the unsharded corpus."""

from __future__ import annotations

import json
from pathlib import Path

import lm
import numpy as np
import preprocess

ARGS = ["--num-docs", "120", "--seed", "5", "--val-fraction", "0.1"]


def build(out: Path, *extra: str) -> dict:
    assert preprocess.main(["--out-dir", str(out), *ARGS, *extra]) == 0
    return json.loads((out / "stats.json").read_text())


def test_preprocess_is_deterministic(tmp_path: Path) -> None:
    a, b = build(tmp_path / "a"), build(tmp_path / "b")
    assert a["sha256"] == b["sha256"]
    for split in ("train.bin", "val.bin"):
        assert (tmp_path / "a" / split).read_bytes() == (tmp_path / "b" / split).read_bytes()


def test_a_different_seed_gives_a_different_corpus(tmp_path: Path) -> None:
    a = build(tmp_path / "a")
    assert preprocess.main(["--out-dir", str(tmp_path / "c"), "--num-docs", "120", "--seed", "6"]) == 0
    c = json.loads((tmp_path / "c" / "stats.json").read_text())
    assert a["sha256"]["train.bin"] != c["sha256"]["train.bin"]


def test_stats_describe_the_token_files(tmp_path: Path) -> None:
    stats = build(tmp_path)
    train = lm.load_tokens(tmp_path, "train")
    val = lm.load_tokens(tmp_path, "val")
    assert (stats["vocab_size"], stats["eos_id"], stats["dtype"]) == (257, 256, "uint16")
    assert (stats["train_tokens"], stats["val_tokens"]) == (len(train), len(val))
    assert stats["val_docs"] > 0 and len(val) > 0
    assert int(np.count_nonzero(train == lm.EOS_ID)) + int(np.count_nonzero(val == lm.EOS_ID)) == 120
    assert train.max() <= lm.EOS_ID
    # Tokens are the UTF-8 bytes of the documents.
    first_doc = bytes(train[: int(np.argmax(train == lm.EOS_ID))].astype(np.uint8)).decode()
    assert first_doc.startswith("Chapter ")


def test_shards_merged_in_order_equal_the_unsharded_corpus(tmp_path: Path) -> None:
    whole = build(tmp_path / "whole")
    shard_dirs = [tmp_path / f"shard{i}" for i in range(3)]
    for i, d in enumerate(shard_dirs):
        stats = build(d, "--shard", str(i), "--num-shards", "3")
        assert stats["doc_range"] == [i * 40, (i + 1) * 40]
    merge_args = ["--merge", *map(str, shard_dirs), "--out-dir", str(tmp_path / "merged")]
    assert preprocess.main(merge_args) == 0
    merged = json.loads((tmp_path / "merged" / "stats.json").read_text())
    assert merged["sha256"] == whole["sha256"]
    assert (merged["train_tokens"], merged["val_tokens"]) == (whole["train_tokens"], whole["val_tokens"])
    assert merged["docs"] == 120


def test_text_files_can_replace_the_generated_prose(tmp_path: Path) -> None:
    text = tmp_path / "book.txt"
    text.write_text("First paragraph.\n\nSecond paragraph, with more words.\n\n\nThird.\n")
    out = tmp_path / "out"
    assert preprocess.main(["--out-dir", str(out), "--input", str(text), "--val-fraction", "0"]) == 0
    tokens = lm.load_tokens(out, "train")
    docs = bytes(t for t in tokens.tolist() if t < 256).decode()
    assert docs == "First paragraph.\nSecond paragraph, with more words.\nThird.\n"
    assert int(np.count_nonzero(tokens == lm.EOS_ID)) == 3
