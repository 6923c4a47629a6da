"""Shingles of a document: character n-grams or word n-grams of its normalized text.

A shingle is a string: `n` consecutive code points of
`normalize_for_shingles(text)` (kind "char"), or `n` consecutive words of it
joined by single spaces (kind "word"). A document has no shingle when its
normalized text is shorter than one shingle. The set of shingle hashes is
what the MinHash kernel reads; `shingle_strings` is the same set as strings,
for datasketch and for computing true Jaccard similarities in tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

from marin_dagster.dupekit.hashing import PrefixHashes, shingle_hash
from marin_dagster.dupekit.text import (
    SEPARATOR,
    batch_codepoints_for_shingles,
    normalize_for_shingles,
)

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
        return [norm[i : i + config.n] for i in range(len(norm) - config.n + 1)]
    words = norm.split(" ") if norm else []
    return [" ".join(words[i : i + config.n]) for i in range(len(words) - config.n + 1)]


def shingle_hashes(text: str, config: ShingleConfig) -> np.ndarray:
    """`shingle_hash` of each shingle (uint32, repeats included)."""
    return batch_shingle_hashes([text], config)[0]


# Texts are normalized and hashed a few hundred kilobytes at a time: the prefix sums
# (8 bytes per code point) then stay in cache, which measured 1.5x faster than 2 MB.
CHUNK_CHARS = 1 << 18


def batch_shingle_hashes(texts: list[str], config: ShingleConfig) -> list[np.ndarray]:
    """`shingle_hashes` of many texts, computed in vectorized passes over chunks of them."""
    return [h for chunk in cache_sized_chunks(texts) for h in _chunk_hashes(chunk, config)]


def cache_sized_chunks(texts: list[str], size: int = CHUNK_CHARS) -> Iterator[list[str]]:
    """Consecutive runs of `texts` of about `size` characters (at least one text)."""
    start, chars = 0, 0
    for i, text in enumerate(texts):
        chars += len(text)
        if chars >= size:
            yield texts[start : i + 1]
            start, chars = i + 1, 0
    if start < len(texts):
        yield texts[start:]


def _chunk_hashes(texts: list[str], config: ShingleConfig) -> list[np.ndarray]:
    # ASCII texts (most web text) and the others are normalized apart, so one curly
    # quote does not send the whole chunk down the general path.
    ascii_rows = [i for i, t in enumerate(texts) if t.isascii()]
    if len(ascii_rows) in (0, len(texts)):
        return codepoint_shingle_hashes(*batch_codepoints_for_shingles(texts), config)
    other_rows = [i for i, t in enumerate(texts) if not t.isascii()]
    out: list[np.ndarray] = [np.zeros(0, np.uint32)] * len(texts)
    for rows in (ascii_rows, other_rows):
        group = [texts[i] for i in rows]
        hashes = codepoint_shingle_hashes(*batch_codepoints_for_shingles(group), config)
        for i, h in zip(rows, hashes, strict=True):
            out[i] = h
    return out


def codepoint_shingle_hashes(
    cps: np.ndarray, starts: np.ndarray, ends: np.ndarray, config: ShingleConfig
) -> list[np.ndarray]:
    """The shingle hashes of texts given as `batch_codepoints_for_shingles` gives them."""
    n = config.n
    prefix = PrefixHashes(cps)
    if config.kind == "char":
        # Windows across two texts are computed too (cheaper than masking) and dropped.
        windows = prefix.windows(n)
        return [
            windows[s : max(s, e - n + 1)]
            for s, e in zip(starts.tolist(), ends.tolist(), strict=True)
        ]
    # A word lies between two boundaries (a space, a separator, an end of the batch);
    # a shingle is n consecutive words of one text, a contiguous run of the array.
    bounds = np.flatnonzero((cps == 32) | (cps == SEPARATOR))
    word_starts = np.concatenate([[0], bounds + 1])
    word_ends = np.concatenate([bounds, [len(cps)]])
    real = word_ends > word_starts  # an empty text leaves an empty word
    word_starts, word_ends = word_starts[real], word_ends[real]
    word_text = np.searchsorted(ends, word_starts, side="right")
    count = len(word_starts) - n + 1
    if count > 0:
        first = np.flatnonzero(word_text[:count] == word_text[n - 1 :])
        hashes = prefix.runs(word_starts, word_ends, n)[first]
        shingle_text = word_text[first]
    else:
        hashes = np.zeros(0, np.uint32)
        shingle_text = np.zeros(0, np.int64)
    cuts = np.searchsorted(shingle_text, np.arange(len(starts) + 1), side="left").tolist()
    return [hashes[cuts[i] : cuts[i + 1]] for i in range(len(starts))]


def shingle_hash_set(text: str, config: ShingleConfig) -> set[int]:
    """The set of shingle hashes, computed one shingle at a time (a reference)."""
    return {shingle_hash(s) for s in shingle_strings(text, config)}
