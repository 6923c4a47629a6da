"""Fuzzy dedup stages: MinHash signatures, LSH band buckets, candidate links.

Signature stage (per input file): documents in batches of `BATCH_DOCS`, their
shingle hashes through the JAX kernel, the signatures saved to
`signatures/part-{file:05d}.parquet`, and their band bucket keys emitted by
bucket partition. Bucket stage (Zephyr group_by on the partition): the
entries of a partition sorted by bucket key, and the documents of each
bucket linked to its smallest node key (a star, so one label propagation
round settles a bucket), optionally only where their estimated Jaccard
similarity reaches the threshold.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from marin_dagster import fs
from marin_dagster.dupekit.lsh import LSHParams, band_hashes
from marin_dagster.dupekit.minhash import MinHasher
from marin_dagster.dupekit.records import SourceDoc, SourceFile, iter_docs
from marin_dagster.dupekit.shingles import ShingleConfig, batch_shingle_hashes
from marin_dagster.zephyr import counters

BATCH_DOCS = 256
EMIT_DOCS = 4096
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
    """Per input file: signatures saved, and band entries emitted by bucket partition.

    A record is `(partition, bucket keys uint64[k], node keys list[str],
    signatures uint32[k, num_perm] or None)`: all entries of up to
    `EMIT_DOCS` documents whose bucket key falls in that partition. Grouping
    whole partitions (not single entries) keeps the shuffle to a few
    records per partition and file, and the bucket matching vectorized.
    """

    text_key: str
    id_key: str
    max_chars: int
    settings: FuzzySettings
    signatures_dir: str
    partitions: int

    def __call__(self, source: SourceFile) -> Iterator[tuple]:
        sink = _SignatureSink(fs.join(self.signatures_dir, f"part-{source.index:05d}.parquet"),
                              self.settings)
        ok = False
        try:
            pending: list[tuple[list[str], np.ndarray]] = []
            pending_docs = 0
            batch: list[tuple[SourceDoc, str]] = []
            for doc in iter_docs(source, self.text_key, self.id_key):
                text = doc.text
                if len(text) > self.max_chars:
                    counters.increment("dedup/document/truncated")
                    text = text[: self.max_chars]
                batch.append((doc, text))
                if len(batch) >= BATCH_DOCS:
                    pending.append(self._signatures(batch, sink))
                    pending_docs += len(batch)
                    batch = []
                if pending_docs >= EMIT_DOCS:
                    yield from self._emit(pending)
                    pending, pending_docs = [], 0
            if batch:
                pending.append(self._signatures(batch, sink))
            yield from self._emit(pending)
            ok = True
        finally:
            sink.close(ok)

    def _signatures(self, batch: list[tuple[SourceDoc, str]], sink: _SignatureSink
                    ) -> tuple[list[str], np.ndarray]:
        all_hashes = batch_shingle_hashes([text for _doc, text in batch], self.settings.shingles)
        # Empty, or shorter than one shingle: no signature, never a duplicate.
        docs = [doc for (doc, _t), h in zip(batch, all_hashes, strict=True) if len(h)]
        hashes = [h for h in all_hashes if len(h)]
        counters.increment("dedup/document/passed_through", len(batch) - len(docs))
        if not docs:
            return [], np.zeros((0, self.settings.num_perm), np.uint32)
        sigs = hasher_for(self.settings.num_perm, self.settings.seed).signatures(hashes)
        sink.write([doc.doc_id for doc in docs], sigs)
        counters.increment("dedup/fuzzy/signatures", len(docs))
        return [doc.key for doc in docs], sigs

    def _emit(self, pending: list[tuple[list[str], np.ndarray]]) -> Iterator[tuple]:
        keys = [k for ks, _s in pending for k in ks]
        if not keys:
            return
        sigs = np.concatenate([s for _k, s in pending])
        buckets = band_hashes(sigs, self.settings.lsh)  # [docs, bands]
        flat = buckets.reshape(-1)
        doc_of = np.repeat(np.arange(len(keys)), self.settings.lsh.bands)
        part = (flat % np.uint64(self.partitions)).astype(np.int64)
        order = np.argsort(part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange(self.partitions + 1))
        for p in range(self.partitions):
            idx = order[bounds[p]: bounds[p + 1]]
            if len(idx) == 0:
                continue
            docs = doc_of[idx]
            yield (p, flat[idx], [keys[d] for d in docs],
                   sigs[docs] if self.settings.verify else None)


def partition_of(record: tuple) -> int:
    return record[0]


@dataclass(frozen=True)
class BucketLinks:
    """Reducer over one bucket partition: the documents of each bucket linked, both directions.

    Without verification a bucket is a star around its smallest node key;
    with it, a spanning forest of its pairs whose estimated Jaccard reaches
    the threshold (every link a verified pair).
    """

    verify: bool
    threshold: float
    num_perm: int

    def __call__(self, partition: int, records: Iterator[tuple]) -> Iterator[tuple[str, str]]:
        parts = list(records)
        buckets = np.concatenate([r[1] for r in parts])
        keys = [k for r in parts for k in r[2]]
        sigs = np.concatenate([r[3] for r in parts]) if self.verify else None
        order = np.argsort(buckets, kind="stable")
        sorted_buckets = buckets[order]
        starts = np.flatnonzero(np.concatenate([[True], sorted_buckets[1:] != sorted_buckets[:-1]]))
        ends = np.concatenate([starts[1:], [len(order)]])
        for start, end in zip(starts[ends - starts > 1], ends[ends - starts > 1], strict=True):
            members: dict[str, np.ndarray | None] = {}
            for i in order[start:end]:
                members.setdefault(keys[i], sigs[i] if sigs is not None else None)
            if len(members) < 2:
                continue
            counters.increment("dedup/fuzzy/candidate_buckets")
            edges = self._verified_edges(members) if self.verify else self._star(sorted(members))
            for a, b in edges:
                yield a, b
                yield b, a

    @staticmethod
    def _star(keys: list[str]) -> Iterator[tuple[str, str]]:
        for key in keys[1:]:
            yield key, keys[0]

    def _verified_edges(self, members: dict[str, np.ndarray | None]) -> Iterator[tuple[str, str]]:
        """A spanning forest of the bucket's pairs with estimated Jaccard >= threshold.

        Every edge is itself a verified pair, and the forest connects exactly
        what the verified pairs connect, with at most one edge per document.
        """
        # Identical signatures agree everywhere: verify each distinct one once.
        by_sig: dict[bytes, list[str]] = {}
        rows: dict[bytes, np.ndarray] = {}
        for key in sorted(members):
            sig = members[key]
            if sig is None:
                raise ValueError("verification needs signatures in the bucket records")
            raw = sig.tobytes()
            by_sig.setdefault(raw, []).append(key)
            rows.setdefault(raw, sig)
        distinct = list(by_sig)
        for keys in by_sig.values():
            yield from self._star(keys)
        if len(distinct) < 2:
            return
        sigs = np.stack([rows[p] for p in distinct])
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
