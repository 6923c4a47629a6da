"""Fuzzy dedup stages: MinHash signatures, LSH band buckets, candidate links.

Signature stage (per input file): documents in batches of `BATCH_DOCS`, signed
on the host or the device (device.py), the signatures saved to
`signatures/part-{file:05d}.parquet`, and their band bucket keys emitted by
bucket partition. Bucket stage (Zephyr group_by on the partition): the
entries of a partition sorted by bucket key, and the documents of each
bucket linked to its smallest node key (a star, so one label propagation
round settles a bucket), optionally only where their estimated Jaccard
similarity reaches the threshold. With verification, a pair whose estimate
is within `verify_margin` above the threshold is only a *doubtful* link: the
exact check stage (`ShingleSets`, `ExactJaccard`) rereads both documents and
keeps the link only if the Jaccard similarity of their shingle hash sets
reaches the threshold.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from marin_dagster import fs
from marin_dagster.dupekit.exact import UNENCODABLE_COUNTER
from marin_dagster.dupekit.hashing import SHINGLE_HASH
from marin_dagster.dupekit.lsh import LSHParams, band_hashes
from marin_dagster.dupekit.records import SourceDoc, SourceFile, iter_docs, key_position
from marin_dagster.dupekit.shingles import ShingleConfig, batch_shingle_hashes
from marin_dagster.dupekit.signers import Signer, signer_for
from marin_dagster.dupekit.text import count_unencodable, replace_unencodable
from marin_dagster.dupekit.verify import verifier
from marin_dagster.zephyr import counters
from marin_dagster.zephyr.keys import partition_of

# Documents signed together: large enough that the MinHash kernel's fixed-shape blocks
# are mostly full (about 2 MB of text per batch; shingles.py hashes it in chunks).
BATCH_DOCS = 1024
EMIT_DOCS = 4096
# The exact check's pairs are shuffled into this many partitions and checked a batch
# at a time (about 32 MB of 64-bit keys per batch).
EXACT_PARTITIONS = 64
EXACT_BATCH_HASHES = 1 << 22


@dataclass(frozen=True)
class FuzzySettings:
    shingles: ShingleConfig
    num_perm: int
    seed: int
    lsh: LSHParams
    threshold: float
    verify: bool

    def meta(self) -> dict:
        return {
            "num_perm": self.num_perm,
            "seed": self.seed,
            "shingle_kind": self.shingles.kind,
            "ngram": self.shingles.n,
            "bands": self.lsh.bands,
            "rows": self.lsh.rows,
            "shingle_hash": SHINGLE_HASH,
            "scheme": "affine32",
        }


class _SignatureSink:
    """Streams a file's signatures into one Parquet file (atomic: temp name until closed)."""

    def __init__(self, path: str, settings: FuzzySettings):
        self._cm = fs.atomic_write(path, "wb")
        self._file = self._cm.__enter__()
        schema = pa.schema(
            [("id", pa.string()), ("signature", pa.list_(pa.uint32(), settings.num_perm))],
            metadata={b"dupekit": json.dumps(settings.meta(), sort_keys=True).encode()},
        )
        self._writer = pq.ParquetWriter(self._file, schema)
        self._schema = schema

    def write(self, ids: list, sigs: np.ndarray) -> None:
        values = pa.array(np.ascontiguousarray(sigs).reshape(-1), type=pa.uint32())
        table = pa.table(
            {
                # Arrow strings are UTF-8: an id's lone surrogates are saved as U+FFFD.
                "id": pa.array([replace_unencodable(str(i)) for i in ids], pa.string()),
                "signature": pa.FixedSizeListArray.from_arrays(values, sigs.shape[1]),
            },
            schema=self._schema,
        )
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
    signatures' low 16 bits uint16[k, num_perm] or None)`: all entries of up to
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
        sink = _SignatureSink(
            fs.join(self.signatures_dir, f"part-{source.index:05d}.parquet"), self.settings
        )
        signer = signer_for(self.settings.shingles, self.settings.num_perm, self.settings.seed)
        ok = False
        try:
            pending: list[tuple[list[str], np.ndarray]] = []
            pending_docs = 0
            batch: list[tuple[SourceDoc, str]] = []
            # One batch in flight: on a device, the next batch is read and normalized
            # while the last one is signed.
            inflight = None
            for doc in iter_docs(source, self.text_key, self.id_key):
                text = doc.text
                if len(text) > self.max_chars:
                    counters.increment("dedup/document/truncated")
                    text = text[: self.max_chars]
                batch.append((doc, text))
                if len(batch) >= BATCH_DOCS:
                    submitted = self._submit(signer, batch)
                    if inflight is not None:
                        pending.append(self._finish(*inflight, sink))
                        pending_docs += len(inflight[0])
                    inflight, batch = submitted, []
                if pending_docs >= EMIT_DOCS:
                    yield from self._emit(pending)
                    pending, pending_docs = [], 0
            if inflight is not None:
                pending.append(self._finish(*inflight, sink))
            if batch:
                pending.append(self._finish(*self._submit(signer, batch), sink))
            yield from self._emit(pending)
            ok = True
        finally:
            sink.close(ok)

    @staticmethod
    def _submit(signer: Signer, batch: list[tuple[SourceDoc, str]]) -> tuple:
        texts = [text for _doc, text in batch]
        unencodable = count_unencodable(texts)
        if unencodable:  # shingled with U+FFFD in their place (text.py)
            counters.increment(UNENCODABLE_COUNTER, unencodable)
        return batch, signer.submit(texts)

    def _finish(
        self, batch: list[tuple[SourceDoc, str]], result: Callable, sink: _SignatureSink
    ) -> tuple[list[str], np.ndarray]:
        shingle_counts, all_sigs = result()
        # Empty, or shorter than one shingle: no signature, never a duplicate.
        has_shingles = shingle_counts > 0
        docs = [doc for (doc, _t), keep in zip(batch, has_shingles.tolist(), strict=True) if keep]
        counters.increment("dedup/document/passed_through", len(batch) - len(docs))
        if not docs:
            return [], np.zeros((0, self.settings.num_perm), np.uint32)
        sigs = all_sigs[has_shingles]
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
            idx = order[bounds[p] : bounds[p + 1]]
            if len(idx) == 0:
                continue
            docs = doc_of[idx]
            # Verification compares values for equality: 16 bits halve the shuffle, and two
            # different values match by chance with probability 2^-16.
            yield (
                p,
                flat[idx],
                [keys[d] for d in docs],
                sigs[docs].astype(np.uint16) if self.settings.verify else None,
            )


def bucket_partition(record: tuple) -> int:
    return record[0]


@dataclass(frozen=True)
class BucketLinks:
    """Reducer over one bucket partition: `(node, [neighbours], [doubtful])` per linked document.

    One record per node and partition, not per edge end: the components'
    shuffle then moves about half as many records. Without verification a
    bucket is a star around its smallest node key and no link is doubtful.
    With it, the links are a spanning forest of the pairs sharing a bucket
    whose estimated Jaccard reaches the threshold: sure when the estimate
    clears `threshold + verify_margin`, doubtful below that (the exact check
    decides). Verification is vectorized over the whole partition: pairs are
    compared in blocks, and the forest is scipy's minimum spanning tree,
    weighted to use sure pairs wherever they connect the same documents, then
    links to each component's smallest node, then the most similar pairs.
    """

    verify: bool
    threshold: float
    num_perm: int
    verify_margin: float = 0.0

    def __call__(self, partition: int, records: Iterator[tuple]) -> Iterator[tuple]:
        parts = list(records)
        buckets = np.concatenate([r[1] for r in parts])
        keys = [k for r in parts for k in r[2]]
        if self.verify:
            edges = self._verified_links(buckets, keys, np.concatenate([r[3] for r in parts]))
        else:
            edges = ((a, b, True) for a, b in self._stars(buckets, keys))
        sure: dict[str, list[str]] = {}
        doubtful: dict[str, list[str]] = {}
        for a, b, is_sure in edges:
            ends = sure if is_sure else doubtful
            ends.setdefault(a, []).append(b)
            ends.setdefault(b, []).append(a)
        for node in sorted(sure.keys() | doubtful.keys()):
            yield node, sure.get(node, []), doubtful.get(node, [])

    @staticmethod
    def _stars(buckets: np.ndarray, keys: list[str]) -> Iterator[tuple[str, str]]:
        order = np.argsort(buckets, kind="stable")
        sorted_buckets = buckets[order]
        starts = np.flatnonzero(np.concatenate([[True], sorted_buckets[1:] != sorted_buckets[:-1]]))
        ends = np.concatenate([starts[1:], [len(order)]])
        for start, end in zip(starts[ends - starts > 1], ends[ends - starts > 1], strict=True):
            members = sorted({keys[i] for i in order[start:end]})
            if len(members) < 2:
                continue
            counters.increment("dedup/fuzzy/candidate_buckets")
            for key in members[1:]:
                yield members[0], key

    def _verified_links(
        self, buckets: np.ndarray, keys: list[str], sigs: np.ndarray
    ) -> Iterator[tuple[str, str, bool]]:
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components, minimum_spanning_tree

        # Nodes numbered by sorted key, entries sorted by (bucket, node): the same
        # forest whatever order the partition's records arrived in.
        names, node = np.unique(np.array(keys, dtype=object), return_inverse=True)
        order = np.lexsort((node, buckets))
        buckets, node, sigs = buckets[order], node[order], sigs[order]
        fresh = np.concatenate([[True], (buckets[1:] != buckets[:-1]) | (node[1:] != node[:-1])])
        buckets, node, sigs = buckets[fresh], node[fresh], sigs[fresh]
        starts = np.flatnonzero(np.concatenate([[True], buckets[1:] != buckets[:-1]]))
        sizes = np.diff(np.concatenate([starts, [len(buckets)]]))
        counters.increment("dedup/fuzzy/candidate_buckets", int(np.count_nonzero(sizes > 1)))
        need = agreement_needed(self.threshold, self.num_perm)
        sure = agreement_needed(
            self.threshold + self.verify_margin, self.num_perm
        )  # > num_perm: none
        us, vs, agrees = [], [], []
        compared = 0
        for a, b, agree in verifier().agreements(sigs, _pairs_within(starts, sizes)):
            compared += len(a)
            ok = agree >= need
            us.append(node[a[ok]])
            vs.append(node[b[ok]])
            agrees.append(agree[ok])
        counters.increment("dedup/fuzzy/verified_pairs", compared)
        if not us:
            return
        u, v, agree = np.concatenate(us), np.concatenate(vs), np.concatenate(agrees)
        counters.increment("dedup/fuzzy/rejected_pairs", compared - len(u))
        if not len(u):
            return
        # A pair met in several buckets is one edge, at its (equal) agreement.
        lo, hi = np.minimum(u, v), np.maximum(u, v)
        edge, first = np.unique(lo * len(names) + hi, return_index=True)
        lo, hi, agree = lo[first], hi[first], agree[first]
        shape = (len(names), len(names))
        # Labels propagate as the smallest key: a forest that is a star around each
        # component's smallest node (as far as the pairs allow) settles in one round.
        # A doubtful pair costs more than any sure one, so it enters the forest only
        # where no sure path connects its ends, and few pairs go to the exact check.
        _n, comp = connected_components(coo_matrix((agree, (lo, hi)), shape=shape), directed=False)
        _c, root = np.unique(comp, return_index=True)
        w = np.where(lo == root[comp[lo]], 1, 2 + self.num_perm - agree)
        w = w + np.where(agree >= sure, 0, self.num_perm + 2)
        forest = minimum_spanning_tree(
            coo_matrix((w.astype(np.float64), (lo, hi)), shape=shape).tocsr()
        ).tocoo()
        f_lo, f_hi = np.minimum(forest.row, forest.col), np.maximum(forest.row, forest.col)
        f_sure = agree[np.searchsorted(edge, f_lo.astype(np.int64) * len(names) + f_hi)] >= sure
        for i, j, is_sure in zip(f_lo.tolist(), f_hi.tolist(), f_sure.tolist(), strict=True):
            yield names[i], names[j], is_sure


def agreement_needed(jaccard: float, num_perm: int) -> int:
    """The fewest equal signature values for an estimated Jaccard of at least `jaccard`."""
    return int(np.ceil(jaccard * num_perm - 1e-9))


def doubtful_ends(node: dict) -> Iterator[tuple[int, int, tuple[str, str], int]]:
    """`(file index, record index, pair, side)` for both ends of a node's doubtful links.

    Each pair is asked for once, by its smaller node.
    """
    for other in node.get("doubtful", ()):
        if node["node"] < other:
            pair = (node["node"], other)
            for side, key in enumerate(pair):
                yield (*key_position(key), pair, side)


def file_of_request(request: tuple) -> int:
    return request[0]


def pair_of(item: tuple) -> tuple[str, str]:
    return item[0]


def pair_partition(item: tuple) -> int:
    """The exact check's group: a partition of the pairs, checked as one batch."""
    return partition_of(item[0], EXACT_PARTITIONS)


@dataclass(frozen=True)
class ShingleSets:
    """Reducer over one input file's requests: `(pair, shingle hash set)` for each.

    Reads the file again and shingles only the requested documents, exactly as
    the signature stage did (same truncation, same hashes), so a pair's exact
    Jaccard is over the very sets its signatures summarize.
    """

    sources: tuple[SourceFile, ...]
    text_key: str
    id_key: str
    max_chars: int
    shingles: ShingleConfig

    def __call__(
        self, file_index: int, requests: Iterator[tuple]
    ) -> Iterator[tuple[tuple[str, str], int, np.ndarray]]:
        wanted: dict[int, list[tuple[tuple[str, str], int]]] = {}
        for _file, record, pair, side in requests:
            wanted.setdefault(record, []).append((pair, side))
        last = max(wanted)
        texts, pairs = [], []
        for doc in iter_docs(self.sources[file_index], self.text_key, self.id_key):
            if doc.record_index in wanted:
                texts.append(doc.text[: self.max_chars])
                pairs.append(wanted[doc.record_index])
            if doc.record_index >= last:
                break
        for start in range(0, len(texts), BATCH_DOCS):
            hashes = batch_shingle_hashes(texts[start : start + BATCH_DOCS], self.shingles)
            for doc_pairs, doc_hashes in zip(
                pairs[start : start + BATCH_DOCS], hashes, strict=True
            ):
                unique = np.sort(doc_hashes)  # np.unique is 5x slower on these
                unique = unique[np.concatenate([[True], unique[1:] != unique[:-1]])]
                for pair, side in doc_pairs:
                    yield pair, side, unique


@dataclass(frozen=True)
class ExactJaccard:
    """Reducer over one partition of doubtful pairs: the edges whose exact Jaccard holds.

    The items arrive sorted by pair (`sort_by=pair_of`), so a pair's two shingle
    sets are adjacent; pairs are checked in batches of about `EXACT_BATCH_HASHES`
    hashes, on the host or the device (verify.py).
    """

    threshold: float

    def __call__(self, partition: int, items: Iterator[tuple]) -> Iterator[dict]:
        batch: list[tuple[tuple[str, str], np.ndarray, np.ndarray]] = []
        hashes = 0
        for pair, group in itertools.groupby(items, key=pair_of):
            sets = {side: h for _pair, side, h in group}
            if len(sets) != 2:
                raise ValueError(
                    f"exact check of {pair!r} found {len(sets)} of its 2 documents "
                    "(were the input files changed during the run?)"
                )
            batch.append((pair, sets[0], sets[1]))
            hashes += len(sets[0]) + len(sets[1])
            if hashes >= EXACT_BATCH_HASHES:
                yield from self._check(batch)
                batch, hashes = [], 0
        if batch:
            yield from self._check(batch)

    def _check(self, batch: list[tuple[tuple[str, str], np.ndarray, np.ndarray]]) -> Iterator[dict]:
        lefts, rights = [b[1] for b in batch], [b[2] for b in batch]
        inter = verifier().intersections(lefts, rights)
        union = np.array([len(x) + len(y) for x, y in zip(lefts, rights, strict=True)]) - inter
        holds = inter >= self.threshold * union - 1e-9
        counters.increment("dedup/fuzzy/exact_checked", len(batch))
        counters.increment("dedup/fuzzy/exact_rejected", int(np.count_nonzero(~holds)))
        for (pair, _l, _r), ok in zip(batch, holds.tolist(), strict=True):
            if ok:
                yield {"a": pair[0], "b": pair[1]}


PAIR_BLOCK = 1 << 16


def _pairs_within(starts: np.ndarray, sizes: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Every pair of positions inside each group, in blocks of about PAIR_BLOCK pairs.

    Groups of one size share one triangle of offsets; a group too large for a
    block is cut by rows, so memory stays bounded whatever the bucket sizes.
    """
    for size in np.unique(sizes[sizes > 1]):
        size = int(size)
        group_starts = starts[sizes == size]
        per_group = size * (size - 1) // 2
        if per_group <= PAIR_BLOCK:
            iu, ju = np.triu_indices(size, 1)
            step = max(1, PAIR_BLOCK // per_group)
            for k in range(0, len(group_starts), step):
                base = group_starts[k : k + step, None]
                yield (base + iu).reshape(-1), (base + ju).reshape(-1)
            continue
        for base in group_starts.tolist():
            rows = max(1, PAIR_BLOCK // size)
            for r0 in range(0, size - 1, rows):
                a = np.concatenate(
                    [np.full(size - 1 - r, base + r) for r in range(r0, min(size - 1, r0 + rows))]
                )
                b = np.concatenate(
                    [
                        np.arange(base + r + 1, base + size)
                        for r in range(r0, min(size - 1, r0 + rows))
                    ]
                )
                yield a, b
