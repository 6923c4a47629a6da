"""Shingle hashes computed by JAX (the fuzzy stages' path) equal numpy's, on hostile texts."""

from __future__ import annotations

import random

import numpy as np
import pytest

from marin_dagster.dupekit.hashing import murmur3_segments, murmur3_windows
from marin_dagster.dupekit.minhash import segment_hashes, window_hashes
from marin_dagster.dupekit.shingles import ShingleConfig, batch_shingle_hashes, shingle_hashes


def _texts() -> list[str]:
    rng = random.Random(5)
    words = ["the", "quick", "brown", "fox", "Straße", "İstanbul", "日本語", "😀x", "a\ud800b"]
    texts = ["", "a", "ab cd", "x" * 500 + " tail", " ".join(["w" * 70] * 8)]
    texts += [" ".join(rng.choice(words) for _ in range(rng.randint(0, 400))) for _ in range(40)]
    texts += ["plain ascii prose, with punctuation! " * rng.randint(1, 60) for _ in range(40)]
    return texts


@pytest.mark.parametrize(
    "config",
    [ShingleConfig("char", 5), ShingleConfig("char", 1), ShingleConfig("word", 5)],
    ids=lambda c: f"{c.kind}{c.n}",
)
@pytest.mark.parametrize("ascii_only", [True, False])
def test_device_hashes_equal_numpy_and_one_text_at_a_time(config, ascii_only):
    texts = [t for t in _texts() if t.isascii() or not ascii_only]
    device = batch_shingle_hashes(texts, config, device=True)
    host = batch_shingle_hashes(texts, config)
    for text, d, h in zip(texts, device, host, strict=True):
        assert np.array_equal(d, h)
        assert np.array_equal(d, shingle_hashes(text, config))


def test_segments_of_every_length_band():
    rng = np.random.default_rng(0)
    cps = rng.integers(32, 0x3000, size=20_000).astype(np.uint32)
    lengths = np.concatenate([np.arange(1, 300), rng.integers(1, 40, size=40_000), [19_000]])
    starts = rng.integers(0, len(cps) - lengths + 1)
    assert np.array_equal(
        segment_hashes(cps, starts, lengths), murmur3_segments(cps, starts, lengths)
    )
    # A segment ending exactly at the array's end, and windows of every small n.
    assert np.array_equal(
        segment_hashes(cps, [len(cps) - 7], [7]), murmur3_segments(cps, [len(cps) - 7], [7])
    )
    for n in (1, 2, 5, 9):
        assert np.array_equal(window_hashes(cps[:5000], n), murmur3_windows(cps[:5000], n))
    assert len(window_hashes(cps[:3], 5)) == 0
    assert len(segment_hashes(cps, [], [])) == 0
