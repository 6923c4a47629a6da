"""The MinHash kernel in JAX, bit-identical to datasketch 2.0's default scheme.

datasketch 2.0 (`MinHash(num_perm, seed, hashfunc=f)`, scheme "affine32")
computes, for every shingle s and permutation k,

    h = fmix32(f(s))                     # MurmurHash3 32-bit finalizer
    phv_k = a_k * h + b_k  (mod 2^32)    # uint32 arithmetic, wrap-around

and keeps min over s of phv_k, starting from 2^32 - 1 (the empty sketch).
`a` (odd) and `b` come from `np.random.RandomState(seed)`:
`a = randint(0, 2^31, num_perm, uint32) * 2 + 1`, then
`b = randint(0, 2^32, num_perm, uint32)`. `permutations` reproduces that,
and the kernel computes the same values on whatever device JAX has (CPU by
default, GPU or TPU when present).

Batching: documents are grouped by their number of shingle hashes rounded up
to a power of two (at least `MIN_BUCKET`); a row is padded by repeating its
own first hash, which cannot change a minimum, so no mask is needed. A
document of more than `MAX_WIDTH` hashes is signed as pieces of `MAX_WIDTH`
whose signatures are combined by a slot-wise min (a min over a union is the
min of the mins): a 130k-shingle play pads at most its last piece, not up to
twice its length, and no width beyond `MAX_WIDTH` is ever compiled. A batch
is always `BATCH_HASHES // width` rows (at least one), so each width compiles
once per process: a corpus compiles a dozen shapes at most.
Inside the kernel the shingle axis is scanned in chunks of `SCAN_CHUNK`
shingles (measured on this CPU: one fused min over the whole axis is 10-20x
slower; 32 shingles per step was the fastest or within 20% of it for every
batch shape from 1 x 131072 to 256 x 512 and 64 to 256 permutations, 2-4x
faster than sizing the step to a fixed number of products, the rule before).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

logger = logging.getLogger(__name__)

EMPTY_VALUE = np.uint32(0xFFFFFFFF)
MIN_BUCKET = 64
BATCH_HASHES = 1 << 17
SCAN_CHUNK = 32
MAX_WIDTH = 1 << 15
CACHE_MAX_BYTES = 1 << 30  # the compiled-kernel cache on disk; a kernel takes ~12 KB of it


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`(a, b)` uint32 arrays, equal to datasketch's `MinHash(...).permutations`."""
    if num_perm < 1:
        raise ValueError(f"num_perm must be positive, got {num_perm}")
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    return a, b


def use_compilation_cache() -> None:
    """Keep compiled kernels on disk (JAX's persistent cache), unless the user chose.

    Every dedup step is a fresh process whose workers would otherwise compile each
    kernel shape again: 0.5 s of a 2 s run over 91 plays, measured. The kernels
    compile in well under JAX's default 1 s threshold, so it is lowered to 0.
    The folder is capped at `CACHE_MAX_BYTES`, least recently used entries going
    first (JAX's own eviction), so months of runs do not fill the disk.
    `JAX_COMPILATION_CACHE_DIR` (or `jax_compilation_cache_dir`) set by the user wins;
    an unwritable cache folder leaves the cache off.
    """
    if jax.config.jax_compilation_cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    # Not the uncapped cache's old "jax" folder: its entries have no access-time files,
    # which JAX's eviction reads, so every write into it would fail.
    folder = os.path.join(root, "marin-dagster", "jax-lru")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return
    if not os.access(folder, os.W_OK):
        return
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)


def _fmix32(h: jax.Array) -> jax.Array:
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


@functools.partial(jax.jit, static_argnames=("chunk",))
def _signature_kernel(hashes: jax.Array, a: jax.Array, b: jax.Array, chunk: int) -> jax.Array:
    h = _fmix32(hashes)
    batch, width = h.shape
    chunks = h.reshape(batch, width // chunk, chunk).transpose(1, 0, 2)

    def step(acc: jax.Array, x: jax.Array) -> tuple[jax.Array, None]:
        return jnp.minimum(acc, jnp.min(x[:, :, None] * a + b, axis=1)), None

    init = jnp.full((batch, a.shape[0]), EMPTY_VALUE, dtype=jnp.uint32)
    out, _ = jax.lax.scan(step, init, chunks)
    return out


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _pieces(hash_arrays: Sequence[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
    """Arrays longer than `MAX_WIDTH` cut into pieces of `MAX_WIDTH` (the last one
    shorter), and the index of each piece's array."""
    if all(len(h) <= MAX_WIDTH for h in hash_arrays):
        return list(hash_arrays), np.arange(len(hash_arrays))
    pieces, owners = [], []
    for i, hashes in enumerate(hash_arrays):
        for start in range(0, max(1, len(hashes)), MAX_WIDTH):
            pieces.append(hashes[start : start + MAX_WIDTH])
            owners.append(i)
    return pieces, np.array(owners)


class MinHasher:
    """Signatures for many documents at once; equal to datasketch's for the same hashes."""

    def __init__(self, num_perm: int = 128, seed: int = 1) -> None:
        use_compilation_cache()
        self.num_perm = num_perm
        self.seed = seed
        a, b = permutations(num_perm, seed)
        self.a_host, self.b_host = a, b
        self._a = jnp.asarray(a)
        self._b = jnp.asarray(b)

    def signatures(self, hash_arrays: Sequence[np.ndarray]) -> np.ndarray:
        """`[len(hash_arrays), num_perm]` uint32; an empty array gives the empty sketch."""
        pieces, owners = _pieces(hash_arrays)
        signed = self._rows(pieces)
        if len(pieces) == len(hash_arrays):
            return signed
        # A long document's signature is the slot-wise min of its pieces' signatures.
        out = np.full((len(hash_arrays), self.num_perm), EMPTY_VALUE, dtype=np.uint32)
        np.minimum.at(out, owners, signed)
        return out

    def _rows(self, hash_arrays: Sequence[np.ndarray]) -> np.ndarray:
        out = np.full((len(hash_arrays), self.num_perm), EMPTY_VALUE, dtype=np.uint32)
        buckets: dict[int, list[int]] = {}
        for i, hashes in enumerate(hash_arrays):
            if len(hashes):
                buckets.setdefault(max(MIN_BUCKET, _next_pow2(len(hashes))), []).append(i)
        for width, members in sorted(buckets.items()):
            per_batch = max(1, BATCH_HASHES // width)
            for start in range(0, len(members), per_batch):
                rows = members[start : start + per_batch]
                # One batch size per width, so a width compiles once; padding a
                # short last batch costs at most BATCH_HASHES hashes of work.
                batch = per_batch
                block = np.empty((batch, width), dtype=np.uint32)
                for r, i in enumerate(rows):
                    hashes = np.asarray(hash_arrays[i], dtype=np.uint32)
                    block[r, : len(hashes)] = hashes
                    block[r, len(hashes) :] = hashes[0]
                # Rows past the documents repeat the first one; dropped below.
                block[len(rows) :] = block[0]
                result = _signature_kernel(
                    jnp.asarray(block),
                    self._a,
                    self._b,
                    chunk=min(SCAN_CHUNK, width),
                )
                out[rows] = np.asarray(result)[: len(rows)]
        return out

    def to_datasketch(self, signature: np.ndarray):  # -> datasketch.MinHash
        """A datasketch `MinHash` holding `signature` (for `MinHashLSH` and `jaccard`)."""
        from datasketch import MinHash

        return MinHash(
            num_perm=self.num_perm,
            seed=self.seed,
            hashvalues=signature,
            permutations=(self.a_host, self.b_host),
            scheme="affine32",
        )


def estimated_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
    """Fraction of equal signature slots: datasketch's `MinHash.jaccard`."""
    return float(np.count_nonzero(sig_a == sig_b)) / float(len(sig_a))
