"""Tokenizers and the token cache (no Dagster here: this runs in workers and trainers).

Entry points:
- ``train_tokenizer_from_files`` / ``train_tokenizer``: train a byte-level BPE, save it.
- ``load_tokenizer``: a tokenizer.json path, a directory holding one, or a hub name.
- ``build_token_cache``: tokenize text shards into a cache, one cache shard per input shard.
- ``TokenCache``: read a cache (documents, packed sequences) for training.
- ``summarize_cache``: totals, bytes per token and decoded samples for metadata.
The format is described in docs/formats.md ("Token cache").
"""

from marin_dagster.tokenize.build import (
    TokenCacheStats,
    TokenizeOptions,
    build_token_cache,
    tokenize_documents,
)
from marin_dagster.tokenize.cache import (
    TokenCache,
    TokenCacheShardWriter,
    dtype_for_vocab,
    finalize_cache,
    finalize_split,
    read_cache_stats,
    shard_is_finished,
    shard_name,
    write_cache_stats,
)
from marin_dagster.tokenize.records import BadRecordError, iter_texts
from marin_dagster.tokenize.summary import decoded_samples, summarize_cache
from marin_dagster.tokenize.tokenizer import (
    DEFAULT_EOS,
    BpeTrainingConfig,
    TokenizerHubUnreachableError,
    TokenizerNotFoundError,
    TrainedTokenizer,
    bytes_per_token,
    describe_tokenizer,
    encode_examples,
    examples_markdown,
    find_eos_id,
    load_tokenizer,
    read_tokenizer_config,
    train_tokenizer,
    train_tokenizer_from_files,
    vocab_size,
)

__all__ = [
    "DEFAULT_EOS",
    "BadRecordError",
    "BpeTrainingConfig",
    "TokenCache",
    "TokenCacheShardWriter",
    "TokenCacheStats",
    "TokenizeOptions",
    "TokenizerHubUnreachableError",
    "TokenizerNotFoundError",
    "TrainedTokenizer",
    "build_token_cache",
    "bytes_per_token",
    "decoded_samples",
    "describe_tokenizer",
    "dtype_for_vocab",
    "encode_examples",
    "examples_markdown",
    "finalize_cache",
    "finalize_split",
    "find_eos_id",
    "iter_texts",
    "load_tokenizer",
    "read_cache_stats",
    "read_tokenizer_config",
    "shard_is_finished",
    "shard_name",
    "summarize_cache",
    "tokenize_documents",
    "train_tokenizer",
    "train_tokenizer_from_files",
    "vocab_size",
    "write_cache_stats",
]
