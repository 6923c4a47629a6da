"""Signatures of raw texts, on the host or on the accelerator: one choice per process.

- host: shingle hashes with numpy (shingles.py), then the MinHash kernel
  (`MinHasher`): the fastest path on CPUs.
- device: `PackedSigner`, hashing and MinHash in one program on JAX's device:
  the path for a GPU or TPU, where the host path's numpy hashing would cap it.

Both give the same signatures bit for bit (tests hold them equal), so the
choice is an execution detail, not part of a step's version. `auto` (the
default) takes the device path when JAX's default backend is not the CPU;
`DUPEKIT_SIGNATURES=host|device` overrides it (benchmarks, tests).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol

import jax
import numpy as np

from marin_dagster.dupekit.minhash import MinHasher
from marin_dagster.dupekit.packed import PackedSigner
from marin_dagster.dupekit.shingles import ShingleConfig, batch_shingle_hashes

SIGNATURES_ENV = "DUPEKIT_SIGNATURES"
PATHS = ("auto", "host", "device")


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


def signature_path() -> str:
    """ "host" or "device": `DUPEKIT_SIGNATURES`, or by JAX's default backend."""
    choice = os.environ.get(SIGNATURES_ENV, "auto").strip().lower() or "auto"
    if choice not in PATHS:
        raise ValueError(
            f"{SIGNATURES_ENV}={os.environ[SIGNATURES_ENV]!r}: expected one of {', '.join(PATHS)}"
        )
    if choice == "auto":
        return "host" if jax.default_backend() == "cpu" else "device"
    return choice


_SIGNERS: dict[tuple, Signer] = {}


def signer_for(shingles: ShingleConfig, num_perm: int, seed: int) -> Signer:
    """One signer per worker process and setting, so jit compilations are reused across tasks."""
    path = signature_path()
    key = (path, shingles, num_perm, seed)
    if key not in _SIGNERS:
        cls = PackedSigner if path == "device" else HostSigner
        _SIGNERS[key] = cls(shingles, num_perm, seed)
    return _SIGNERS[key]
