"""Dupekit: exact and fuzzy (MinHash-LSH) deduplication, with a MinHash kernel in JAX.

See docs/dupekit.md for the algorithms, the output layout and the formats.

Names resolve lazily, so a worker running only exact dedup never imports JAX.
"""

from __future__ import annotations

from marin_dagster.lazy import lazy_exports

_EXPORTS = {
    "DedupConfig": "pipeline",
    "DedupResult": "pipeline",
    "deduplicate": "pipeline",
    "MinHasher": "minhash",
    "PackedSigner": "packed",
    "ShingleConfig": "shingles",
    "shingle_hashes": "shingles",
    "shingle_strings": "shingles",
    "load_minhash_lsh": "lsh",
    "optimal_param": "lsh",
    "read_signatures": "lsh",
    "write_signatures": "lsh",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
