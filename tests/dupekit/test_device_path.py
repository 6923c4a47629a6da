"""dupekit's device path equals the host path bit for bit: signatures (packed.py),
which also equal datasketch's, and verification (verify.py).

It runs here with JAX on the CPU: the same programs a GPU or TPU runs (JAX
compiles them for whatever backend it has), so what is checked is the packing,
the 64-bit hashing and keys, the padding and the kernels' arithmetic; speed on a
GPU is measured by `benchmarks/dedup_device.py` where one is lent.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from datasketch import MinHash

from marin_dagster.dupekit import DedupConfig, deduplicate, packed, read_signatures
from marin_dagster.dupekit.device import COMPUTE_ENV, compute_path
from marin_dagster.dupekit.hashing import shingle_hash
from marin_dagster.dupekit.packed import PackedSigner, bucket_width
from marin_dagster.dupekit.shingles import ShingleConfig, shingle_strings
from marin_dagster.dupekit.signers import HostSigner, signer_for
from marin_dagster.dupekit.verify import DeviceVerifier, HostVerifier, verifier
from tests.dupekit.corpus import (
    hostile_texts,
    near_duplicate_docs,
    read_jsonl_gz,
    write_jsonl_gz,
)


@pytest.mark.parametrize(
    "config",
    [ShingleConfig("char", 5), ShingleConfig("word", 5), ShingleConfig("word", 2)],
    ids=lambda c: f"{c.kind}{c.n}",
)
def test_device_path_equals_host_path(config):
    texts = hostile_texts()
    counts, sigs = PackedSigner(config, num_perm=64, seed=7).signatures(texts)
    host_counts, host_sigs = HostSigner(config, num_perm=64, seed=7).signatures(texts)
    assert counts.tolist() == host_counts.tolist()
    assert counts.min() == 0 and counts.max() > 5000  # both cases are in the corpus
    assert np.array_equal(sigs, host_sigs)
    assert (sigs[counts == 0] == 0xFFFFFFFF).all()


@pytest.mark.parametrize("kind", ["char", "word"])
def test_device_path_equals_datasketch(kind):
    config = ShingleConfig(kind, 5)
    texts = [t for t in hostile_texts() if shingle_strings(t, config)][:12]
    _counts, sigs = PackedSigner(config, num_perm=128, seed=3).signatures(texts)
    for text, sig in zip(texts, sigs, strict=True):
        m = MinHash(num_perm=128, seed=3, hashfunc=shingle_hash)
        for s in shingle_strings(text, config):
            m.update(s)
        assert sig.tolist() == m.hashvalues.tolist()


def test_many_buffers_and_chunks_keep_the_documents_order(monkeypatch):
    # Small buffers and chunks: each width fills several buffers, the texts span several
    # chunks, and results come back to their rows.
    monkeypatch.setattr(packed, "BUFFER_CHARS", 4096)
    monkeypatch.setattr(packed, "CHUNK_CHARS", 20_000)
    rng = random.Random(2)
    texts = [f"doc {i} " + "word " * rng.randint(0, 150) for i in range(400)]
    config = ShingleConfig("char", 5)
    counts, sigs = PackedSigner(config, num_perm=32, seed=1).signatures(texts)
    host_counts, host_sigs = HostSigner(config, num_perm=32, seed=1).signatures(texts)
    assert counts.tolist() == host_counts.tolist()
    assert np.array_equal(sigs, host_sigs)


def test_bucket_widths_are_quarter_octaves():
    assert [bucket_width(n, 64) for n in (0, 64, 65, 80, 81, 100, 2000, 2049)] == [
        64, 64, 80, 80, 96, 112, 2048, 2560,
    ]  # fmt: skip
    for n in range(1, 5000, 7):
        w = bucket_width(n, 1)
        assert n <= w < n * 1.25 + 8


def test_compute_path_choice(monkeypatch):
    monkeypatch.delenv(COMPUTE_ENV, raising=False)
    assert compute_path() == "host"  # JAX's backend here is the CPU
    assert isinstance(verifier(), HostVerifier)
    monkeypatch.setenv(COMPUTE_ENV, "device")
    assert isinstance(signer_for(ShingleConfig(), 16, 1), PackedSigner)
    assert isinstance(verifier(), DeviceVerifier)
    monkeypatch.setenv(COMPUTE_ENV, "gpu")
    with pytest.raises(ValueError, match=f"{COMPUTE_ENV}='gpu'.*auto, host, device"):
        compute_path()


def test_dedup_on_the_device_path_writes_what_the_host_path_writes(
    shakespeare_docs, tmp_path, monkeypatch
):
    """The whole fuzzy pipeline, its workers signing on the device path: the same
    signature files and the same clusters as on the host path."""
    from marin_dagster.zephyr import ZephyrContext

    docs = near_duplicate_docs(shakespeare_docs, originals=8)
    docs += [{"id": "empty", "text": ""}, {"id": "tiny", "text": "ab"}]
    files = [write_jsonl_gz(str(tmp_path / f"in/part-{i}.jsonl.gz"), docs[i::2]) for i in (0, 1)]
    outcomes = {}
    for path in ("host", "device"):
        monkeypatch.setenv(COMPUTE_ENV, path)  # the workers inherit it
        with ZephyrContext(max_workers=2, backend="local") as ctx:
            result = deduplicate(
                files, str(tmp_path / path), DedupConfig(mode="fuzzy"), context=ctx
            )
        ids, sigs, _meta = read_signatures(str(tmp_path / path / "signatures/*.parquet"))
        attrs = {r["id"]: r["cluster_id"] for p in result.attributes for r in read_jsonl_gz(p)}
        fuzzy = result.counts["fuzzy"]
        outcomes[path] = (ids, sigs, attrs, fuzzy["exact_checked"], fuzzy["exact_rejected"])
    host, device = outcomes["host"], outcomes["device"]
    assert device[0] == host[0] and "empty" not in device[0]
    assert np.array_equal(device[1], host[1])
    assert device[2] == host[2]
    assert device[3:] == host[3:] and host[3] > 0  # the same doubtful pairs, checked alike
    assert len(set(host[2].values())) < len(docs) - 8  # clusters were found


def _hash_sets(rng: np.random.Generator, count: int) -> list[np.ndarray]:
    """Sorted, duplicate-free uint32 sets: empty ones, and values at both ends of the range."""
    sets = []
    for i in range(count):
        size = [0, 1, 5, 200, 3000][i % 5] if i % 7 else int(rng.integers(0, 50))
        values = rng.integers(0, 2**32, size=size, dtype=np.uint64)
        if i % 11 == 0:
            values = np.concatenate([values, [0, 2**32 - 1]]).astype(np.uint64)
        sets.append(np.unique(values).astype(np.uint32))
    return sets


def test_intersections_on_both_paths_equal_python_sets():
    rng = np.random.default_rng(3)
    lefts = _hash_sets(rng, 1500)  # more pairs than the smallest padded shape
    rights = []
    for i, left in enumerate(lefts):
        shared = left[rng.random(len(left)) < [0.0, 0.5, 1.0][i % 3]]  # disjoint, half, all
        extra = rng.integers(0, 2**32, size=int(rng.integers(0, 300)), dtype=np.uint64)
        rights.append(np.union1d(shared, extra.astype(np.uint32)).astype(np.uint32))
    expected = [len(set(a.tolist()) & set(b.tolist())) for a, b in zip(lefts, rights, strict=True)]
    assert max(expected) > 1000 and min(expected) == 0
    for path in (HostVerifier(), DeviceVerifier()):
        assert path.intersections(lefts, rights).tolist() == expected
        assert path.intersections(lefts, [np.zeros(0, np.uint32)] * len(lefts)).tolist() == [
            0
        ] * len(lefts)
        assert path.intersections([], []).tolist() == []


def test_agreements_on_both_paths_equal_numpy():
    from marin_dagster.dupekit.fuzzy import _pairs_within

    rng = np.random.default_rng(5)
    sigs = rng.integers(0, 4, size=(3000, 64), dtype=np.uint32)  # many equal slots
    sigs[-1] = 2**32 - 1  # the empty sketch
    sizes = np.array([2, 3, 1, 40, 400, 2], np.int64)  # one group over a pair block
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    blocks = list(_pairs_within(starts, sizes))
    expected = [np.count_nonzero(sigs[a] == sigs[b], axis=1).tolist() for a, b in blocks]
    for path in (HostVerifier(), DeviceVerifier()):
        got = list(path.agreements(sigs, iter(blocks)))
        assert [g[2].tolist() for g in got] == expected
        assert all(g[0] is a and g[1] is b for g, (a, b) in zip(got, blocks, strict=True))
