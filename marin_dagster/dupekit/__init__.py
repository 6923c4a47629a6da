"""Dupekit: exact and fuzzy (MinHash-LSH) deduplication, with a MinHash kernel in JAX.

See docs/dupekit.md for the algorithms, the output layout and the formats.
"""
