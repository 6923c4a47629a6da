"""Readers: files (local or any fsspec URL) to records or Arrow record batches.

Record readers keep each record exactly as written (json.loads per line), so a
record missing a field stays missing. Batch readers go through Arrow's C++
parsers for vectorized pipelines (`map_batches`, Parquet in, Parquet out).
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from marin_dagster import fs

BATCH_ROWS = 8192
_JSON_BLOCK = 8 << 20


@dataclass
class Cursor:
    """Where a task is in its input, for error messages: file and record index."""

    file: str | None = None
    position: int = -1

    def describe(self) -> str:
        where = f"record {self.position}" if self.position >= 0 else "before the first record"
        return f"{where} of {self.file}" if self.file else where


def detect_format(path: str) -> str:
    name = path.lower()
    for suffix in (".gz", ".zst", ".zstd", ".bz2", ".xz"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith((".csv", ".tsv")):
        return "csv"
    raise ValueError(f"cannot tell the format of {path!r} from its extension; use load_jsonl(), "
                     "load_parquet() or load_csv() instead of load_file()")


def compression_of(path: str) -> str | None:
    name = path.lower()
    if name.endswith(".gz"):
        return "gzip"
    if name.endswith((".zst", ".zstd")):
        return "zstd"
    if name.endswith(".bz2"):
        return "bz2"
    if name.endswith(".xz"):
        return "xz"
    return None


@contextlib.contextmanager
def open_input(path: str) -> Iterator[IO[bytes]]:
    """A binary, decompressed stream of `path`."""
    filesystem, fs_path = fs.url_to_fs(path)
    with filesystem.open(fs_path, "rb") as raw:
        comp = compression_of(path)
        if comp == "gzip":
            import gzip

            with gzip.GzipFile(fileobj=raw) as f:
                yield f
        elif comp == "zstd":
            import zstandard

            with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as f:
                yield io.BufferedReader(f, 1 << 20)
        elif comp is not None:
            import fsspec.compression

            with fsspec.compression.compr[comp](raw, mode="rb") as f:
                yield f
        else:
            yield raw


try:  # orjson, where installed, parses JSON lines about 3x faster than the stdlib.
    import orjson

    _loads = orjson.loads
    _DecodeError: tuple[type[Exception], ...] = (orjson.JSONDecodeError,)
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads
    _DecodeError = (json.JSONDecodeError,)


def iter_jsonl(path: str, cursor: Cursor | None = None) -> Iterator[Any]:
    with open_input(path) as f:
        index = -1
        for lineno, line in enumerate(f, 1):
            try:
                rec = _loads(line)
            except _DecodeError:
                if not line.strip():
                    continue  # blank lines are allowed
                try:  # what orjson rejects but the stdlib reads (integers over 64 bits, NaN)
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: line {lineno}: invalid JSON ({e.msg} at column "
                                     f"{e.colno}); fix or remove that line") from None
            index += 1
            if cursor is not None:
                cursor.file, cursor.position = path, index
            yield rec


def _jsonl_batches_python(path: str, skip: int) -> Iterator[pa.RecordBatch]:
    rows: list[Any] = []
    for i, rec in enumerate(iter_jsonl(path)):
        if i < skip:
            continue
        rows.append(rec)
        if len(rows) >= BATCH_ROWS:
            yield pa.RecordBatch.from_pylist(rows)
            rows = []
    if rows:
        yield pa.RecordBatch.from_pylist(rows)


def iter_jsonl_batches(path: str) -> Iterator[pa.RecordBatch]:
    """JSONL as record batches via Arrow's parser.

    Arrow's streaming reader fixes the schema from the first block; if a later
    block disagrees, the rest of the file is read record by record instead.
    """
    done = 0
    try:
        with open_input(path) as f:
            reader = pajson.open_json(f, read_options=pajson.ReadOptions(block_size=_JSON_BLOCK))
            for batch in reader:
                yield batch
                done += batch.num_rows
        return
    except pa.ArrowInvalid:
        pass
    yield from _jsonl_batches_python(path, done)


def iter_parquet_batches(path: str, columns: list[str] | None = None,
                         row_groups: list[int] | None = None) -> Iterator[pa.RecordBatch]:
    filesystem, fs_path = fs.url_to_fs(path)
    with filesystem.open(fs_path, "rb") as f:
        pf = pq.ParquetFile(f)
        groups = row_groups if row_groups is not None else list(range(pf.num_row_groups))
        if not groups:
            return
        yield from pf.iter_batches(batch_size=BATCH_ROWS, row_groups=groups, columns=columns)


def iter_csv_batches(path: str, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    with open_input(path) as f:
        convert = pacsv.ConvertOptions(include_columns=columns) if columns else None
        try:
            reader = pacsv.open_csv(f, convert_options=convert)
        except pa.ArrowInvalid as e:
            if "Empty CSV file" in str(e):
                return
            raise ValueError(f"{path}: cannot read CSV: {e}") from None
        yield from reader


def parquet_row_group_splits(path: str, approx_shard_bytes: int) -> list[list[int]]:
    """Row-group index lists of about approx_shard_bytes each (never splitting a group)."""
    filesystem, fs_path = fs.url_to_fs(path)
    with filesystem.open(fs_path, "rb") as f:
        meta = pq.ParquetFile(f).metadata
    splits: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in range(meta.num_row_groups):
        rg_bytes = meta.row_group(i).total_byte_size
        if current and size + rg_bytes > approx_shard_bytes:
            splits.append(current)
            current, size = [], 0
        current.append(i)
        size += rg_bytes
    if current or not splits:
        splits.append(current)
    return splits


def iter_file_batches(path: str, fmt: str, columns: list[str] | None = None,
                      row_groups: list[int] | None = None) -> Iterator[pa.RecordBatch]:
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == "jsonl":
        for batch in iter_jsonl_batches(path):
            yield batch.select(columns) if columns else batch
    elif fmt == "parquet":
        yield from iter_parquet_batches(path, columns, row_groups)
    elif fmt == "csv":
        yield from iter_csv_batches(path, columns)
    else:
        raise ValueError(f"unknown file format {fmt!r} for {path}")


def iter_file_records(path: str, fmt: str, columns: list[str] | None = None,
                      row_groups: list[int] | None = None,
                      cursor: Cursor | None = None) -> Iterator[Any]:
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == "jsonl":
        if columns:
            for rec in iter_jsonl(path, cursor):
                yield {c: rec.get(c) for c in columns}
        else:
            yield from iter_jsonl(path, cursor)
        return
    index = 0
    for batch in iter_file_batches(path, fmt, columns, row_groups):
        for rec in batch.to_pylist():
            if cursor is not None:
                cursor.file, cursor.position = path, index
            index += 1
            yield rec
