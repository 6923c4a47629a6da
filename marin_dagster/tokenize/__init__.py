"""Tokenizers and the token cache (no Dagster here: this runs in workers and trainers)."""

from marin_dagster.tokenize.cache import (
    TokenCache,
    TokenCacheShardWriter,
    dtype_for_vocab,
    finalize_split,
    read_cache_stats,
    shard_is_finished,
    shard_name,
    write_cache_stats,
)

__all__ = [
    "TokenCache",
    "TokenCacheShardWriter",
    "dtype_for_vocab",
    "finalize_split",
    "read_cache_stats",
    "shard_is_finished",
    "shard_name",
    "write_cache_stats",
]
