"""Real token caches for the Levanter tests, written with the tokenize engine's own writer."""

from __future__ import annotations

import os

import numpy as np

from marin_dagster.tokenize.cache import (
    TokenCacheShardWriter,
    finalize_split,
    shard_name,
    write_cache_stats,
)

EOS = 0


def write_cache(
    path: str,
    vocab_size: int,
    num_tokens: int,
    *,
    seed: int = 0,
    shards: int = 2,
    validation_tokens: int = 0,
    bytes_per_token: float = 3.5,
    period: int = 0,
) -> str:
    """A cache of random documents (EOS-terminated) in `shards` shards per split.

    `period` > 0 makes the text a repeating pattern (learnable); 0 is uniform noise.
    """
    rng = np.random.default_rng(seed)
    ledgers = {}
    for split, total in (("train", num_tokens), ("validation", validation_tokens)):
        if total <= 0:
            continue
        split_dir = os.path.join(path, split)
        names = []
        per_shard = total // shards
        for s in range(shards):
            name = shard_name(s)
            names.append(name)
            with TokenCacheShardWriter(os.path.join(split_dir, name), np.uint16) as w:
                written = 0
                while written < per_shard:
                    n = min(int(rng.integers(20, 200)), per_shard - written)
                    if period:
                        start = int(rng.integers(0, period))
                        body = 1 + (np.arange(start, start + n - 1) % period) % (vocab_size - 1)
                    else:
                        body = rng.integers(1, vocab_size, size=n - 1)
                    doc = np.concatenate([body, [EOS]]).astype(np.int64)
                    w.add(doc, num_bytes=int(round(n * bytes_per_token)))
                    written += n
        ledgers[split] = finalize_split(split_dir, names, np.uint16, EOS)
    write_cache_stats(path, ledgers)
    return path
