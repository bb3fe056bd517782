"""Build the byte-level training corpus: train.bin / val.bin (uint16 tokens) and stats.json.

    python workflows/scripts/preprocess.py --out-dir DIR [--shard I --num-shards N] [--seed S]
                                           [--val-fraction F] [--num-docs D] [--input TEXT ...]
    python workflows/scripts/preprocess.py --merge DIR1 DIR2 ... --out-dir OUT

Documents come from a seeded procedural generator (no downloads), or, with --input, from the paragraphs of
text files. Generators (--generator): `prose` (the default, the example pipeline's: a small grammar a tiny model
learns quickly) and `hard` (for numerics checks that must be able to fail: a Zipf-distributed lexicon of
pseudo-words, random digits, and values declared at a document's start and recalled later, so the loss keeps an
entropy floor far from zero and falls slowly as the model learns to copy from far back).
Tokens are the UTF-8 bytes (0..255) plus EOS=256 after each document (vocab 257).
Each document goes to val with probability --val-fraction, decided by a hash of (seed, document index), so
the output is a pure function of the arguments.

Sharding: shard I of N takes the contiguous document range [I*D/N, (I+1)*D/N) and writes its own --out-dir.
--merge concatenates shard dirs in the order given: merging shards 0..N-1 reproduces the unsharded output
byte for byte.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import random
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm import DATA_FORMAT, DATA_VOCAB, EOS_ID, TOKEN_DTYPE  # noqa: E402

GENERATOR_VERSION = 1

NAMES = [
    "Ada",
    "Bruno",
    "Clara",
    "Dmitri",
    "Elena",
    "Farid",
    "Greta",
    "Hugo",
    "Ines",
    "Jonas",
    "Kira",
    "Lars",
    "Mira",
    "Nils",
    "Olga",
    "Pavel",
    "Rosa",
    "Sven",
    "Tilda",
    "Umar",
    "Vera",
    "Wim",
    "Yara",
    "Zeno",
]
ADJECTIVES = [
    "old",
    "quiet",
    "bright",
    "narrow",
    "green",
    "cold",
    "heavy",
    "small",
    "golden",
    "tired",
    "crooked",
    "gentle",
    "wide",
    "silent",
    "red",
    "careful",
    "distant",
    "busy",
    "pale",
    "warm",
]
NOUNS = [
    "river",
    "miller",
    "lantern",
    "ferry",
    "orchard",
    "bridge",
    "harbour",
    "wagon",
    "garden",
    "tower",
    "baker",
    "letter",
    "forest",
    "market",
    "clock",
    "window",
    "shepherd",
    "road",
    "village",
    "boat",
]
PLACES = [
    "the valley",
    "the hill",
    "the square",
    "the old mill",
    "the coast",
    "the north gate",
    "the inn",
    "the library",
    "the station",
    "the meadow",
    "the quay",
    "the chapel",
]
VERBS = [
    "crossed",
    "watched",
    "carried",
    "painted",
    "found",
    "followed",
    "repaired",
    "visited",
    "counted",
    "remembered",
    "opened",
    "described",
]
WEATHER = [
    "It rained all morning.",
    "The wind came from the sea.",
    "Snow covered the roofs.",
    "The sun was low and yellow.",
    "Fog hid the far bank.",
    "The night was clear and still.",
]
NUMBER_WORDS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
]


def sentence(rng: random.Random) -> str:
    """One sentence from a small grammar: varied but regular, so a tiny model can learn it."""
    kind = rng.randrange(6)
    n1, n2 = rng.choice(NOUNS), rng.choice(NOUNS)
    a1, a2 = rng.choice(ADJECTIVES), rng.choice(ADJECTIVES)
    name = rng.choice(NAMES)
    if kind == 0:
        return f"The {a1} {n1} {rng.choice(VERBS)} the {a2} {n2} near {rng.choice(PLACES)}."
    if kind == 1:
        return f'{name} said, "The {n1} is {a1}, but the {n2} is {a2}."'
    if kind == 2:
        a, b = rng.randrange(10), rng.randrange(9)
        return f"{NUMBER_WORDS[a].capitalize()} plus {NUMBER_WORDS[b]} is {NUMBER_WORDS[a + b]}."
    if kind == 3:
        start = rng.randrange(8)
        return ", ".join(NUMBER_WORDS[start : start + rng.randrange(3, 7)]).capitalize() + "."
    if kind == 4:
        return rng.choice(WEATHER)
    return f"{name} {rng.choice(VERBS)} {rng.randrange(2, 40)} {n1}s on the way to {rng.choice(PLACES)}."


def generated_document(seed: int, index: int) -> str:
    rng = random.Random(f"doc:{seed}:{index}")  # str seeds hash with SHA-512: stable across runs
    title = f"Chapter {index + 1}: The {rng.choice(ADJECTIVES).capitalize()} {rng.choice(NOUNS).capitalize()}"
    paragraphs = [" ".join(sentence(rng) for _ in range(rng.randrange(3, 8))) for _ in range(rng.randrange(2, 5))]
    return title + "\n\n" + "\n\n".join(paragraphs) + "\n"


SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"] + ["th", "sh", "qu", "x"]
HARD_LEXICON_SIZE = 3000


@functools.cache
def hard_lexicon() -> tuple[list[str], list[float]]:
    """Pseudo-words of 1-4 syllables and their Zipf cumulative weights (rank r: 1 / (r + 1) ** 1.1)."""
    rng = random.Random("hard-lexicon")
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < HARD_LEXICON_SIZE:
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4)))
        if word not in seen:
            seen.add(word)
            words.append(word)
    cum, total = [], 0.0
    for r in range(len(words)):
        total += 1 / (r + 1) ** 1.1
        cum.append(total)
    return words, cum


def hard_document(seed: int, index: int) -> str:
    """Values declared first and recalled later (long-range copies), between Zipf word salad and fresh digits."""
    rng = random.Random(f"hard:{seed}:{index}")
    words, cum = hard_lexicon()
    names = [rng.choice(words).capitalize() for _ in range(rng.randint(3, 6))]
    values = {name: str(rng.randrange(10 ** rng.randint(3, 5))) for name in names}
    lines = [f"{name} is {value}." for name, value in values.items()]
    for _ in range(rng.randint(6, 14)):
        if rng.random() < 0.35:
            name = rng.choice(names)
            lines.append(f"Recall {name}: {values[name]}.")
        else:
            salad = " ".join(rng.choices(words, cum_weights=cum, k=rng.randint(4, 12)))
            lines.append(f"{salad.capitalize()} {rng.randrange(1000)}.")
    return f"Record {index + 1}\n" + "\n".join(lines) + "\n"


GENERATORS = {"prose": generated_document, "hard": hard_document}


def text_documents(paths: Iterable[str]) -> list[str]:
    """Paragraphs (blank-line separated) of the given text files, in order."""
    docs: list[str] = []
    for path in paths:
        text = Path(path).read_text(encoding="utf-8")
        docs.extend(p.strip() + "\n" for p in text.split("\n\n") if p.strip())
    return docs


def is_val(seed: int, index: int, fraction: float) -> bool:
    digest = hashlib.sha256(f"split:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def shard_range(num_docs: int, shard: int, num_shards: int) -> tuple[int, int]:
    return shard * num_docs // num_shards, (shard + 1) * num_docs // num_shards


def encode(doc: str) -> np.ndarray:
    data = np.frombuffer(doc.encode("utf-8"), dtype=np.uint8).astype(TOKEN_DTYPE)
    return np.concatenate([data, np.array([EOS_ID], dtype=TOKEN_DTYPE)])


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_split(out_dir: Path, name: str, parts: list[np.ndarray]) -> int:
    arr = np.concatenate(parts) if parts else np.zeros(0, dtype=TOKEN_DTYPE)
    arr.astype(TOKEN_DTYPE).tofile(out_dir / f"{name}.bin")
    return int(arr.size)


def write_stats(out_dir: Path, extra: dict) -> dict:
    stats = {
        "format": DATA_FORMAT,
        "dtype": np.dtype(TOKEN_DTYPE).name,
        "vocab_size": DATA_VOCAB,
        "eos_id": EOS_ID,
        "train_tokens": int((out_dir / "train.bin").stat().st_size // np.dtype(TOKEN_DTYPE).itemsize),
        "val_tokens": int((out_dir / "val.bin").stat().st_size // np.dtype(TOKEN_DTYPE).itemsize),
        "sha256": {name: sha256_file(out_dir / name) for name in ("train.bin", "val.bin")},
        **extra,
    }
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    return stats


def build(
    out_dir: Path,
    seed: int,
    val_fraction: float,
    num_docs: int,
    shard: int,
    num_shards: int,
    inputs: list[str] | None,
    generator: str = "prose",
) -> dict:
    source_docs = text_documents(inputs) if inputs else None
    total = len(source_docs) if source_docs is not None else num_docs
    lo, hi = shard_range(total, shard, num_shards)
    train: list[np.ndarray] = []
    val: list[np.ndarray] = []
    n_val = 0
    for i in range(lo, hi):
        doc = source_docs[i] if source_docs is not None else GENERATORS[generator](seed, i)
        if is_val(seed, i, val_fraction):
            val.append(encode(doc))
            n_val += 1
        else:
            train.append(encode(doc))
    out_dir.mkdir(parents=True, exist_ok=True)
    write_split(out_dir, "train", train)
    write_split(out_dir, "val", val)
    return write_stats(
        out_dir,
        {
            # The prose generator's record stays as it was, so existing outputs keep their stats.
            "source": {"inputs": inputs}
            if inputs
            else {"generator": GENERATOR_VERSION}
            if generator == "prose"
            else {"generator": GENERATOR_VERSION, "kind": generator},
            "seed": seed,
            "val_fraction": val_fraction,
            "shard": shard,
            "num_shards": num_shards,
            "doc_range": [lo, hi],
            "docs": hi - lo,
            "val_docs": n_val,
        },
    )


def merge(dirs: list[Path], out_dir: Path) -> dict:
    stats = [json.loads((d / "stats.json").read_text()) for d in dirs]
    expected = (DATA_FORMAT, np.dtype(TOKEN_DTYPE).name, DATA_VOCAB)
    for d, s in zip(dirs, stats, strict=True):
        if (s["format"], s["dtype"], s["vocab_size"]) != expected:
            raise SystemExit(f"preprocess.py: {d} has an incompatible format: {s['format']} {s['dtype']}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):
        parts = [np.fromfile(d / f"{split}.bin", dtype=TOKEN_DTYPE) for d in dirs]
        write_split(out_dir, split, parts)
    return write_stats(
        out_dir,
        {
            "merged_from": [
                {"dir": str(d), "shard": s.get("shard"), "doc_range": s.get("doc_range")}
                for d, s in zip(dirs, stats, strict=True)
            ],
            "docs": sum(s.get("docs", 0) for s in stats),
            "val_docs": sum(s.get("val_docs", 0) for s in stats),
        },
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="byte-level corpus -> train.bin / val.bin / stats.json")
    p.add_argument("--out-dir", required=True, type=Path)
    p.add_argument("--shard", type=int, default=0, help="this shard's index (0-based)")
    p.add_argument("--num-shards", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--val-fraction", type=float, default=0.05)
    p.add_argument("--num-docs", type=int, default=2000, help="generated documents (all shards together)")
    p.add_argument("--generator", choices=sorted(GENERATORS), default="prose", help="generated documents' kind")
    p.add_argument("--input", nargs="+", help="text files to use instead of generated documents")
    p.add_argument("--merge", nargs="+", type=Path, metavar="DIR", help="concatenate these shard dirs")
    args = p.parse_args(argv)
    if not 0 <= args.shard < args.num_shards:
        p.error(f"--shard {args.shard} not in 0..{args.num_shards - 1}")
    if not 0 <= args.val_fraction < 1:
        p.error("--val-fraction must be in [0, 1)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        stats = merge(args.merge, args.out_dir)
    else:
        stats = build(
            args.out_dir,
            args.seed,
            args.val_fraction,
            args.num_docs,
            args.shard,
            args.num_shards,
            args.input,
            args.generator,
        )
    print(
        f"{args.out_dir}: train {stats['train_tokens']:,} tokens, val {stats['val_tokens']:,} tokens, "
        f"{stats['docs']} docs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
