"""Signatures from raw text with the shingle hashing on the device: the accelerator path.

The host path (shingles.py, then `MinHasher`) hashes shingles with numpy on
one core and hands the kernel pre-hashed shingles; on a GPU machine that host
work caps the pipeline whatever the kernel does. Here the host only
normalizes (`batch_codepoints_for_shingles`, mostly `bytes.translate`) and
packs; everything after runs in one jitted program per buffer:

    code points -> prefix sums -> shingle hashes -> fmix32, a*h+b -> min

Packing: the documents of a chunk are grouped by their normalized length
rounded up to a quarter-octave width W (1024, 1280, 1536, 1792, 2048, ...: at
most 25% padding, a few dozen shapes in all); a buffer is one flat array of
`BUFFER_CHARS` code points (uint8 for ASCII text) with each document's offset
and length, `BUFFER_CHARS // W` documents. The device gathers it into
`[documents, W]` rows, so every document is a row and no reduction crosses
documents: no separators, no segment ops, and the MinHash is one fused
min over the row's shingles (what XLA does well on a GPU; the host path's
cache-sized chunked scan is for CPUs).

The values are the host path's exactly: the same polynomial hash (hashing.py:
`P(c[s:e]) = B^e (S[e] - S[s])` holds for prefix sums taken from any origin,
so a row's own sums give the flat batch's values), computed in 64-bit
integers (`jax.enable_x64` around this program only; the trainer's dtypes
are untouched), and the same kernel arithmetic as minhash.py.

Overlap: JAX dispatches a buffer's program and returns at once, so the host
normalizes and packs the next chunk while the device works; `submit` returns
before the results are read back, so a caller (the signature stage) reads
and submits its next batch meanwhile.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from marin_dagster.dupekit.hashing import power_tables
from marin_dagster.dupekit.minhash import (
    EMPTY_VALUE,
    _fmix32,
    permutations,
    use_compilation_cache,
)
from marin_dagster.dupekit.shingles import ShingleConfig, cache_sized_chunks
from marin_dagster.dupekit.text import batch_codepoints_for_shingles

BUFFER_CHARS = 1 << 20
MIN_WIDTH = 64
MIN_WORDS = 16
# A chunk is normalized on the host in one pass, then packed into buffers by width.
CHUNK_CHARS = 1 << 22


def bucket_width(n: int, floor: int) -> int:
    """The smallest `m * 2^k >= n` with m in 4..7 (quarter octaves), at least `floor`."""
    n = max(n, floor)
    if n <= 8:
        return n
    k = (n - 1).bit_length() - 3
    return -(-n // (1 << k)) * (1 << k)


class _DevicePowers:
    """hashing's power tables, copied to the device once per size."""

    def __init__(self) -> None:
        self.size = 0
        self.tables: tuple[jax.Array, jax.Array] | None = None

    def ensure(self, size: int) -> tuple[jax.Array, jax.Array]:
        if size > self.size:
            up, down = power_tables(size)
            self.tables = (jnp.asarray(up), jnp.asarray(down))
            self.size = len(up)
        return self.tables


@functools.partial(jax.jit, static_argnames=("kind", "n", "width", "words"))
def _packed_signatures(
    flat: jax.Array,
    offsets: jax.Array,
    lengths: jax.Array,
    a: jax.Array,
    b: jax.Array,
    up: jax.Array,
    down: jax.Array,
    *,
    kind: str,
    n: int,
    width: int,
    words: int,
) -> tuple[jax.Array, jax.Array]:
    """`(signatures [D, P], shingle counts [D])` of the D packed documents (x64 on)."""
    docs = offsets.shape[0]
    col = jnp.arange(width, dtype=jnp.int32)
    inside = col[None, :] < lengths[:, None]
    at = jnp.minimum(offsets[:, None] + col[None, :], flat.shape[0] - 1)
    cps = jnp.where(inside, flat[at].astype(jnp.uint64), jnp.uint64(0))
    weighted = (cps + jnp.uint64(1)) * down[None, :width]  # wraps modulo 2^64
    sums = jnp.concatenate(
        [jnp.zeros((docs, 1), jnp.uint64), jnp.cumsum(weighted, axis=1, dtype=jnp.uint64)],
        axis=1,
    )  # [D, W + 1]
    if kind == "char":
        count = width - n + 1
        ends = col[:count] + n
        value = up[ends][None, :] * (sums[:, n : n + count] - sums[:, :count])
        valid = ends[None, :] <= lengths[:, None]
    else:
        # A word is a maximal run of non-spaces inside the row; the k-th word's start
        # and end are scattered to column k, the shingle k spans words k .. k + n - 1.
        bound = ~inside | (cps == 32)
        edge = jnp.ones((docs, 1), bool)
        starts_here = ~bound & jnp.concatenate([edge, bound[:, :-1]], axis=1)
        ends_here = ~bound & jnp.concatenate([bound[:, 1:], edge], axis=1)
        slots = words + n  # past the last word: index `width` (an empty segment)
        rows = jnp.arange(docs)[:, None]

        def scatter(flags: jax.Array, values: jax.Array) -> jax.Array:
            k = jnp.where(flags, jnp.cumsum(flags, axis=1) - 1, slots)
            base = jnp.full((docs, slots), width, jnp.int32)
            return base.at[rows, k].set(jnp.broadcast_to(values, k.shape), mode="drop")

        word_starts = scatter(starts_here, col[None, :])[:, :words]
        word_ends = scatter(ends_here, col[None, :] + 1)[:, n - 1 : n - 1 + words]
        value = up[word_ends] * (
            jnp.take_along_axis(sums, word_ends, axis=1)
            - jnp.take_along_axis(sums, word_starts, axis=1)
        )
        shingles = starts_here.sum(axis=1) - n + 1
        valid = jnp.arange(words)[None, :] < shingles[:, None]
    hashes = _fmix32((value >> jnp.uint64(32)).astype(jnp.uint32))
    # Materialized once ([D, shingles], small): fused into the min below, the 64-bit
    # hashing and its gathers would be recomputed for each of the num_perm slots.
    hashes = jax.lax.optimization_barrier(hashes)
    permuted = hashes[:, :, None] * a + b
    sig = jnp.where(valid[:, :, None], permuted, jnp.uint32(EMPTY_VALUE)).min(axis=1)
    return sig, valid.sum(axis=1)


@dataclass(frozen=True)
class Buffer:
    """Packed documents: `rows` (their indices in the caller's list), their code points
    end to end in `flat`, each one's offset and length (padding rows: length 0), the
    row width, and for word shingles the number of word slots per row."""

    rows: np.ndarray
    flat: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    width: int
    words: int


class PackedSigner:
    """Signatures of raw texts, shingle hashing and MinHash on JAX's device.

    Equal to `MinHasher(num_perm, seed).signatures(batch_shingle_hashes(texts, shingles))`
    for the texts that have a shingle, and so to datasketch's.
    """

    def __init__(self, shingles: ShingleConfig, num_perm: int = 128, seed: int = 1) -> None:
        use_compilation_cache()
        self.shingles = shingles
        self.num_perm = num_perm
        a, b = permutations(num_perm, seed)
        self._a, self._b = jnp.asarray(a), jnp.asarray(b)
        self._powers = _DevicePowers()

    def signatures(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """`(shingle counts int64[len(texts)], signatures uint32[len(texts), num_perm])`;
        a text with no shingle has the empty sketch (every value 2^32 - 1)."""
        return self.submit(texts)()

    def submit(self, texts: list[str]) -> Callable[[], tuple[np.ndarray, np.ndarray]]:
        """Normalize, pack and dispatch every buffer of `texts` (JAX returns before the
        device is done); the returned call waits for the results."""
        dispatched = []
        for first, chunk in _numbered_chunks(texts):
            for buffer in self.buffers(chunk):
                dispatched.append((buffer.rows + first, *self.run(buffer)))

        def result() -> tuple[np.ndarray, np.ndarray]:
            counts = np.zeros(len(texts), np.int64)
            sigs = np.full((len(texts), self.num_perm), EMPTY_VALUE, np.uint32)
            for rows, sig, count in dispatched:
                sigs[rows] = np.asarray(sig)[: len(rows)]
                counts[rows] = np.asarray(count)[: len(rows)]
            return counts, sigs

        return result

    def buffers(self, texts: list[str]) -> Iterator[Buffer]:
        """The host's part: `texts` normalized and packed by width."""
        ascii_rows = np.array([i for i, t in enumerate(texts) if t.isascii()], np.int64)
        other_rows = np.array([i for i, t in enumerate(texts) if not t.isascii()], np.int64)
        for rows in (ascii_rows, other_rows):
            if len(rows) == 0:
                continue
            cps, starts, ends = batch_codepoints_for_shingles([texts[i] for i in rows])
            yield from self._pack_by_width(cps, starts, ends, rows)

    def run(self, buffer: Buffer) -> tuple[jax.Array, jax.Array]:
        """The device's part: `(signatures, shingle counts)` of a buffer's documents,
        padding rows included."""
        with jax.enable_x64(True):  # the uint64 power tables would be cut to 32 bits
            up, down = self._powers.ensure(buffer.width + 1)
            return _packed_signatures(
                buffer.flat, buffer.offsets, buffer.lengths, self._a, self._b, up, down,
                kind=self.shingles.kind, n=self.shingles.n, width=buffer.width,
                words=buffer.words,
            )  # fmt: skip

    def _pack_by_width(
        self, cps: np.ndarray, starts: np.ndarray, ends: np.ndarray, rows: np.ndarray
    ) -> Iterator[Buffer]:
        n, kind = self.shingles.n, self.shingles.kind
        lengths = ends - starts
        if kind == "word":
            spaces = np.concatenate([[0], np.cumsum(cps == 32)])
            word_counts = np.where(lengths > 0, spaces[ends] - spaces[starts] + 1, 0)
        widths = np.array([bucket_width(int(x), max(MIN_WIDTH, n)) for x in lengths])
        for width in np.unique(widths).tolist():
            members = np.flatnonzero(widths == width)
            per_buffer = max(1, BUFFER_CHARS // width)
            for lo in range(0, len(members), per_buffer):
                group = members[lo : lo + per_buffer]
                words = 0
                if kind == "word":
                    words = bucket_width(int(word_counts[group].max()), MIN_WORDS)
                flat, offsets, lens = _pack(cps, starts[group], lengths[group], per_buffer, width)
                yield Buffer(rows[group], flat, offsets, lens, width, words)


def _numbered_chunks(texts: list[str]) -> Iterator[tuple[int, list[str]]]:
    first = 0
    for chunk in cache_sized_chunks(texts, CHUNK_CHARS):
        yield first, chunk
        first += len(chunk)


def _pack(
    cps: np.ndarray, starts: np.ndarray, lengths: np.ndarray, docs: int, width: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The documents' code points end to end in a `docs * width` buffer, with their
    offsets and lengths (padded to `docs` documents of length 0)."""
    flat = np.zeros(docs * width, cps.dtype)
    offsets = np.zeros(docs, np.int32)
    lens = np.zeros(docs, np.int32)
    total = int(lengths.sum())
    offsets[1 : len(lengths)] = np.cumsum(lengths)[:-1]
    lens[: len(lengths)] = lengths
    # Position i of the buffer reads cps[i - offset of its document + start of it].
    shift = np.repeat(starts - offsets[: len(lengths)], lengths)
    flat[:total] = cps[np.arange(total) + shift]
    return flat, offsets, lens
