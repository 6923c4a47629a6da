"""Shingle hashes of a batch (the fuzzy stages' path) equal one text's at a time, on hostile texts."""

from __future__ import annotations

import numpy as np
import pytest

from marin_dagster.dupekit.hashing import shingle_hash
from marin_dagster.dupekit.shingles import (
    ShingleConfig,
    batch_shingle_hashes,
    shingle_hashes,
    shingle_strings,
)
from tests.dupekit.corpus import hostile_texts


@pytest.mark.parametrize(
    "config",
    [ShingleConfig("char", 5), ShingleConfig("char", 1), ShingleConfig("word", 5)],
    ids=lambda c: f"{c.kind}{c.n}",
)
@pytest.mark.parametrize("ascii_only", [True, False])
def test_batch_hashes_equal_one_text_at_a_time(config, ascii_only):
    texts = [t for t in hostile_texts() if t.isascii() or not ascii_only]
    batch = batch_shingle_hashes(texts, config)
    assert len(batch) == len(texts)
    for text, hashes in zip(texts, batch, strict=True):
        assert np.array_equal(hashes, shingle_hashes(text, config))
        assert hashes.tolist() == [shingle_hash(s) for s in shingle_strings(text, config)]


def test_a_text_longer_than_any_batch_before():
    # The power tables grow with the batch: a 3 MB text needs more than the last one.
    text = "lorem ipsum dolor sit amet " * 120_000 + "end"
    hashes = shingle_hashes(text, ShingleConfig("word", 5))
    assert len(hashes) == 600_000 - 4 + 1
    assert hashes[-1] == shingle_hash("ipsum dolor sit amet end")
