"""Fuzzy dedup stages: MinHash signatures, LSH band buckets, candidate links.

Signature stage (per input file): documents in batches of `BATCH_DOCS`, their
shingle hashes through the JAX kernel, the signatures saved to
`signatures/part-{file:05d}.parquet` and one record per band emitted for the
bucket shuffle. Bucket stage (Zephyr group_by on the band key): the documents
of a bucket are linked to its smallest node key (a star, so one label
propagation round settles a bucket), optionally only where their estimated
Jaccard similarity reaches the threshold.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from marin_dagster import fs
from marin_dagster.dupekit.lsh import LSHParams, band_keys
from marin_dagster.dupekit.minhash import MinHasher
from marin_dagster.dupekit.records import SourceDoc, SourceFile, iter_docs
from marin_dagster.dupekit.shingles import ShingleConfig, shingle_hashes
from marin_dagster.zephyr import counters

BATCH_DOCS = 256
_HASHERS: dict[tuple[int, int], MinHasher] = {}


def hasher_for(num_perm: int, seed: int) -> MinHasher:
    """One MinHasher per worker process, so jit compilations are reused across tasks."""
    key = (num_perm, seed)
    if key not in _HASHERS:
        _HASHERS[key] = MinHasher(num_perm, seed)
    return _HASHERS[key]


@dataclass(frozen=True)
class FuzzySettings:
    shingles: ShingleConfig
    num_perm: int
    seed: int
    lsh: LSHParams
    threshold: float
    verify: bool

    def meta(self) -> dict:
        return {"num_perm": self.num_perm, "seed": self.seed, "shingle_kind": self.shingles.kind,
                "ngram": self.shingles.n, "bands": self.lsh.bands, "rows": self.lsh.rows,
                "shingle_hash": "murmur3_32(utf-32-le)", "scheme": "affine32"}


class _SignatureSink:
    """Streams a file's signatures into one Parquet file (atomic: temp name until closed)."""

    def __init__(self, path: str, settings: FuzzySettings):
        self._cm = fs.atomic_write(path, "wb")
        self._file = self._cm.__enter__()
        schema = pa.schema([("id", pa.string()),
                            ("signature", pa.list_(pa.uint32(), settings.num_perm))],
                           metadata={b"dupekit": json.dumps(settings.meta(), sort_keys=True).encode()})
        self._writer = pq.ParquetWriter(self._file, schema)
        self._schema = schema

    def write(self, ids: list, sigs: np.ndarray) -> None:
        values = pa.array(np.ascontiguousarray(sigs).reshape(-1), type=pa.uint32())
        table = pa.table({"id": pa.array([str(i) for i in ids], pa.string()),
                          "signature": pa.FixedSizeListArray.from_arrays(values, sigs.shape[1])},
                         schema=self._schema)
        self._writer.write_table(table)

    def close(self, ok: bool) -> None:
        if ok:
            self._writer.close()
            self._cm.__exit__(None, None, None)
        else:
            exc = RuntimeError("signature stage failed")
            self._cm.__exit__(type(exc), exc, None)


@dataclass(frozen=True)
class BandRecords:
    """Per document and band: `(bucket key, node key, signature bytes or None)`."""

    text_key: str
    id_key: str
    max_chars: int
    settings: FuzzySettings
    signatures_dir: str

    def __call__(self, source: SourceFile) -> Iterator[tuple[str, str, bytes | None]]:
        sink = _SignatureSink(fs.join(self.signatures_dir, f"part-{source.index:05d}.parquet"),
                              self.settings)
        ok = False
        try:
            batch: list[tuple[SourceDoc, np.ndarray]] = []
            for doc in iter_docs(source, self.text_key, self.id_key):
                text = doc.text
                if len(text) > self.max_chars:
                    counters.increment("dedup/document/truncated")
                    text = text[: self.max_chars]
                hashes = shingle_hashes(text, self.settings.shingles)
                if len(hashes) == 0:
                    # Empty, or shorter than one shingle: no signature, never a duplicate.
                    counters.increment("dedup/document/passed_through")
                    continue
                batch.append((doc, hashes))
                if len(batch) >= BATCH_DOCS:
                    yield from self._flush(batch, sink)
                    batch = []
            if batch:
                yield from self._flush(batch, sink)
            ok = True
        finally:
            sink.close(ok)

    def _flush(self, batch: list[tuple[SourceDoc, np.ndarray]], sink: _SignatureSink
               ) -> Iterator[tuple[str, str, bytes | None]]:
        hasher = hasher_for(self.settings.num_perm, self.settings.seed)
        sigs = hasher.signatures([h for _doc, h in batch])
        sink.write([doc.doc_id for doc, _h in batch], sigs)
        counters.increment("dedup/fuzzy/signatures", len(batch))
        for (doc, _h), sig in zip(batch, sigs, strict=True):
            payload = sig.tobytes() if self.settings.verify else None
            for bucket in band_keys(sig, self.settings.lsh):
                yield bucket, doc.key, payload


def bucket_of(item: tuple) -> str:
    return item[0]


@dataclass(frozen=True)
class BucketLinks:
    """A bucket's documents linked to its smallest node key, both directions."""

    verify: bool
    threshold: float
    num_perm: int

    def __call__(self, bucket: str, items: Iterator[tuple[str, str, bytes | None]]
                 ) -> Iterator[tuple[str, str]]:
        members: dict[str, bytes | None] = {}
        for _b, key, payload in items:
            members.setdefault(key, payload)
        if len(members) < 2:
            return
        counters.increment("dedup/fuzzy/candidate_buckets")
        edges = self._verified_edges(members) if self.verify else self._star(sorted(members))
        for a, b in edges:
            yield a, b
            yield b, a

    @staticmethod
    def _star(keys: list[str]) -> Iterator[tuple[str, str]]:
        for key in keys[1:]:
            yield key, keys[0]

    def _verified_edges(self, members: dict[str, bytes | None]) -> Iterator[tuple[str, str]]:
        """A spanning forest of the bucket's pairs with estimated Jaccard >= threshold.

        Every edge is itself a verified pair, and the forest connects exactly
        what the verified pairs connect, with at most one edge per document.
        """
        # Identical signatures agree everywhere: verify each distinct one once.
        by_sig: dict[bytes, list[str]] = {}
        for key in sorted(members):
            payload = members[key]
            if payload is None:
                raise ValueError("verification needs signatures in the bucket records")
            by_sig.setdefault(payload, []).append(key)
        distinct = list(by_sig)
        for keys in by_sig.values():
            yield from self._star(keys)
        if len(distinct) < 2:
            return
        sigs = np.stack([np.frombuffer(p, dtype=np.uint32) for p in distinct])
        n = len(distinct)
        parent = list(range(n))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        need = int(np.ceil(self.threshold * self.num_perm - 1e-9))
        verified = 0
        for i in range(n - 1):
            agree = np.count_nonzero(sigs[i + 1:] == sigs[i], axis=1)
            counters.increment("dedup/fuzzy/verified_pairs", n - 1 - i)
            for j in np.flatnonzero(agree >= need):
                a, b = find(i), find(i + 1 + int(j))
                if a != b:
                    parent[max(a, b)] = min(a, b)
                    verified += 1
                    yield by_sig[distinct[i]][0], by_sig[distinct[i + 1 + int(j)]][0]
        counters.increment("dedup/fuzzy/rejected_pairs", n - 1 - verified)
