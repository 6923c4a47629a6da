"""Signatures of raw texts on the host or on the device (device.py chooses).

- host: shingle hashes with numpy (shingles.py), then the MinHash kernel
  (`MinHasher`): the fastest path on CPUs.
- device: `PackedSigner`, hashing and MinHash in one program on JAX's device:
  the path for a GPU or TPU, where the host path's numpy hashing would cap it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from marin_dagster.dupekit.device import compute_path
from marin_dagster.dupekit.minhash import MinHasher
from marin_dagster.dupekit.packed import PackedSigner
from marin_dagster.dupekit.shingles import ShingleConfig, batch_shingle_hashes

Result = tuple[np.ndarray, np.ndarray]


class Signer(Protocol):
    def submit(self, texts: list[str]) -> Callable[[], Result]:
        """Start signing `texts`; the returned call gives `(shingle counts
        int64[len(texts)], signatures uint32[len(texts), num_perm])`, a text with no
        shingle having the empty sketch."""
        ...

    def signatures(self, texts: list[str]) -> Result: ...


class HostSigner:
    def __init__(self, shingles: ShingleConfig, num_perm: int = 128, seed: int = 1) -> None:
        self.shingles = shingles
        self.hasher = MinHasher(num_perm, seed)

    def signatures(self, texts: list[str]) -> Result:
        hashes = batch_shingle_hashes(texts, self.shingles)
        counts = np.fromiter((len(h) for h in hashes), np.int64, count=len(hashes))
        return counts, self.hasher.signatures(hashes)

    def submit(self, texts: list[str]) -> Callable[[], Result]:
        result = self.signatures(texts)  # the host has nothing to overlap with
        return lambda: result


_SIGNERS: dict[tuple, Signer] = {}


def signer_for(shingles: ShingleConfig, num_perm: int, seed: int) -> Signer:
    """One signer per worker process and setting, so jit compilations are reused across tasks."""
    path = compute_path()
    key = (path, shingles, num_perm, seed)
    if key not in _SIGNERS:
        cls = PackedSigner if path == "device" else HostSigner
        _SIGNERS[key] = cls(shingles, num_perm, seed)
    return _SIGNERS[key]
