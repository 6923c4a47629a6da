"""Test corpora for the dedup pipeline: Shakespeare as JSONL shards, plus edited copies."""

from __future__ import annotations

import gzip
import json
import os
import random
from collections.abc import Iterable

import numpy as np

from marin_dagster.dupekit.text import codepoints_for_shingles


def write_jsonl_gz(path: str, records: Iterable[dict]) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path


def read_jsonl_gz(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def edited(text: str, rate: float, rng: random.Random, vocabulary: list[str]) -> str:
    """`text` with about `rate` of its words replaced, deleted, or preceded by a new word."""
    out = []
    for word in text.split(" "):
        r = rng.random()
        if r < rate / 3:
            out.append(rng.choice(vocabulary))
        elif r < 2 * rate / 3:
            continue
        elif r < rate:
            out.extend([rng.choice(vocabulary), word])
        else:
            out.append(word)
    return " ".join(out)


def near_duplicate_docs(
    docs: list[dict],
    seed: int = 0,
    originals: int = 24,
    rates: tuple[float, ...] = (0.01, 0.03, 0.06, 0.12),
) -> list[dict]:
    """Chunks of the modern plays (about 2.5 KB) and copies of each with word edits."""
    rng = random.Random(seed)
    plays = [d for d in docs if d["source"] == "shakespeare" and d["edition"] == "modern"]
    vocabulary = sorted({w for d in plays[:3] for w in d["text"].split() if w.isalpha()})
    out = []
    for i in range(originals):
        play = plays[i % len(plays)]
        start = rng.randrange(0, len(play["text"]) - 3000)
        chunk = play["text"][start : start + 2500]
        out.append({"id": f"synthetic/{i:03d}/original", "text": chunk})
        for rate in rates:
            out.append(
                {
                    "id": f"synthetic/{i:03d}/edit-{rate:.2f}",
                    "text": edited(chunk, rate, rng, vocabulary),
                }
            )
    return out


def exact_shingle_set(text: str, n: int = 5) -> np.ndarray:
    """The document's character n-gram set, exactly: each shingle packed losslessly into 64 bits."""
    cps = codepoints_for_shingles(text).astype(np.uint64)
    if len(cps) < n:
        return np.zeros(0, np.uint64)
    bits = 64 // n
    assert int(cps.max()) < (1 << bits), "a code point too large to pack; use strings"
    windows = np.lib.stride_tricks.sliding_window_view(cps, n)
    packed = np.zeros(len(windows), np.uint64)
    for j in range(n):
        packed = (packed << np.uint64(bits)) | windows[:, j]
    return np.unique(packed)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) == 0 and len(b) == 0:
        return 1.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)


def hostile_texts() -> list[str]:
    """Hostile texts: empty, shorter than a shingle, exactly one, non-ASCII, astral,
    lone surrogates, the separator byte, very long words, and one long document."""
    rng = random.Random(11)
    words = ["the", "quick", "brown", "fox", "Straße", "İstanbul", "日本語", "😀x", "a\ud800b"]
    texts = ["", " ", "a", "abcd", "abcde", "a b c d", "a b c d e", "\x80 a b c d e", "!!! ..."]
    texts += ["x" * 500 + " tail", " ".join(["w" * 70] * 8), "\ud800" * 9]
    texts += [" ".join(rng.choice(words) for _ in range(rng.randint(0, 300))) for _ in range(30)]
    texts += ["Plain ASCII prose, with punctuation! " * rng.randint(1, 60) for _ in range(30)]
    texts.append("lorem ipsum dolor sit amet " * 2000)
    rng.shuffle(texts)
    return texts
