"""Shingles of a document: character n-grams or word n-grams of its normalized text.

A shingle is a string: `n` consecutive code points of
`normalize_for_shingles(text)` (kind "char"), or `n` consecutive words of it
joined by single spaces (kind "word"). A document has no shingle when its
normalized text is shorter than one shingle. The set of shingle hashes is
what the MinHash kernel reads; `shingle_strings` is the same set as strings,
for datasketch and for computing true Jaccard similarities in tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from marin_dagster.dupekit.hashing import murmur3_segments, murmur3_windows, shingle_hash
from marin_dagster.dupekit.text import codepoints_for_shingles, normalize_for_shingles

ShingleKind = Literal["char", "word"]


@dataclass(frozen=True)
class ShingleConfig:
    """How documents are cut into shingles (Marin's default: 5 characters)."""

    kind: ShingleKind = "char"
    n: int = 5

    def __post_init__(self) -> None:
        if self.kind not in ("char", "word"):
            raise ValueError(f"shingle kind must be 'char' or 'word', not {self.kind!r}")
        if self.n < 1:
            raise ValueError(f"shingle size n must be at least 1, got {self.n}")


def shingle_strings(text: str, config: ShingleConfig) -> list[str]:
    """The document's shingles as strings, in order, repeats included."""
    norm = normalize_for_shingles(text)
    if config.kind == "char":
        return [norm[i: i + config.n] for i in range(len(norm) - config.n + 1)]
    words = norm.split(" ") if norm else []
    return [" ".join(words[i: i + config.n]) for i in range(len(words) - config.n + 1)]


def shingle_hashes(text: str, config: ShingleConfig) -> np.ndarray:
    """`shingle_hash` of each shingle (uint32, repeats included)."""
    cps = codepoints_for_shingles(text)
    if config.kind == "char":
        return murmur3_windows(cps, config.n)
    if len(cps) == 0:
        return np.zeros(0, dtype=np.uint32)
    spaces = np.flatnonzero(cps == 32)
    word_starts = np.concatenate([[0], spaces + 1])
    word_ends = np.concatenate([spaces, [len(cps)]])
    count = len(word_starts) - config.n + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint32)
    # A word shingle is a contiguous run of the normalized text: from the
    # start of its first word to the end of its last.
    starts = word_starts[:count]
    lengths = word_ends[config.n - 1:] - starts
    return murmur3_segments(cps, starts, lengths)


def shingle_hash_set(text: str, config: ShingleConfig) -> set[int]:
    """The set of shingle hashes, computed one shingle at a time (a reference)."""
    return {shingle_hash(s) for s in shingle_strings(text, config)}
