"""Hash functions of dupekit: the 32-bit shingle hash and the 128-bit text hash.

Shingle hash: MurmurHash3_x86_32 (seed 0) of the shingle's UTF-32-LE bytes,
that is, one 4-byte block per Unicode code point. It is stable across
processes, Python versions and machines (unlike `hash()`), and because every
block is a whole code point it vectorizes over a document's code point array
without a per-shingle Python call. `shingle_hash` is the scalar definition and
the `hashfunc` to give datasketch; `murmur3_windows` and `murmur3_segments`
compute the same values for every shingle of a document at once.

Text hash (exact dedup): the 128-bit BLAKE2b digest of the normalized text's
UTF-8 bytes, as 32 hex characters.

Both hash a text with its lone surrogates replaced by U+FFFD (text.py), the
only code points of a Python string that UTF encoders refuse.
"""

from __future__ import annotations

import hashlib

import numpy as np

from marin_dagster.dupekit.text import replace_unencodable

_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_MASK = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _fmix32_int(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    return h ^ (h >> 16)


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3_x86_32 of `data` (the reference, byte-exact, pure Python)."""
    h = seed & _MASK
    nblocks = len(data) // 4
    for i in range(nblocks):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * _C1) & _MASK
        k = _rotl32(k, 15)
        k = (k * _C2) & _MASK
        h ^= k
        h = _rotl32(h, 13)
        h = (h * 5 + 0xE6546B64) & _MASK
    tail = data[4 * nblocks :]
    k = 0
    if len(tail) >= 3:
        k ^= tail[2] << 16
    if len(tail) >= 2:
        k ^= tail[1] << 8
    if len(tail) >= 1:
        k ^= tail[0]
        k = (k * _C1) & _MASK
        k = _rotl32(k, 15)
        k = (k * _C2) & _MASK
        h ^= k
    h ^= len(data)
    return _fmix32_int(h)


def shingle_hash(shingle: str) -> int:
    """The 32-bit hash of one shingle; pass it as datasketch's `hashfunc`."""
    return murmur3_32(replace_unencodable(shingle).encode("utf-32-le"))


def _np_rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def fmix32(h: np.ndarray) -> np.ndarray:
    """The MurmurHash3 32-bit finalizer, element-wise on a uint32 array."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def _mix_block(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    k = k * np.uint32(_C1)
    k = _np_rotl(k, 15)
    k = k * np.uint32(_C2)
    h = h ^ k
    h = _np_rotl(h, 13)
    return h * np.uint32(5) + np.uint32(0xE6546B64)


def murmur3_windows(codepoints: np.ndarray, n: int) -> np.ndarray:
    """`shingle_hash` of every window of `n` consecutive code points.

    `codepoints` is a uint32 array; the result has `len(codepoints) - n + 1`
    entries (none when the array is shorter than `n`).
    """
    count = len(codepoints) - n + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint32)
    cps = codepoints.astype(np.uint32, copy=False)
    h = np.zeros(count, dtype=np.uint32)
    for j in range(n):
        h = _mix_block(h, cps[j : j + count])
    h ^= np.uint32((4 * n) & _MASK)
    return fmix32(h)


def murmur3_segments(codepoints: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """`shingle_hash` of each segment `codepoints[starts[i]: starts[i] + lengths[i]]`.

    Segments are processed longest first so that, at block position j, the
    segments still running are a prefix of the order: one vectorized step per
    position of the longest segment, total work the sum of the lengths.
    """
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(starts) == 0:
        return np.zeros(0, dtype=np.uint32)
    cps = codepoints.astype(np.uint32, copy=False)
    order = np.argsort(-lengths, kind="stable")
    s_sorted = starts[order]
    l_sorted = lengths[order]
    # running[j] = how many segments are longer than j
    max_len = int(l_sorted[0])
    running = np.searchsorted(-l_sorted, -np.arange(max_len), side="left")
    h = np.zeros(len(starts), dtype=np.uint32)
    for j in range(max_len):
        m = int(running[j])
        h[:m] = _mix_block(h[:m], cps[s_sorted[:m] + j])
    h ^= (4 * l_sorted).astype(np.uint32)
    out = np.empty_like(h)
    out[order] = fmix32(h)
    return out


def text_hash128(text: str) -> str:
    """128-bit BLAKE2b of the text's UTF-8 bytes, 32 hex characters (lone surrogates as U+FFFD)."""
    return hashlib.blake2b(replace_unencodable(text).encode("utf-8"), digest_size=16).hexdigest()
