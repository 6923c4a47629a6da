"""Text normalization and paragraph splitting for dedup.

Two normalizations, one per use:

- `normalize_for_exact` (exact document and paragraph hashes): lowercase,
  whitespace runs collapsed to one space, ends stripped. Texts that differ
  only in case or spacing are duplicates; punctuation still counts.
- `normalize_for_shingles` (fuzzy): additionally drops every character that
  is neither a word character (Python's `\\w`: `str.isalnum()` or `_`) nor
  whitespace, so shingles see only words and single spaces, as Marin's
  CleanText does before its MinHash.

`codepoints_for_shingles` is the same normalization, returned as a uint32
code point array and computed with numpy (the regex form costs about ten
times more on long documents); tests hold the two equal.
"""

from __future__ import annotations

import functools
import re

import numpy as np

_WS_RUN = re.compile(r"\s+")
_NOT_WORD_OR_SPACE = re.compile(r"[^\w\s]")
_BMP = 0x10000
_KEEP, _SPACE, _DROP = 0, 1, 2


def normalize_for_exact(text: str) -> str:
    return _WS_RUN.sub(" ", text.lower()).strip()


def normalize_for_shingles(text: str) -> str:
    return _WS_RUN.sub(" ", _NOT_WORD_OR_SPACE.sub("", text.lower())).strip()


def _classify(c: int) -> int:
    ch = chr(c)
    if ch.isalnum() or ch == "_":
        return _KEEP
    if ch.isspace():
        return _SPACE
    return _DROP


@functools.lru_cache(maxsize=1)
def _bmp_classes() -> np.ndarray:
    return np.array([_classify(c) for c in range(_BMP)], dtype=np.uint8)


def codepoints_for_shingles(text: str) -> np.ndarray:
    """`normalize_for_shingles(text)` as a uint32 array of code points."""
    cps = np.frombuffer(text.lower().encode("utf-32-le"), dtype="<u4")
    if len(cps) == 0:
        return np.zeros(0, dtype=np.uint32)
    table = _bmp_classes()
    classes = np.empty(len(cps), dtype=np.uint8)
    bmp = cps < _BMP
    classes[bmp] = table[cps[bmp]]
    if not bmp.all():
        astral = ~bmp
        classes[astral] = [_classify(int(c)) for c in cps[astral]]
    kept = classes != _DROP
    cps = cps[kept]
    is_space = classes[kept] == _SPACE
    # A space survives only when it follows a non-space; a leading space and
    # a trailing one are then stripped.
    prev_space = np.empty_like(is_space)
    if len(is_space):
        prev_space[0] = True
        prev_space[1:] = is_space[:-1]
    keep = ~(is_space & prev_space)
    cps = np.where(is_space, np.uint32(32), cps)[keep]
    if len(cps) and cps[-1] == 32:
        cps = cps[:-1]
    return cps.astype(np.uint32, copy=False)


def split_paragraphs(text: str) -> list[tuple[int, int]]:
    """`(start, end)` character spans of the paragraphs (lines) of `text`.

    A paragraph is a line, as in Marin's paragraph dedup; the span excludes
    the newline. Lines that are blank after normalization are not
    paragraphs (they are never duplicates of anything).
    """
    spans = []
    start = 0
    for line in text.split("\n"):
        end = start + len(line)
        if line.strip():
            spans.append((start, end))
        start = end + 1
    return spans


def batch_codepoints_for_shingles(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """`codepoints_for_shingles` of many texts at once: `(code points, offsets)`.

    Text i is `cps[offsets[i]:offsets[i + 1]]`. One pass of numpy over the
    concatenation instead of a dozen small calls per text (short documents
    spend most of their time in per-call overhead otherwise).
    """
    lowered = [t.lower() for t in texts]
    lengths = np.fromiter((len(t) for t in lowered), dtype=np.int64, count=len(lowered))
    cps = np.frombuffer("".join(lowered).encode("utf-32-le"), dtype="<u4")
    doc = np.repeat(np.arange(len(texts), dtype=np.int64), lengths)
    if len(cps) == 0:
        return np.zeros(0, np.uint32), np.zeros(len(texts) + 1, np.int64)
    table = _bmp_classes()
    classes = np.empty(len(cps), dtype=np.uint8)
    bmp = cps < _BMP
    classes[bmp] = table[cps[bmp]]
    if not bmp.all():
        astral = ~bmp
        classes[astral] = [_classify(int(c)) for c in cps[astral]]
    kept = classes != _DROP
    cps, doc = cps[kept], doc[kept]
    is_space = classes[kept] == _SPACE
    # A space survives only after a non-space of the same text, and not last in it.
    prev_space = np.ones_like(is_space)
    prev_space[1:] = is_space[:-1] | (doc[1:] != doc[:-1])
    keep = ~(is_space & prev_space)
    cps, doc, is_space = cps[keep], doc[keep], is_space[keep]
    last_of_doc = np.ones(len(doc), dtype=bool)
    last_of_doc[:-1] = doc[1:] != doc[:-1]
    keep = ~(is_space & last_of_doc)
    cps = np.where(is_space[keep], np.uint32(32), cps[keep]).astype(np.uint32, copy=False)
    doc = doc[keep]
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(np.bincount(doc, minlength=len(texts)))
    return cps, offsets
