"""LSH parameters, band keys and saved signature sets queried through datasketch."""

from __future__ import annotations

import numpy as np
import pytest
from datasketch import MinHash, MinHashLSH
from datasketch.lsh import _optimal_param

from marin_dagster.dupekit.hashing import shingle_hash
from marin_dagster.dupekit.lsh import (
    LSHParams,
    band_hashes,
    load_minhash_lsh,
    optimal_param,
    read_signatures,
    write_signatures,
)
from marin_dagster.dupekit.minhash import MinHasher
from marin_dagster.dupekit.shingles import ShingleConfig, shingle_hashes, shingle_strings


@pytest.mark.parametrize(
    "threshold,num_perm,weights",
    [
        (0.5, 128, (0.5, 0.5)),
        (0.8, 128, (0.5, 0.5)),
        (0.8, 128, (0.15, 0.85)),
        (0.9, 64, (0.5, 0.5)),
        (0.7, 256, (0.3, 0.7)),
    ],
)
def test_optimal_param_equals_datasketch(threshold, num_perm, weights):
    assert optimal_param(threshold, num_perm, weights) == _optimal_param(
        threshold, num_perm, *weights
    )
    if weights == (0.5, 0.5):
        lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
        assert optimal_param(threshold, num_perm) == (lsh.b, lsh.r)


def test_lsh_params_resolve():
    assert LSHParams.resolve(128, 0.8, 16, 8) == LSHParams(16, 8)
    assert LSHParams.resolve(128, 0.8) == LSHParams(*optimal_param(0.8, 128))
    with pytest.raises(ValueError, match="both bands and rows"):
        LSHParams.resolve(128, 0.8, bands=4)
    with pytest.raises(ValueError, match="at most num_perm=128"):
        LSHParams.resolve(128, 0.8, 20, 8)


def test_band_hashes_collide_exactly_on_equal_bands():
    rng = np.random.default_rng(1)
    sig = rng.integers(0, 2**32, 128, dtype=np.uint32)
    other = sig.copy()
    other[8:16] += 1  # band 1 differs
    params = LSHParams(16, 8)
    keys = band_hashes(np.stack([sig, other]), params)
    assert keys.shape == (2, 16) and keys.dtype == np.uint64
    assert len(set(keys[0].tolist())) == 16
    assert (keys[0] == keys[1]).tolist() == [i != 1 for i in range(16)]
    # Equal values in different bands are different buckets.
    same = np.tile(sig[:8], 16)[None, :]
    assert len(set(band_hashes(same, params)[0].tolist())) == 16
    # Only the first bands * rows values count.
    tail = sig.copy()
    tail[120:] = 0
    np.testing.assert_array_equal(
        band_hashes(sig[None], LSHParams(15, 8)), band_hashes(tail[None], LSHParams(15, 8))
    )


def test_saved_signatures_load_into_datasketch_lsh(tmp_path, shakespeare_docs):
    """A saved set answers datasketch queries like an index built from datasketch's own MinHash."""
    config = ShingleConfig()
    hasher = MinHasher(num_perm=128, seed=3)
    chunks = [d["text"][i : i + 3000] for d in shakespeare_docs[:4] for i in range(0, 30000, 3000)]
    texts = chunks + [chunks[0][:2500] + " an edit at the end", chunks[5].replace("the", "thee")]
    ids = [f"doc-{i}" for i in range(len(texts))]
    sigs = hasher.signatures([shingle_hashes(t, config) for t in texts])
    half = len(texts) // 2
    meta = {"num_perm": 128, "seed": 3, "shingle_kind": "char", "ngram": 5, "bands": 14, "rows": 9}
    paths = [str(tmp_path / "sigs-0.parquet"), str(tmp_path / "sigs-1.parquet")]
    write_signatures(paths[0], ids[:half], sigs[:half], meta)
    write_signatures(paths[1], ids[half:], sigs[half:], meta)

    got_ids, got_sigs, got_meta = read_signatures(paths)
    assert got_ids == ids and got_meta == meta
    np.testing.assert_array_equal(got_sigs, sigs)

    lsh = load_minhash_lsh(paths)
    assert (lsh.b, lsh.r) == (14, 9)
    reference = MinHashLSH(num_perm=128, params=(14, 9))
    for doc_id, text in zip(ids, texts, strict=True):
        m = MinHash(num_perm=128, seed=3, hashfunc=shingle_hash)
        m.update_batch(shingle_strings(text, config))
        reference.insert(doc_id, m)
    linked = 0
    for text in texts:
        query = MinHash(num_perm=128, seed=3, hashfunc=shingle_hash)
        query.update_batch(shingle_strings(text, config))
        got = sorted(lsh.query(query))
        assert got == sorted(reference.query(query))
        linked += len(got) > 1
    assert linked >= 2  # the two edited copies find their originals
    assert "doc-0" in lsh.query(hasher.to_datasketch(sigs[-2]))


def test_signature_files_are_checked(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    plain = str(tmp_path / "plain.parquet")
    pq.write_table(pa.table({"id": ["a"]}), plain)
    with pytest.raises(ValueError, match="plain.parquet: not a dupekit signature file"):
        read_signatures(plain)
    sig = np.zeros((1, 4), np.uint32)
    write_signatures(str(tmp_path / "a.parquet"), ["a"], sig, {"num_perm": 4, "seed": 1})
    write_signatures(str(tmp_path / "b.parquet"), ["b"], sig, {"num_perm": 4, "seed": 2})
    with pytest.raises(ValueError, match="b.parquet: MinHash parameters"):
        read_signatures([str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")])
