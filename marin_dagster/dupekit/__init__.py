"""Dupekit: exact and fuzzy (MinHash-LSH) deduplication, with a MinHash kernel in JAX.

See docs/dupekit.md for the algorithms, the output layout and the formats.
"""

from marin_dagster.dupekit.lsh import load_minhash_lsh, optimal_param, read_signatures
from marin_dagster.dupekit.minhash import MinHasher
from marin_dagster.dupekit.pipeline import DedupConfig, DedupResult, deduplicate
from marin_dagster.dupekit.shingles import ShingleConfig, shingle_hashes, shingle_strings

__all__ = [
    "DedupConfig",
    "DedupResult",
    "MinHasher",
    "ShingleConfig",
    "deduplicate",
    "load_minhash_lsh",
    "optimal_param",
    "read_signatures",
    "shingle_hashes",
    "shingle_strings",
]
