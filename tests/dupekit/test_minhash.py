"""The JAX MinHash kernel against datasketch 2.0 (default affine32 scheme)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from datasketch import MinHash, MinHashLSH

from marin_dagster.dupekit.hashing import shingle_hash
from marin_dagster.dupekit.minhash import (
    EMPTY_VALUE,
    MAX_WIDTH,
    MIN_BUCKET,
    MinHasher,
    estimated_jaccard,
    permutations,
)
from marin_dagster.dupekit.shingles import ShingleConfig, shingle_hashes, shingle_strings


@pytest.fixture(scope="module")
def hasher() -> MinHasher:
    return MinHasher(num_perm=128, seed=42)


def _identity(x: int) -> int:
    return int(x)


def _datasketch_from_hashes(hashes: np.ndarray, num_perm: int, seed: int) -> np.ndarray:
    m = MinHash(num_perm=num_perm, seed=seed, hashfunc=_identity)
    m.update_batch(hashes.tolist())
    return m.hashvalues


@pytest.mark.parametrize("num_perm,seed", [(128, 1), (64, 42), (7, 123456789)])
def test_permutations_equal_datasketch(num_perm: int, seed: int):
    a, b = permutations(num_perm, seed)
    ref = MinHash(num_perm=num_perm, seed=seed).permutations
    assert a.dtype == np.uint32 and b.dtype == np.uint32
    np.testing.assert_array_equal(a, ref[0])
    np.testing.assert_array_equal(b, ref[1])


def test_random_hash_sets_bit_identical(hasher: MinHasher):
    rng = np.random.default_rng(0)
    # Lengths on both sides of bucket boundaries, a long document, repeats.
    lengths = [1, 2, MIN_BUCKET - 1, MIN_BUCKET, MIN_BUCKET + 1, 127, 128, 129, 1000, 5000]
    # Longer than one row: signed in pieces; one piece plus one hash, and whole pieces.
    lengths += [MAX_WIDTH, MAX_WIDTH + 1, 3 * MAX_WIDTH, 3 * MAX_WIDTH + 777]
    arrays = [rng.integers(0, 2**32, n, dtype=np.uint32) for n in lengths]
    arrays.append(np.array([0, 0xFFFFFFFF, 0, 7], dtype=np.uint32))
    arrays.append(np.repeat(rng.integers(0, 2**32, 10, dtype=np.uint32), 50))
    arrays.extend(rng.integers(0, 2**32, (300, 40), dtype=np.uint32))  # many small, several batches
    sigs = hasher.signatures(arrays)
    assert sigs.shape == (len(arrays), 128) and sigs.dtype == np.uint32
    for hashes, sig in zip(arrays, sigs, strict=True):
        np.testing.assert_array_equal(sig, _datasketch_from_hashes(hashes, 128, 42))


def test_empty_document_gives_the_empty_sketch(hasher: MinHasher):
    sigs = hasher.signatures([np.zeros(0, np.uint32), np.array([5], np.uint32)])
    assert (sigs[0] == EMPTY_VALUE).all()
    np.testing.assert_array_equal(sigs[0], MinHash(num_perm=128, seed=42).hashvalues)
    assert not (sigs[1] == EMPTY_VALUE).all()


@pytest.mark.parametrize("config", [ShingleConfig("char", 5), ShingleConfig("word", 5)])
def test_shakespeare_signatures_bit_identical(hasher: MinHasher, shakespeare_docs, config):
    """Real documents, shingled with the same hash that datasketch is given as `hashfunc`."""
    docs = [d for d in shakespeare_docs if d["source"] == "milton"][:3]
    docs += [d for d in shakespeare_docs if d["source"] == "shakespeare"][:3]
    texts = [d["text"][:30000] for d in docs] + ["Short text.", "ab", ""]
    sigs = hasher.signatures([shingle_hashes(t, config) for t in texts])
    for text, sig in zip(texts, sigs, strict=True):
        ref = MinHash(num_perm=128, seed=42, hashfunc=shingle_hash)
        ref.update_batch(shingle_strings(text, config))
        np.testing.assert_array_equal(sig, ref.hashvalues)


def test_datasketch_objects_and_jaccard(hasher: MinHasher, shakespeare_docs):
    text = shakespeare_docs[0]["text"][:8000]
    edited = text[:6000] + text[6000:].upper().replace("E", "3")
    config = ShingleConfig()
    sigs = hasher.signatures([shingle_hashes(text, config), shingle_hashes(edited, config)])
    m1, m2 = hasher.to_datasketch(sigs[0]), hasher.to_datasketch(sigs[1])
    ref = MinHash(num_perm=128, seed=42, hashfunc=shingle_hash)
    ref.update_batch(shingle_strings(text, config))
    assert m1 == ref
    assert estimated_jaccard(sigs[0], sigs[1]) == m1.jaccard(m2)
    assert 0.0 < m1.jaccard(m2) < 1.0
    lsh = MinHashLSH(threshold=0.5, num_perm=128)
    lsh.insert("a", m1)
    assert lsh.query(ref) == ["a"]


_SIGN_ONE = (
    "import numpy as np; from marin_dagster.dupekit.minhash import MinHasher; "
    "MinHasher(16, 1).signatures([np.arange(100, dtype=np.uint32)])"
)


def test_compiled_kernels_are_kept_on_disk(tmp_path):
    """A fresh process (as every dedup step's workers are) fills the persistent cache
    under XDG_CACHE_HOME; a folder the user names in JAX_COMPILATION_CACHE_DIR wins."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    subprocess.run([sys.executable, "-c", _SIGN_ONE], env=env, check=True)
    assert os.listdir(tmp_path / "xdg/marin-dagster/jax-lru")
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "mine")
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg2")
    subprocess.run([sys.executable, "-c", _SIGN_ONE], env=env, check=True)
    assert not (tmp_path / "xdg2").exists()
