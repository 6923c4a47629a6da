"""The token cache: a sharded, memory-mappable store of tokenized documents.

Layout (after Levanter's cache), for each split (``train``, ``validation``)::

    {cache}/{split}/shard_ledger.json
        {"shards": ["part-00000", ...], "num_tokens": int, "num_docs": int,
         "num_bytes": int, "dtype": "uint16" | "uint32", "eos_id": int | null,
         "shard_num_tokens": [...], "shard_num_docs": [...], "finished": true}
    {cache}/{split}/part-NNNNN/input_ids.npy   1-D uint16 (vocab <= 65536) else uint32:
                                               every document's ids, concatenated
                                               (EOS appended per document when append_eos)
    {cache}/{split}/part-NNNNN/offsets.npy     1-D int64, num_docs + 1 entries, offsets[0] = 0;
                                               doc i = input_ids[offsets[i]:offsets[i + 1]]
    {cache}/{split}/part-NNNNN/.success        written last: {"num_tokens", "num_docs", "bytes"}
    {cache}/.stats.json                        {split: {"num_tokens", "num_docs", "num_bytes"}}

``bytes`` / ``num_bytes`` count the UTF-8 bytes of the source text that was
tokenized (so bytes per token = num_bytes / num_tokens).

Every file is written atomically (temporary name, then rename or one complete
upload) and a shard's ``.success`` is written after its arrays, so a killed
writer leaves no shard that looks finished. The ledger is written once all
shards of a split are done.

Packed sequences (:meth:`TokenCache.packed_sequences`): the split's token
stream is every shard's ``input_ids`` concatenated in ledger order (EOS is
already between documents when the cache was built with ``append_eos``). It is
cut into ``num_tokens // seq_len`` sequences of exactly ``seq_len`` tokens; the
last ``num_tokens % seq_len`` tokens (fewer than one sequence) are DROPPED, so
every other token appears exactly once per epoch. Each epoch visits the
sequences in a permutation drawn from ``(seed, epoch)``. Sequences are
``seq_len`` long, not ``seq_len + 1``: as in Levanter, the trainer takes targets
by shifting within the sequence (the last position has no target).
"""

from __future__ import annotations

import array
import io
import logging
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from marin_dagster import fs

logger = logging.getLogger(__name__)

LEDGER_NAME = "shard_ledger.json"
STATS_NAME = ".stats.json"
SUCCESS_NAME = ".success"
INPUT_IDS_NAME = "input_ids.npy"
OFFSETS_NAME = "offsets.npy"

_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
# Tokens buffered in memory before the writer spools them to a local temp file.
_SPOOL_TOKENS = 1 << 22


def shard_name(index: int) -> str:
    return f"part-{index:05d}"


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab <= 65536), else uint32."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if vocab_size <= 1 << 16:
        return _DTYPES["uint16"]
    if vocab_size <= 1 << 32:
        return _DTYPES["uint32"]
    raise ValueError(f"vocab_size {vocab_size} does not fit in uint32 token ids")


def _canonical_dtype(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    name = dt.name
    if name not in _DTYPES:
        raise ValueError(f"token cache dtype must be uint16 or uint32, got {dt}")
    return _DTYPES[name]


def _npy_header(dtype: np.dtype, length: int) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf,
        {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (length,)},
    )
    return buf.getvalue()


def _save_npy(path: str, arr: np.ndarray) -> None:
    with fs.atomic_write(path, "wb") as f:
        f.write(_npy_header(arr.dtype, arr.shape[0]))
        f.write(np.ascontiguousarray(arr).tobytes())


def shard_is_finished(shard_dir: str) -> bool:
    return fs.exists(fs.join(shard_dir, SUCCESS_NAME))


class TokenCacheShardWriter:
    """Writes one shard: ``add`` documents' ids, then ``finish``.

    Ids are buffered and spooled to a local temporary file past a few million
    tokens, so memory stays bounded whatever the shard size. Nothing appears
    under the shard's final names until ``finish``; ``.success`` comes last.
    A stale ``.success`` (and any temporary file of a killed writer) is removed
    on open, because this writer is about to replace the shard.
    """

    def __init__(self, shard_dir: str, dtype: Any = np.uint16) -> None:
        self.shard_dir = shard_dir.rstrip("/")
        self.dtype = _canonical_dtype(dtype)
        self._max_id = np.iinfo(self.dtype).max
        self._lengths = array.array("q")
        self._buffer: list[np.ndarray] = []
        self._buffered = 0
        self._spool: Any = None
        self.num_tokens = 0
        self.num_bytes = 0
        self.bytes_written = 0  # the two arrays' file sizes, once finished
        self._finished = False
        fs.remove(fs.join(self.shard_dir, SUCCESS_NAME))
        self._remove_leftovers()

    def _remove_leftovers(self) -> None:
        # A writer killed mid-file leaves temporary names behind (local disks
        # only; object stores never see partial uploads). Clear them so a
        # rewritten shard holds exactly its three files.
        fsys, p = fs.url_to_fs(self.shard_dir)
        if not fs.is_local(self.shard_dir) or not fsys.isdir(p):
            return
        for name in fsys.ls(p, detail=False):
            if fs.is_temp_name(name):
                fsys.rm(name)

    @property
    def num_docs(self) -> int:
        return len(self._lengths)

    def add(self, ids: Sequence[int] | np.ndarray, num_bytes: int = 0) -> None:
        """Append one document. ``num_bytes``: its source text's UTF-8 size, for stats."""
        if self._finished:
            raise RuntimeError(f"shard writer for {self.shard_dir} is already finished")
        arr = np.asarray(ids)
        if arr.ndim != 1:
            raise ValueError(f"a document's ids must be 1-D, got shape {arr.shape}")
        if arr.size:
            if arr.dtype.kind not in "iu":
                raise TypeError(f"token ids must be integers, got dtype {arr.dtype}")
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0 or hi > self._max_id:
                raise ValueError(
                    f"token id {hi if hi > self._max_id else lo} does not fit the cache dtype "
                    f"{self.dtype.name} (0..{self._max_id}); use uint32 for vocabularies "
                    "over 65536 tokens"
                )
            arr = arr.astype(self.dtype, copy=False)
            self._buffer.append(arr)
            self._buffered += arr.size
        self._lengths.append(int(arr.size))
        self.num_tokens += int(arr.size)
        self.num_bytes += int(num_bytes)
        if self._buffered >= _SPOOL_TOKENS:
            self._flush()

    def _flush(self) -> None:
        if not self._buffer:
            return
        if self._spool is None:
            self._spool = tempfile.TemporaryFile(prefix="token-shard-")
        self._spool.write(np.concatenate(self._buffer).tobytes())
        self._buffer = []
        self._buffered = 0

    def finish(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write input_ids.npy, offsets.npy, then .success; return the shard's stats.

        ``extra`` adds keys to the ``.success`` marker (the builder records its
        skipped-record counts there, so a resumed build still reports them).
        """
        if self._finished:
            raise RuntimeError(f"shard writer for {self.shard_dir} is already finished")
        self._finished = True
        try:
            ids_path = fs.join(self.shard_dir, INPUT_IDS_NAME)
            with fs.atomic_write(ids_path, "wb") as f:
                f.write(_npy_header(self.dtype, self.num_tokens))
                if self._spool is not None:
                    self._spool.seek(0)
                    for chunk in iter(lambda: self._spool.read(1 << 24), b""):
                        f.write(chunk)
                if self._buffer:
                    f.write(np.concatenate(self._buffer).astype(self.dtype).tobytes())
            offsets = np.zeros(self.num_docs + 1, dtype="<i8")
            if self.num_docs:
                np.cumsum(np.frombuffer(self._lengths, dtype=np.int64), out=offsets[1:])
            _save_npy(fs.join(self.shard_dir, OFFSETS_NAME), offsets)
            self.bytes_written = (
                len(_npy_header(self.dtype, self.num_tokens))
                + self.num_tokens * self.dtype.itemsize
                + len(_npy_header(offsets.dtype, offsets.shape[0]))
                + offsets.nbytes
            )
            stats = {
                **(extra or {}),
                "num_tokens": self.num_tokens,
                "num_docs": self.num_docs,
                "bytes": self.num_bytes,
            }
            fs.write_json(fs.join(self.shard_dir, SUCCESS_NAME), stats)
            return stats
        finally:
            self._buffer = []
            if self._spool is not None:
                self._spool.close()
                self._spool = None

    def __enter__(self) -> TokenCacheShardWriter:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is None and not self._finished:
            self.finish()
        elif self._spool is not None:
            self._spool.close()
            self._spool = None


def finalize_split(
    split_dir: str, shards: Sequence[str], dtype: Any, eos_id: int | None
) -> dict[str, Any]:
    """Write ``shard_ledger.json`` for a split whose shards all have ``.success``.

    ``shards`` are shard directory names (``part-00000``) in stream order.
    """
    dt = _canonical_dtype(dtype)
    shard_tokens, shard_docs, num_bytes = [], [], 0
    for name in shards:
        marker = fs.read_json_or_none(fs.join(split_dir, name, SUCCESS_NAME))
        if marker is None:
            raise RuntimeError(
                f"cannot finalize {split_dir}: shard {name} has no {SUCCESS_NAME}; "
                "finish building every shard first (rerun the build, it resumes)"
            )
        shard_tokens.append(int(marker["num_tokens"]))
        shard_docs.append(int(marker["num_docs"]))
        num_bytes += int(marker.get("bytes", 0))
    ledger = {
        "shards": list(shards),
        "num_tokens": sum(shard_tokens),
        "num_docs": sum(shard_docs),
        "num_bytes": num_bytes,
        "dtype": dt.name,
        "eos_id": None if eos_id is None else int(eos_id),
        "shard_num_tokens": shard_tokens,
        "shard_num_docs": shard_docs,
        "finished": True,
    }
    fs.write_json(fs.join(split_dir, LEDGER_NAME), ledger)
    return ledger


def write_cache_stats(cache_dir: str, ledgers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Write ``{cache}/.stats.json`` from each split's ledger."""
    stats = {
        split: {
            "num_tokens": int(ledger["num_tokens"]),
            "num_docs": int(ledger["num_docs"]),
            "num_bytes": int(ledger.get("num_bytes", 0)),
        }
        for split, ledger in ledgers.items()
    }
    fs.write_json(fs.join(cache_dir, STATS_NAME), stats)
    return stats


def finalize_cache(
    cache_dir: str, splits: Mapping[str, Sequence[str]], dtype: Any, eos_id: int | None
) -> dict[str, dict[str, Any]]:
    """Make finished shard folders a readable cache: each split's ledger, then ``.stats.json``.

    ``splits`` maps a split to its shard folders in stream order: names (``part-00000``) or
    paths directly under ``{cache_dir}/{split}`` (what ``Dataset.write_levanter_cache``
    returns). Splits without shards are left out. Returns the ledgers by split.
    """
    cache_dir = fs.normalize(cache_dir)
    ledgers: dict[str, dict[str, Any]] = {}
    for split, shards in splits.items():
        if not shards:
            continue
        split_dir = fs.join(cache_dir, split)
        names = []
        for shard in shards:
            if "/" not in shard:
                names.append(shard)
                continue
            parent, _, name = fs.normalize(shard).rstrip("/").rpartition("/")
            if parent != split_dir:
                raise ValueError(
                    f"finalize_cache: shard folder {shard} is not directly under {split_dir}; "
                    f"write the {split!r} shards to {split_dir}/part-{{shard:05d}}"
                )
            names.append(name)
        ledgers[split] = finalize_split(split_dir, names, dtype, eos_id)
    write_cache_stats(cache_dir, ledgers)
    return ledgers


def read_cache_stats(cache_dir: str) -> dict[str, Any] | None:
    return fs.read_json_or_none(fs.join(cache_dir, STATS_NAME))


def _read_npy_remote(path: str) -> np.ndarray:
    fs_, p = fs.url_to_fs(path)
    with fs_.open(p, "rb") as f:
        return np.load(f, allow_pickle=False)


def _load_npy(path: str) -> np.ndarray:
    if fs.is_local(path):
        return np.load(fs.url_to_fs(path)[1], mmap_mode="r", allow_pickle=False)
    return _read_npy_remote(path)


@dataclass
class _Shard:
    path: str
    num_tokens: int
    num_docs: int
    _ids: np.ndarray | None = None
    _offsets: np.ndarray | None = None

    @property
    def ids(self) -> np.ndarray:
        # Local: memory-mapped. Remote: read whole on first touch and kept,
        # since packed reads touch many small ranges of each shard.
        if self._ids is None:
            ids = _load_npy(fs.join(self.path, INPUT_IDS_NAME))
            if ids.ndim != 1 or ids.shape[0] != self.num_tokens:
                raise ValueError(
                    f"{self.path}/{INPUT_IDS_NAME} has shape {ids.shape}, the ledger says "
                    f"{self.num_tokens} tokens: the cache is corrupt, rebuild it"
                )
            self._ids = ids
        return self._ids

    @property
    def offsets(self) -> np.ndarray:
        if self._offsets is None:
            offsets = _load_npy(fs.join(self.path, OFFSETS_NAME))
            if offsets.shape != (self.num_docs + 1,):
                raise ValueError(
                    f"{self.path}/{OFFSETS_NAME} has shape {offsets.shape}, the ledger says "
                    f"{self.num_docs} documents: the cache is corrupt, rebuild it"
                )
            self._offsets = offsets
        return self._offsets


class TokenCache:
    """Read one split of a token cache: documents by index and packed sequences."""

    def __init__(self, split_dir: str, ledger: dict[str, Any]) -> None:
        self.path = split_dir
        self.ledger = ledger
        self.dtype: np.dtype = _canonical_dtype(ledger["dtype"])
        self.eos_id: int | None = ledger.get("eos_id")
        self.num_tokens: int = int(ledger["num_tokens"])
        self.num_docs: int = int(ledger["num_docs"])
        self.num_bytes: int = int(ledger.get("num_bytes", 0))
        names = list(ledger["shards"])
        tokens = ledger.get("shard_num_tokens")
        docs = ledger.get("shard_num_docs")
        if tokens is None or docs is None:
            # A ledger without per-shard counts: take them from the markers.
            markers = [fs.read_json(fs.join(split_dir, n, SUCCESS_NAME)) for n in names]
            tokens = [int(m["num_tokens"]) for m in markers]
            docs = [int(m["num_docs"]) for m in markers]
        self._shards = [
            _Shard(fs.join(split_dir, n), int(t), int(d))
            for n, t, d in zip(names, tokens, docs, strict=True)
        ]
        # Cumulative starts, with a final entry equal to the total.
        self._token_starts = np.concatenate([[0], np.cumsum(tokens, dtype=np.int64)]).astype(
            np.int64
        )
        self._doc_starts = np.concatenate([[0], np.cumsum(docs, dtype=np.int64)]).astype(np.int64)
        if (
            int(self._token_starts[-1]) != self.num_tokens
            or int(self._doc_starts[-1]) != self.num_docs
        ):
            raise ValueError(
                f"{split_dir}/{LEDGER_NAME}: per-shard counts do not add up to the totals"
            )

    @classmethod
    def open(cls, path: str, split: str = "train") -> TokenCache:
        """Open ``{path}/{split}`` (local path or fsspec URL such as gs://)."""
        split_dir = fs.join(fs.normalize(path), split)
        ledger_path = fs.join(split_dir, LEDGER_NAME)
        ledger = fs.read_json_or_none(ledger_path)
        if ledger is None:
            raise FileNotFoundError(
                f"no token cache split at {split_dir}: {ledger_path} is missing "
                "(the cache was never built, or the build did not finish; build or rerun it)"
            )
        if not ledger.get("finished"):
            raise RuntimeError(f"{ledger_path} is not marked finished; rerun the cache build")
        return cls(split_dir, ledger)

    # --- documents ---------------------------------------------------------

    def __len__(self) -> int:
        return self.num_docs

    def __getitem__(self, index: int) -> np.ndarray:
        i = int(index)
        if i < 0:
            i += self.num_docs
        if not 0 <= i < self.num_docs:
            raise IndexError(f"document {index} out of range for a cache of {self.num_docs}")
        s = int(np.searchsorted(self._doc_starts, i, side="right")) - 1
        shard = self._shards[s]
        local = i - int(self._doc_starts[s])
        lo, hi = int(shard.offsets[local]), int(shard.offsets[local + 1])
        return np.asarray(shard.ids[lo:hi])

    def __iter__(self) -> Iterator[np.ndarray]:
        for shard in self._shards:
            offsets = np.asarray(shard.offsets)
            ids = shard.ids
            for k in range(shard.num_docs):
                yield np.asarray(ids[offsets[k] : offsets[k + 1]])

    @property
    def num_shards(self) -> int:
        return len(self._shards)

    # --- packed sequences --------------------------------------------------

    def num_sequences(self, seq_len: int) -> int:
        """Sequences per epoch; the ``num_tokens % seq_len`` tail is dropped."""
        if seq_len <= 0:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        return self.num_tokens // seq_len

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the split's stream, as int32."""
        out = np.empty(stop - start, dtype=np.int32)
        s = int(np.searchsorted(self._token_starts, start, side="right")) - 1
        pos = start
        while pos < stop:
            shard_lo = int(self._token_starts[s])
            shard_hi = int(self._token_starts[s + 1])
            take = min(stop, shard_hi) - pos
            if take > 0:
                out[pos - start : pos - start + take] = self._shards[s].ids[
                    pos - shard_lo : pos - shard_lo + take
                ]
                pos += take
            s += 1
        return out

    def sequence_order(
        self, seq_len: int, seed: int, epoch: int, shuffle: bool = True
    ) -> np.ndarray:
        """The order sequences are visited in during ``epoch``."""
        n = self.num_sequences(seq_len)
        if not shuffle:
            return np.arange(n, dtype=np.int64)
        rng = np.random.Generator(np.random.PCG64([int(seed), int(epoch)]))
        return rng.permutation(n).astype(np.int64)

    def sequences(self, seq_indices: Sequence[int] | np.ndarray, seq_len: int) -> np.ndarray:
        """Sequences by index within an epoch, shape ``(len(seq_indices), seq_len)``, int32."""
        idx = np.asarray(seq_indices, dtype=np.int64)
        n = self.num_sequences(seq_len)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"sequence index out of range 0..{n - 1}")
        out = np.empty((idx.size, seq_len), dtype=np.int32)
        starts = idx * seq_len
        first = np.searchsorted(self._token_starts, starts, side="right") - 1
        last = np.searchsorted(self._token_starts, starts + seq_len - 1, side="right") - 1
        inside = first == last
        # Sequences inside one shard: one fancy-index gather per shard.
        for s in np.unique(first[inside]):
            rows = np.nonzero(inside & (first == s))[0]
            local = starts[rows] - self._token_starts[s]
            ids = self._shards[int(s)].ids
            if rows.size == 1:
                lo = int(local[0])
                out[rows[0]] = ids[lo : lo + seq_len]
            else:
                out[rows] = ids[local[:, None] + np.arange(seq_len, dtype=np.int64)[None, :]]
        # The few sequences that straddle shard boundaries.
        for r in np.nonzero(~inside)[0]:
            out[r] = self.tokens(int(starts[r]), int(starts[r]) + seq_len)
        return out

    def packed_sequences(
        self,
        seq_len: int,
        seed: int = 0,
        start: int = 0,
        *,
        shuffle: bool = True,
        epochs: int | None = None,
        block: int = 256,
    ) -> Iterator[np.ndarray]:
        """Packed ``seq_len`` int32 sequences, seeded and resumable.

        Position ``k`` (counting across epochs) is sequence
        ``order(epoch=k // n)[k % n]`` with ``n = num_sequences(seq_len)``, so an
        iterator started at ``start=k`` yields exactly what an uninterrupted one
        yields from position ``k``. ``epochs=None`` repeats forever; each epoch
        uses a fresh permutation from ``(seed, epoch)``. Reads ``block``
        sequences at a time with vectorized gathers.
        """
        for batch in self._packed_blocks(
            seq_len, block, seed, start, shuffle, epochs, allow_partial=True
        ):
            yield from batch

    def packed_batches(
        self,
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        start: int = 0,
        *,
        shuffle: bool = True,
        epochs: int | None = None,
    ) -> Iterator[np.ndarray]:
        """``(batch_size, seq_len)`` int32 arrays of the same stream as :meth:`packed_sequences`.

        ``start`` is a sequence position (not a batch index). A batch may span
        an epoch boundary; with ``epochs`` set, a final partial batch is dropped.
        """
        return self._packed_blocks(
            seq_len, batch_size, seed, start, shuffle, epochs, allow_partial=False
        )

    def _packed_blocks(
        self,
        seq_len: int,
        block: int,
        seed: int,
        start: int,
        shuffle: bool,
        epochs: int | None,
        allow_partial: bool,
    ) -> Iterator[np.ndarray]:
        n = self.num_sequences(seq_len)
        if n == 0:
            raise ValueError(
                f"the cache at {self.path} holds {self.num_tokens} tokens, fewer than one "
                f"sequence of {seq_len}; use a shorter seq_len or more data"
            )
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        if block <= 0:
            raise ValueError(f"batch size must be positive, got {block}")
        return self._iter_blocks(n, seq_len, block, seed, start, shuffle, epochs, allow_partial)

    def _iter_blocks(
        self,
        n: int,
        seq_len: int,
        block: int,
        seed: int,
        start: int,
        shuffle: bool,
        epochs: int | None,
        allow_partial: bool,
    ) -> Iterator[np.ndarray]:
        end = None if epochs is None else epochs * n
        pos = start
        order_epoch, order = -1, np.empty(0, dtype=np.int64)
        while end is None or pos < end:
            want = block if end is None else min(block, end - pos)
            if want < block and not allow_partial:
                return
            picks: list[np.ndarray] = []
            got = 0
            while got < want:
                epoch, k = divmod(pos, n)
                if epoch != order_epoch:
                    order_epoch, order = epoch, self.sequence_order(seq_len, seed, epoch, shuffle)
                take = min(want - got, n - k)
                picks.append(order[k : k + take])
                pos += take
                got += take
            yield self.sequences(np.concatenate(picks), seq_len)

    def close(self) -> None:
        """Drop the shards' arrays (memory maps close once no view is left)."""
        for shard in self._shards:
            shard._ids = None
            shard._offsets = None
