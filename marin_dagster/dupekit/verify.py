"""Verification's array work, for many pairs at once, on the host or the device.

Verification asks two questions of candidate pairs (fuzzy.py):

- `agreements`: how many of the `num_perm` signature slots each pair shares
  (the estimated Jaccard similarity times `num_perm`), for the pairs of
  documents that share an LSH bucket;
- `intersections`: the exact size of each doubtful pair's shingle hash set
  intersection (sorted, duplicate-free uint32 sets), from which its exact
  Jaccard similarity follows.

On the device, a whole batch's intersections are one program: every set's
hashes are keyed `pair index << 32 | hash`, so all left sets end to end form
one sorted array, as do all right sets; a binary search of each left key among
the right keys finds its match, and a count of the hits per pair is the
intersection (64-bit keys, under `jax.enable_x64` for this program only, like
packed.py). On the host, numpy's sorted intersection pair by pair is faster.

Device shapes are padded to powers of two (at least `MIN_PADDED`), so a run
compiles a few dozen programs, each kept in the persistent compilation cache.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

from marin_dagster.dupekit.device import compute_path
from marin_dagster.dupekit.minhash import use_compilation_cache

Block = tuple[np.ndarray, np.ndarray]
MIN_PADDED = 1024
_LEFT_PAD = np.uint64(2**64 - 2)  # sorts after every real key, matches no right key
_RIGHT_PAD = np.uint64(2**64 - 1)


class Verifier(Protocol):
    def agreements(
        self, sigs: np.ndarray, blocks: Iterable[Block]
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """`(a, b, equal slots of rows a[i] and b[i] of sigs)` for each block of pairs."""
        ...

    def intersections(
        self, lefts: Sequence[np.ndarray], rights: Sequence[np.ndarray]
    ) -> np.ndarray:
        """`|lefts[i] ∩ rights[i]|` (int64) of sorted, duplicate-free uint32 hash sets."""
        ...


def keyed(sets: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """`(pair index << 32 | hash, pair index)` of every hash: sorted when each set is."""
    sizes = np.fromiter((len(s) for s in sets), np.int64, count=len(sets))
    owner = np.repeat(np.arange(len(sets), dtype=np.int64), sizes)
    if not len(owner):
        return np.zeros(0, np.uint64), owner
    hashes = np.concatenate([np.asarray(s, np.uint32) for s in sets]).astype(np.uint64)
    return (owner.astype(np.uint64) << np.uint64(32)) | hashes, owner


class HostVerifier:
    def agreements(
        self, sigs: np.ndarray, blocks: Iterable[Block]
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        for a, b in blocks:
            yield a, b, np.count_nonzero(sigs[a] == sigs[b], axis=1)

    def intersections(
        self, lefts: Sequence[np.ndarray], rights: Sequence[np.ndarray]
    ) -> np.ndarray:
        # Pair by pair: two ~2k-hash sets sort inside the L1 cache, where the batch's
        # binary search (the device's method) misses the cache at every step, 5x slower.
        return np.fromiter(
            (
                len(np.intersect1d(a, b, assume_unique=True))
                for a, b in zip(lefts, rights, strict=True)
            ),
            np.int64,
            count=len(lefts),
        )


def padded(n: int) -> int:
    return max(MIN_PADDED, 1 << max(0, n - 1).bit_length())


@jax.jit
def _agree(sigs: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.sum(sigs[a] == sigs[b], axis=1, dtype=jnp.int32)


@functools.partial(jax.jit, static_argnames=("segments",))
def _intersect(left: jax.Array, owner: jax.Array, right: jax.Array, *, segments: int) -> jax.Array:
    at = jnp.minimum(jnp.searchsorted(right, left), right.shape[0] - 1)
    hit = (right[at] == left).astype(jnp.int32)
    return jax.ops.segment_sum(hit, owner, num_segments=segments)


class DeviceVerifier:
    def __init__(self) -> None:
        use_compilation_cache()

    def agreements(
        self, sigs: np.ndarray, blocks: Iterable[Block]
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        rows = np.zeros((padded(len(sigs)), sigs.shape[1]), np.uint32)
        rows[: len(sigs)] = sigs
        on_device = jnp.asarray(rows)
        # Every block is dispatched before the first is read back: the device runs
        # them back to back while the host pads the next.
        dispatched = []
        for a, b in blocks:
            size = padded(len(a))
            a_pad, b_pad = np.zeros(size, np.int32), np.zeros(size, np.int32)
            a_pad[: len(a)], b_pad[: len(b)] = a, b
            dispatched.append((a, b, _agree(on_device, a_pad, b_pad)))
        for a, b, agree in dispatched:
            yield a, b, np.asarray(agree)[: len(a)].astype(np.int64)

    def intersections(
        self, lefts: Sequence[np.ndarray], rights: Sequence[np.ndarray]
    ) -> np.ndarray:
        left, owner = keyed(lefts)
        right, _ = keyed(rights)
        if not len(left) or not len(right):
            return np.zeros(len(lefts), np.int64)
        left_pad = np.full(padded(len(left)), _LEFT_PAD, np.uint64)
        owner_pad = np.full(len(left_pad), len(lefts), np.int32)  # a segment dropped below
        right_pad = np.full(padded(len(right)), _RIGHT_PAD, np.uint64)
        left_pad[: len(left)], owner_pad[: len(owner)], right_pad[: len(right)] = left, owner, right
        with jax.enable_x64(True):  # 64-bit keys would be cut to 32 bits
            counts = _intersect(left_pad, owner_pad, right_pad, segments=padded(len(lefts) + 1))
        return np.asarray(counts)[: len(lefts)].astype(np.int64)


_VERIFIERS: dict[str, Verifier] = {}


def verifier() -> Verifier:
    """The host or device verifier (device.py's choice), one per worker process."""
    path = compute_path()
    if path not in _VERIFIERS:
        _VERIFIERS[path] = DeviceVerifier() if path == "device" else HostVerifier()
    return _VERIFIERS[path]
