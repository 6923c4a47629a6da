"""The token cache format: writer, ledger, reader and the packed-sequence iterator."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_dagster.tokenize import (
    TokenCache,
    TokenCacheShardWriter,
    dtype_for_vocab,
    finalize_split,
    shard_name,
    write_cache_stats,
)


def _random_docs(
    rng: np.random.Generator, n: int, vocab: int, max_len: int = 60
) -> list[np.ndarray]:
    return [rng.integers(0, vocab, size=int(rng.integers(1, max_len))) for _ in range(n)]


def _write_cache(
    root: str, shards_docs: list[list[np.ndarray]], dtype=np.uint16, eos_id=0, split: str = "train"
) -> TokenCache:
    split_dir = os.path.join(root, split)
    names = []
    for i, docs in enumerate(shards_docs):
        w = TokenCacheShardWriter(os.path.join(split_dir, shard_name(i)), dtype=dtype)
        for d in docs:
            w.add(d, num_bytes=3 * len(d))
        stats = w.finish()
        assert stats == {
            "num_tokens": int(sum(len(d) for d in docs)),
            "num_docs": len(docs),
            "bytes": int(sum(3 * len(d) for d in docs)),
        }
        names.append(shard_name(i))
    ledger = finalize_split(split_dir, names, dtype, eos_id)
    write_cache_stats(root, {split: ledger})
    return TokenCache.open(root, split=split)


def test_layout_matches_the_contract(tmp_path):
    rng = np.random.default_rng(0)
    shards = [_random_docs(rng, 5, 1000), _random_docs(rng, 3, 1000)]
    _write_cache(str(tmp_path), shards)
    split = tmp_path / "train"
    ledger = json.loads((split / "shard_ledger.json").read_text())
    assert ledger["shards"] == ["part-00000", "part-00001"]
    assert ledger["num_docs"] == 8
    assert ledger["num_tokens"] == sum(len(d) for s in shards for d in s)
    assert ledger["dtype"] == "uint16" and ledger["eos_id"] == 0 and ledger["finished"] is True
    for i, docs in enumerate(shards):
        part = split / f"part-{i:05d}"
        assert sorted(os.listdir(part)) == [".success", "input_ids.npy", "offsets.npy"]
        ids = np.load(part / "input_ids.npy", mmap_mode="r")
        offsets = np.load(part / "offsets.npy")
        assert ids.dtype == np.dtype("<u2") and ids.ndim == 1
        assert offsets.dtype == np.dtype("<i8") and offsets.shape == (len(docs) + 1,)
        assert offsets[0] == 0 and offsets[-1] == len(ids)
        for k, d in enumerate(docs):
            np.testing.assert_array_equal(ids[offsets[k] : offsets[k + 1]], d)
        success = json.loads((part / ".success").read_text())
        assert success["num_docs"] == len(docs)
    stats = json.loads((tmp_path / ".stats.json").read_text())
    assert stats["train"]["num_docs"] == 8
    assert stats["train"]["num_bytes"] == 3 * ledger["num_tokens"]


def test_random_access_across_shards(tmp_path):
    rng = np.random.default_rng(1)
    shards = [_random_docs(rng, n, 70000) for n in (0, 4, 1, 0, 0, 7, 0)]
    cache = _write_cache(str(tmp_path), shards, dtype=np.uint32)
    flat = [d for s in shards for d in s]
    assert len(cache) == len(flat) and cache.dtype == np.dtype("<u4")
    for i in rng.permutation(len(flat)):
        np.testing.assert_array_equal(cache[int(i)], flat[i])
    np.testing.assert_array_equal(cache[-1], flat[-1])
    with pytest.raises(IndexError):
        cache[len(flat)]
    assert [list(d) for d in cache] == [list(d) for d in flat]


def test_writer_rejects_ids_that_do_not_fit(tmp_path):
    w = TokenCacheShardWriter(str(tmp_path / "p"), dtype=np.uint16)
    with pytest.raises(ValueError, match="uint16"):
        w.add([1, 65536])
    with pytest.raises(ValueError, match="uint16 or uint32"):
        TokenCacheShardWriter(str(tmp_path / "q"), dtype=np.int32)
    assert dtype_for_vocab(65536) == np.uint16 and dtype_for_vocab(65537) == np.uint32


def test_unfinished_shard_leaves_no_marker_and_blocks_the_ledger(tmp_path):
    split_dir = str(tmp_path / "train")
    w = TokenCacheShardWriter(os.path.join(split_dir, shard_name(0)))
    w.add([1, 2, 3])
    # Not finished: nothing under the final names.
    assert not os.path.exists(os.path.join(split_dir, shard_name(0), ".success"))
    with pytest.raises(RuntimeError, match="part-00000 has no .success"):
        finalize_split(split_dir, [shard_name(0)], np.uint16, None)
    with pytest.raises(FileNotFoundError, match="shard_ledger.json is missing"):
        TokenCache.open(str(tmp_path))


def test_large_shard_spools_and_round_trips(tmp_path, monkeypatch):
    from marin_dagster.tokenize import cache as cache_mod

    monkeypatch.setattr(cache_mod, "_SPOOL_TOKENS", 100)
    rng = np.random.default_rng(2)
    docs = _random_docs(rng, 50, 500)
    cache = _write_cache(str(tmp_path), [docs])
    for i, d in enumerate(docs):
        np.testing.assert_array_equal(cache[i], d)


@settings(max_examples=25, deadline=None)
# Shards may be empty (an input past sample_count, or all held out).
@given(
    lengths=st.lists(st.lists(st.integers(1, 40), min_size=0, max_size=6), min_size=1, max_size=4),
    seq_len=st.integers(1, 50),
    seed=st.integers(0, 2**31),
)
def test_packed_epoch_yields_every_token_exactly_once(tmp_path_factory, lengths, seq_len, seed):
    root = str(tmp_path_factory.mktemp("c"))
    # Each token's value is its position in the stream, so coverage is checkable.
    counter = 0
    shards = []
    for shard_lengths in lengths:
        docs = []
        for n in shard_lengths:
            docs.append(np.arange(counter, counter + n))
            counter += n
        shards.append(docs)
    cache = _write_cache(root, shards, dtype=np.uint32)
    n_seq = cache.num_sequences(seq_len)
    if n_seq == 0:
        with pytest.raises(ValueError, match="fewer than one sequence"):
            next(cache.packed_sequences(seq_len, seed=seed))
        return
    seqs = list(cache.packed_sequences(seq_len, seed=seed, epochs=1))
    assert len(seqs) == n_seq
    assert all(s.shape == (seq_len,) and s.dtype == np.int32 for s in seqs)
    # Within a sequence tokens are contiguous stream positions.
    for s in seqs:
        np.testing.assert_array_equal(s, np.arange(s[0], s[0] + seq_len))
    seen = np.sort(np.concatenate(seqs))
    # Exactly once: every token of the stream but the dropped tail.
    np.testing.assert_array_equal(seen, np.arange(n_seq * seq_len))


def test_packed_order_is_a_seeded_permutation(tmp_path):
    docs = [np.arange(i * 10, i * 10 + 10) for i in range(100)]
    cache = _write_cache(str(tmp_path), [docs[:60], docs[60:]], dtype=np.uint32)

    def firsts(seed, epochs=1):
        return [int(s[0]) // 8 for s in cache.packed_sequences(8, seed=seed, epochs=epochs)]

    a, b, c = firsts(0), firsts(0), firsts(1)
    assert a == b
    assert a != c and sorted(a) == sorted(c) == list(range(125))
    two = firsts(0, epochs=2)
    assert two[:125] == a and two[125:] != a and sorted(two[125:]) == list(range(125))
    plain = [int(s[0]) // 8 for s in cache.packed_sequences(8, shuffle=False, epochs=1)]
    assert plain == list(range(125))


@settings(max_examples=25, deadline=None)
@given(start=st.integers(0, 400), seed=st.integers(0, 1000))
def test_packed_iterator_resumes_from_a_position(tmp_path_factory, start, seed):
    root = str(tmp_path_factory.mktemp("r"))
    rng = np.random.default_rng(3)
    cache = _write_cache(root, [_random_docs(rng, 20, 300), _random_docs(rng, 15, 300)])
    full = list(cache.packed_sequences(16, seed=seed, epochs=3))
    if start > len(full):
        start = len(full)
    resumed = list(cache.packed_sequences(16, seed=seed, start=start, epochs=3))
    assert len(resumed) == len(full) - start
    for x, y in zip(resumed, full[start:], strict=True):
        np.testing.assert_array_equal(x, y)
    # An infinite iterator continues the same stream.
    it = cache.packed_sequences(16, seed=seed, start=start)
    for y in full[start : start + 5]:
        np.testing.assert_array_equal(next(it), y)


def test_packed_batches_match_sequences(tmp_path):
    rng = np.random.default_rng(4)
    cache = _write_cache(str(tmp_path), [_random_docs(rng, 30, 300) for _ in range(3)])
    seqs = list(cache.packed_sequences(32, seed=5, start=7, epochs=2))
    batches = list(cache.packed_batches(32, 4, seed=5, start=7, epochs=2))
    assert all(b.shape == (4, 32) for b in batches)
    np.testing.assert_array_equal(np.concatenate(batches), np.stack(seqs[: len(batches) * 4]))
