"""Hash functions of dupekit: the 32-bit shingle hash and the 128-bit text hash.

Shingle hash: the top 32 bits of a polynomial hash modulo 2^64 of the
shingle's code points,

    P(c_0 ... c_{L-1}) = sum_q (c_q + 1) * B^(L - q)  mod 2^64,   shingle_hash = P >> 32,

with B odd (the 64-bit golden ratio). Adding 1 keeps U+0000 from vanishing;
the extra factor of B carries a difference in the last code point into the
top bits. The MinHash kernel mixes the value with MurmurHash3's finalizer
before its permutations (minhash.py), so this is a digest, not a mixer.

Why polynomial: a substring's value comes from two prefix sums,

    S[p] = sum_{q < p} (c_q + 1) * B^(-q),   P(c[s:e]) = B^e * (S[e] - S[s]),

(B is invertible modulo 2^64), so every shingle of a batch costs a constant
number of vectorized operations whatever its length. A word 5-gram is about
30 code points: hashing it block by block (MurmurHash3, before) cost five
times a char 5-gram and capped word signatures at half their present speed.
It is stable across processes, Python versions and machines (unlike
`hash()`). `shingle_hash` is the scalar definition and the `hashfunc` to give
datasketch; `PrefixHashes` computes the same values for many shingles at once.

Text hash (exact dedup): the 128-bit BLAKE2b digest of the normalized text's
UTF-8 bytes, as 32 hex characters.

Both hash a text with its lone surrogates replaced by U+FFFD (text.py), the
only code points of a Python string that UTF encoders refuse.
"""

from __future__ import annotations

import hashlib

import numpy as np

from marin_dagster.dupekit.text import replace_unencodable

SHINGLE_HASH = "poly64(codepoint+1, B=0x9E3779B97F4A7C15)>>32"
_BASE = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def shingle_hash(shingle: str) -> int:
    """The 32-bit hash of one shingle; pass it as datasketch's `hashfunc`."""
    h = 0
    for ch in replace_unencodable(shingle):
        h = ((h + ord(ch) + 1) * _BASE) & _MASK64
    return h >> 32


class _Powers:
    """B^p and B^-p modulo 2^64 for p < len, grown by doubling as batches need."""

    def __init__(self) -> None:
        self.up = np.ones(1, np.uint64)
        self.down = np.ones(1, np.uint64)

    def ensure(self, size: int) -> None:
        if size <= len(self.up):
            return
        size = 1 << (size - 1).bit_length()
        self.up = self._table(_BASE, size)
        self.down = self._table(pow(_BASE, -1, 1 << 64), size)

    @staticmethod
    def _table(base: int, size: int) -> np.ndarray:
        steps = np.full(size, base, np.uint64)
        steps[0] = 1
        return np.multiply.accumulate(steps)  # unsigned: wraps modulo 2^64


_POWERS = _Powers()


def power_tables(size: int) -> tuple[np.ndarray, np.ndarray]:
    """`(B^p, B^-p)` modulo 2^64 as uint64 arrays, for every p < size (and maybe more)."""
    _POWERS.ensure(size)
    return _POWERS.up, _POWERS.down


class PrefixHashes:
    """`shingle_hash` of any segment of one code point array, each in O(1)."""

    def __init__(self, codepoints: np.ndarray):
        size = len(codepoints)
        _POWERS.ensure(size + 1)
        down = _POWERS.down[:size]
        # In place, in one array: each temporary of a 2 MB batch costs as much as a pass.
        self._sums = np.empty(size + 1, np.uint64)
        self._sums[0] = 0
        weighted = self._sums[1:]
        np.multiply(codepoints, down, out=weighted)
        np.add(weighted, down, out=weighted)  # the + 1 of each code point
        np.cumsum(weighted, out=weighted)

    def runs(self, starts: np.ndarray, ends: np.ndarray, n: int) -> np.ndarray:
        """The hash of each run of `n` consecutive segments, from `starts[i]` to
        `ends[i + n - 1]` (word shingles: the segments are words; n = 1: each segment);
        `len(starts) - n + 1` values. The gathers happen once per segment, not per run."""
        count = len(starts) - n + 1
        if count <= 0:
            return np.zeros(0, np.uint32)
        at_start = self._sums[starts[:count]]
        last = ends[n - 1 :]
        value = _POWERS.up[last] * (self._sums[last] - at_start)
        return (value >> np.uint64(32)).astype(np.uint32)

    def windows(self, n: int) -> np.ndarray:
        """The hash of every run of `n` consecutive code points (none if fewer)."""
        count = len(self._sums) - n
        if count <= 0:
            return np.zeros(0, np.uint32)
        value = _POWERS.up[n : n + count] * (self._sums[n:] - self._sums[:count])
        return (value >> np.uint64(32)).astype(np.uint32)


def text_hash128(text: str) -> str:
    """128-bit BLAKE2b of the text's UTF-8 bytes, 32 hex characters (lone surrogates as U+FFFD)."""
    return hashlib.blake2b(replace_unencodable(text).encode("utf-8"), digest_size=16).hexdigest()
