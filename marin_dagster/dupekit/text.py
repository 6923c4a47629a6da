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

Unencodable code points: a Python string can hold lone surrogates (U+D800 to
U+DFFF; a JSON `"\ud800"` escape decodes to one), which no UTF encoder
accepts. Every hash of dupekit sees them replaced by U+FFFD first
(`replace_unencodable`, or the same replacement on code point arrays), so the
result is the same whichever path hashes a text; the shingle normalization
then drops U+FFFD like any other symbol. The documents themselves are written
out unchanged (JSON escapes them).
"""

from __future__ import annotations

import functools
import re

import numpy as np

_WS_RUN = re.compile(r"\s+")
_UNENCODABLE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"
_NOT_WORD_OR_SPACE = re.compile(r"[^\w\s]")
_BMP = 0x10000
_KEEP, _SPACE, _DROP, _SEP = 0, 1, 2, 3
# Between the texts of a batch: a control character, which the shingle normalization
# drops, so it never stands for a character of a text.
SEPARATOR_CHAR = "\x80"
SEPARATOR = ord(SEPARATOR_CHAR)


def replace_unencodable(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD (unchanged when it has none)."""
    if text.isascii():  # O(1) in CPython: an ASCII string cannot hold a surrogate
        return text
    return _UNENCODABLE.sub(REPLACEMENT, text)


def has_unencodable(text: str) -> bool:
    """Whether `text` holds a code point that UTF-8 cannot encode (a lone surrogate)."""
    return not text.isascii() and _UNENCODABLE.search(text) is not None


def count_unencodable(texts: list[str]) -> int:
    """How many of `texts` hold an unencodable code point (cheap for ASCII texts)."""
    return sum(1 for t in texts if has_unencodable(t))


def utf32_codepoints(text: str) -> np.ndarray:
    """The code points of `text` as uint32, lone surrogates replaced by U+FFFD."""
    try:
        return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    except UnicodeEncodeError:
        cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4").copy()
        cps[(cps >= 0xD800) & (cps < 0xE000)] = ord(REPLACEMENT)
        return cps


def normalize_for_exact(text: str) -> str:
    return _WS_RUN.sub(" ", text.lower()).strip()


def normalize_for_shingles(text: str) -> str:
    text = replace_unencodable(text)
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
    cps = utf32_codepoints(text.lower())
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


def batch_codepoints_for_shingles(texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`codepoints_for_shingles` of many texts at once: `(code points, starts, ends)`.

    Text i is `cps[starts[i]:ends[i]]`; consecutive texts are separated by one
    `SEPARATOR`, a code point the normalization never keeps. One pass of numpy
    over the joined texts (short documents spend most of their time in
    per-call overhead otherwise). Any character may appear in a text: the
    general path finds the separators by position, the ASCII one by a byte no
    ASCII text holds. The array is uint8 when every text is ASCII, else uint32.
    """
    if not texts:
        return np.zeros(0, np.uint8), np.zeros(0, np.int64), np.zeros(0, np.int64)
    if all(t.isascii() for t in texts):  # O(1) each: most web text
        return _ascii_codepoints(texts)
    table = _bmp_classes()
    lowered = [t.lower() for t in texts]  # may change lengths (U+0130): text by text
    lengths = np.fromiter((len(t) for t in lowered), dtype=np.int64, count=len(lowered))
    cps = utf32_codepoints("\x00".join(lowered))
    if len(cps) and int(cps.max()) < _BMP:
        classes = table[cps]
    else:
        classes = np.empty(len(cps), dtype=np.uint8)
        bmp = cps < _BMP
        classes[bmp] = table[cps[bmp]]
        classes[~bmp] = [_classify(int(c)) for c in cps[~bmp]]
    classes[np.cumsum(lengths[:-1] + 1) - 1] = _SEP
    kept = classes != _DROP
    cps, classes = cps[kept], classes[kept]
    cps[classes == _SEP] = SEPARATOR
    cps[classes == _SPACE] = 32
    return _collapse_spaces(cps)


@functools.lru_cache(maxsize=1)
def _ascii_translation() -> tuple[bytes, bytes]:
    """`bytes.translate` arguments: lowercase, whitespace to a space, symbols deleted."""
    classes = _bmp_classes()[:128]
    table = bytearray(range(256))
    for c in range(128):
        if classes[c] == _SPACE:
            table[c] = 32
        elif classes[c] == _KEEP:
            table[c] = ord(chr(c).lower())
    return bytes(table), bytes(c for c in range(128) if classes[c] == _DROP)


def _ascii_codepoints(texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`batch_codepoints_for_shingles` of ASCII texts: lowering and symbol removal in C."""
    table, delete = _ascii_translation()
    data = SEPARATOR_CHAR.join(texts).encode("latin-1").translate(table, delete)
    return _collapse_spaces(np.frombuffer(data, dtype=np.uint8))


def _collapse_spaces(cps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Texts joined by `SEPARATOR`, holding word characters and spaces, with each run of
    spaces collapsed to one and the spaces at a text's ends stripped."""
    # A space survives only right after a word character, and not right before
    # the end of its text.
    is_space = cps == 32
    keep = ~is_space
    keep[1:] |= ~is_space[:-1] & (cps[:-1] != SEPARATOR)
    cps = cps[keep]
    keep = np.ones(len(cps), dtype=bool)
    keep[:-1] = (cps[:-1] != 32) | (cps[1:] != SEPARATOR)
    if len(cps):
        keep[-1] = cps[-1] != 32
    cps = cps[keep]
    seps = np.flatnonzero(cps == SEPARATOR)
    starts = np.concatenate([[0], seps + 1])
    ends = np.concatenate([seps, [len(cps)]])
    return cps, starts, ends
