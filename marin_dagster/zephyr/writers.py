"""Writers: one output file per shard, each written atomically (marin_dagster.fs).

A writer takes a shard's stream, either records or Arrow record batches, and
returns what it wrote. A killed writer leaves only a temporary name behind,
never a file under the final name.
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from marin_dagster import fs
from marin_dagster.words import a_type
from marin_dagster.zephyr.readers import compression_of, csv_delimiter

PARQUET_ROWS = 65536
PARQUET_BUFFER_BYTES = 32 << 20


@dataclass
class WriteResult:
    path: str
    records: int
    bytes: int


def format_shard_path(
    pattern: str | Callable[[int, int], str],
    shard_idx: int,
    total: int,
    basename: str | None = None,
) -> str:
    """Fill {shard}, {total} and {basename} in an output pattern (Marin's placeholders)."""
    if callable(pattern):
        return pattern(shard_idx, total)
    if total > 1 and "{shard" not in pattern and "{basename" not in pattern:
        raise ValueError(
            f"output pattern {pattern!r} has no {{shard}} placeholder but the dataset "
            f"has {total} shards, so they would overwrite each other; add e.g. "
            "'-{shard:05d}-of-{total:05d}' to the file name, or reshard(1)"
        )
    try:
        out = pattern.format(
            shard=shard_idx, total=total, basename=basename or f"shard_{shard_idx}"
        )
    except (KeyError, IndexError) as e:
        raise ValueError(
            f"output pattern {pattern!r} uses an unknown placeholder {e}; "
            "the placeholders are {shard}, {total} and {basename}"
        ) from None
    return fs.normalize(out)


class _CountingFile(io.RawIOBase):
    """Counts bytes on their way to the real file (for bytes_written)."""

    def __init__(self, f: IO[bytes]):
        self._f = f
        self.count = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        n = self._f.write(b)
        n = len(b) if n is None else n
        self.count += n
        return n

    def flush(self) -> None:
        self._f.flush()


@contextlib.contextmanager
def _compressed_output(path: str) -> Iterator[tuple[IO[bytes], _CountingFile]]:
    with fs.atomic_write(path, "wb") as raw:
        counted = _CountingFile(raw)
        comp = compression_of(path)
        if comp == "gzip":
            import gzip

            # Level 6 costs ~3x level 1 for a few percent smaller files.
            with gzip.GzipFile(fileobj=counted, mode="wb", compresslevel=1, mtime=0) as g:
                yield g, counted
        elif comp == "zstd":
            import zstandard

            with zstandard.ZstdCompressor(level=3).stream_writer(counted, closefd=False) as z:
                yield z, counted
        elif comp == "bz2":
            import bz2

            # Read as input, so written too: dedup writes each file back as it came.
            with bz2.BZ2File(counted, "wb") as b:
                yield b, counted
        elif comp == "xz":
            import lzma

            with lzma.LZMAFile(counted, "wb") as x:
                yield x, counted
        elif comp is None:
            buffered = io.BufferedWriter(counted, 1 << 20)
            yield buffered, counted
            buffered.flush()


def _records(stream: Iterator[Any], batches: bool) -> Iterator[Any]:
    if not batches:
        yield from stream
        return
    for batch in stream:
        yield from batch.to_pylist()


def write_jsonl(path: str, stream: Iterator[Any], batches: bool = False) -> WriteResult:
    n = 0
    with _compressed_output(path) as (f, counted):
        dumps = json.JSONEncoder(ensure_ascii=False).encode
        lines: list[str] = []
        for rec in _records(stream, batches):
            lines.append(dumps(rec))
            n += 1
            if len(lines) >= 1024:
                f.write(_utf8_lines(lines))
                lines = []
        if lines:
            f.write(_utf8_lines(lines))
    return WriteResult(path, n, counted.count)


def _utf8_lines(lines: list[str]) -> bytes:
    try:
        return ("\n".join(lines) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        # A string holding a lone surrogate (a JSON "\ud800" escape decodes to one) has
        # no UTF-8 form; its line is written with JSON escapes instead, which read back
        # as the same string. Only the lines that need it pay for the re-encoding.
        out = []
        for text in lines:
            try:
                out.append(text.encode("utf-8"))
            except UnicodeEncodeError:
                value = json.loads(text)
                out.append(json.dumps(value, ensure_ascii=True).encode("ascii"))
        return b"\n".join(out) + b"\n"


def write_csv(path: str, stream: Iterator[Any], batches: bool = False) -> WriteResult:
    n = 0
    with _compressed_output(path) as (f, counted):
        text = io.TextIOWrapper(f, encoding="utf-8", newline="")
        writer: csv.DictWriter | None = None
        for rec in _records(stream, batches):
            if not isinstance(rec, dict):
                raise TypeError(
                    f"write_csv {path}: record {n} is {a_type(rec)}, not a "
                    "dict; map records to dicts before writing CSV"
                )
            if writer is None:
                writer = csv.DictWriter(text, fieldnames=list(rec), delimiter=csv_delimiter(path))
                writer.writeheader()
            extra = set(rec) - set(writer.fieldnames)
            if extra:
                raise ValueError(
                    f"write_csv {path}: record {n} has field(s) {sorted(extra)} that "
                    f"the header {writer.fieldnames} (from the first record) lacks; "
                    "give every record the same fields"
                )
            writer.writerow(rec)
            n += 1
        text.flush()
        text.detach()
    return WriteResult(path, n, counted.count)


class SchemaConflictError(ValueError):
    """A field holds values of incompatible types across records."""


def _column(values: list[Any], field: str, first_index: int, path: str) -> pa.Array:
    # Inferred from the values alone; the sink widens or rejects against the file's schema.
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        # Find the first record whose value breaks the type of the ones before it.
        for i in range(1, len(values)):
            try:
                pa.array(values[: i + 1])
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                raise SchemaConflictError(
                    f"write_parquet {path}: field {field!r} of record {first_index + i} is "
                    f"{type(values[i]).__name__} {values[i]!r:.80}, which does not fit the type of "
                    f"the same field in earlier records; give the field one type (or pass schema=)"
                ) from None
        raise SchemaConflictError(f"write_parquet {path}: field {field!r}: {e}") from None


def _table_from_records(
    records: list[Any], schema: pa.Schema | None, first_index: int, path: str
) -> pa.Table:
    if records and isinstance(records[0], dict):
        # Uniform records (the common case), checked and split into columns in C: every
        # record holds each of the first record's keys (or itemgetter raises) and no other
        # (the key counts add up). Arrow's converter names no field on a conflict, so any
        # failure falls through to the column-by-column path below, which does.
        keys = list(records[0])
        try:
            if sum(map(len, records)) == len(keys) * len(records):
                columns = [pa.array(list(map(itemgetter(k), records))) for k in keys]
                return pa.Table.from_arrays(columns, names=keys)
        except (KeyError, TypeError, pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
    names: dict[str, None] = dict.fromkeys(schema.names) if schema is not None else {}
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise TypeError(
                f"write_parquet {path}: record {first_index + i} is a "
                f"{type(rec).__name__}, not a dict; map records to dicts first"
            )
        if len(rec) != len(names) or any(k not in names for k in rec):
            names.update(dict.fromkeys(rec))
    arrays = [_column([r.get(name) for r in records], name, first_index, path) for name in names]
    return pa.Table.from_arrays(arrays, names=list(names))


def _widen(current: pa.Schema, new: pa.Schema, path: str) -> pa.Schema:
    try:
        return pa.unify_schemas([current, new], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        for f in new:
            if f.name in current.names:
                old = current.field(f.name).type
                try:
                    pa.unify_schemas(
                        [pa.schema([current.field(f.name)]), pa.schema([f])],
                        promote_options="permissive",
                    )
                except (pa.ArrowInvalid, pa.ArrowTypeError):
                    raise SchemaConflictError(
                        f"write_parquet {path}: field {f.name!r} is {old} in earlier records but "
                        f"{f.type} in later ones; give the field one type (or pass schema=)"
                    ) from None
        raise SchemaConflictError(f"write_parquet {path}: {e}") from None


class _ParquetSink:
    """A Parquet file whose schema can widen: on a wider batch, rewrite what was written."""

    def __init__(self, local_path: str, schema: pa.Schema | None, fixed: bool, out_path: str):
        self.local_path = local_path
        self.schema = schema
        self.fixed = fixed
        self.out_path = out_path
        self.writer: pq.ParquetWriter | None = None
        self.rows = 0

    def _open(self) -> None:
        self.writer = pq.ParquetWriter(self.local_path, self.schema, compression="zstd")

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0 and self.schema is not None:
            return
        if self.schema is None:
            self.schema = table.schema
        elif not table.schema.equals(self.schema):
            if self.fixed:
                try:
                    table = table.select([n for n in self.schema.names if n in table.column_names])
                    table = _conform(table, self.schema)
                except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as e:
                    raise SchemaConflictError(
                        f"write_parquet {self.out_path}: records do not fit the given schema: {e}"
                    ) from None
            else:
                wider = _widen(self.schema, table.schema, self.out_path)
                if not wider.equals(self.schema):
                    self._rewrite(wider)
                table = _conform(table, self.schema)
        if self.writer is None:
            self._open()
        self.writer.write_table(table)
        self.rows += table.num_rows

    def _rewrite(self, wider: pa.Schema) -> None:
        self.schema = wider
        if self.writer is None:
            return
        self.writer.close()
        self.writer = None
        previous = self.local_path + ".narrow"
        os.replace(self.local_path, previous)
        try:
            self._open()
            pf = pq.ParquetFile(previous)
            for i in range(pf.num_row_groups):
                self.writer.write_table(_conform(pf.read_row_group(i), wider))
            del pf
        finally:
            os.remove(previous)

    def close(self) -> None:
        if self.writer is None:
            self.schema = self.schema or pa.schema([])
            self._open()
        self.writer.close()


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    columns = []
    for f in schema:
        if f.name in table.column_names:
            col = table.column(f.name)
            columns.append(col if col.type == f.type else col.cast(f.type))
        else:
            columns.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def write_parquet(
    path: str, stream: Iterator[Any], batches: bool = False, schema: pa.Schema | None = None
) -> WriteResult:
    """zstd Parquet; without `schema`, inferred from the records and widened as needed."""
    # Written in place under a temporary name (beside a local target: no copy).
    with fs.atomic_path(path) as local:
        sink = _ParquetSink(local, schema, schema is not None, path)
        if batches:
            for batch in stream:
                table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
                sink.write(table)
        else:
            from marin_dagster.zephyr.chunks import approx_size

            # Pulled 64 records at a time (the stream is advanced in C, not record by
            # record here); the buffer's size is estimated from each run's first record.
            buf: list[Any] = []
            est = 0
            while run := list(itertools.islice(stream, min(64, PARQUET_ROWS - len(buf)))):
                buf += run
                est += len(run) * approx_size(run[0])
                if len(buf) >= PARQUET_ROWS or est >= PARQUET_BUFFER_BYTES:
                    sink.write(_table_from_records(buf, sink.schema, sink.rows, path))
                    buf, est = [], 0
            if buf or sink.writer is None:
                sink.write(_table_from_records(buf, sink.schema, sink.rows, path))
        sink.close()
        size = os.path.getsize(local)
    return WriteResult(path, sink.rows, size)


def _task_counters() -> dict[str, int | float]:
    from marin_dagster.zephyr import counters

    return {k: int(v) if float(v).is_integer() else v for k, v in counters.get_counters().items()}


def write_levanter_cache(
    path: str, stream: Iterator[Any], batches: bool = False, dtype: str = "uint16"
) -> WriteResult:
    """One token-cache shard folder (tokenize/cache.py): ids, offsets, then `.success`.

    A record is a document: a 1-D sequence of token ids, or a dict with `input_ids` and
    optionally `num_bytes`. The marker also holds the task's user counters at the end of
    the shard, so whoever skips the finished shard later can still report them.
    """
    # Imported here: the tokenize package imports Zephyr (its build is a Zephyr pipeline).
    from marin_dagster.tokenize.cache import TokenCacheShardWriter

    writer = TokenCacheShardWriter(path, dtype=dtype)
    with writer:
        for n, rec in enumerate(_records(stream, batches)):
            if isinstance(rec, dict):
                if "input_ids" not in rec:
                    raise KeyError(
                        f"write_levanter_cache({path}): record {n} has no 'input_ids' "
                        f"(its keys: {sorted(rec)}); give token ids or a dict with input_ids"
                    )
                writer.add(rec["input_ids"], num_bytes=int(rec.get("num_bytes", 0) or 0))
            else:
                writer.add(rec)
        writer.finish(_task_counters())
    return WriteResult(path, writer.num_docs, writer.bytes_written)


WRITERS = {"jsonl": write_jsonl, "csv": write_csv}


def write_shard(op: Any, path: str, stream: Iterator[Any], batches: bool) -> WriteResult:
    """Write one shard with `op`'s writer (a WriteOp)."""
    if op.writer_type == "parquet":
        return write_parquet(path, stream, batches, op.schema)
    if op.writer_type == "levanter_cache":
        return write_levanter_cache(path, stream, batches, op.dtype or "uint16")
    if op.writer_type in WRITERS:
        return WRITERS[op.writer_type](path, stream, batches)
    raise ValueError(f"unknown writer {op.writer_type!r}")


def done_path(op: Any, path: str) -> str:
    """The file whose presence means a shard written by `op` is finished (skip_existing):
    the output file itself, or a cache shard folder's `.success` (written after its
    arrays, so a killed writer's folder never counts as done)."""
    if op.writer_type == "levanter_cache":
        from marin_dagster.tokenize.cache import SUCCESS_NAME

        return fs.join(path, SUCCESS_NAME)
    return path
