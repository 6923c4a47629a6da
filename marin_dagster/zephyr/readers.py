"""Readers: files (local or any fsspec URL) to records or Arrow record batches.

Record readers keep each record exactly as written (json.loads per line), so a
record missing a field stays missing. Batch readers go through Arrow's C++
parsers for vectorized pipelines (`map_batches`, Parquet in, Parquet out).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import zlib
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


class InputError(ValueError):
    """An input file that cannot be read as it is: truncated, corrupt, or not valid UTF-8.

    The message names the file (and for JSON lines and CSV, the 1-based line).
    Retrying cannot fix the file, so a shard that raises it fails at once.
    """


@dataclass
class Cursor:
    """Where a task is in its input, for error messages: file, record index and (JSONL) line."""

    file: str | None = None
    position: int = -1
    line: int = 0  # the 1-based line of the current JSONL record; 0 where lines are not counted

    def start(self, file: str | None) -> None:
        self.file, self.position, self.line = file, -1, 0

    def describe(self) -> str:
        if self.line > 0 and self.file:
            return f"line {self.line} of {self.file} (record {self.position} of that file, from 0)"
        if self.file:
            where = f"record {self.position}" if self.position >= 0 else "before the first record"
            return f"{where} of {self.file}"
        # an in-memory input (from_list, a shuffle's partition): an item, which may itself be a
        # file a task reads, whose own error then names its record
        return f"item {self.position} of its input" if self.position >= 0 else "its start"


def _uncompressed_name(path: str) -> str:
    """`path`, lower-cased, without a compression suffix: what says its format."""
    name = path.lower()
    for suffix in (".gz", ".zst", ".zstd", ".bz2", ".xz"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def detect_format(path: str) -> str:
    name = _uncompressed_name(path)
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith((".csv", ".tsv")):
        return "csv"
    raise ValueError(
        f"cannot tell the format of {path!r} from its extension; use load_jsonl(), "
        "load_parquet() or load_csv() instead of load_file()"
    )


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


# Compressed bytes fed to the decompressor at a time: adapted so that each step gives
# about _OUT_SIZE decompressed bytes (a highly compressible file gives many MB per KB).
_READ_SIZE = 1 << 17
_OUT_SIZE = 1 << 20
_INCOMPLETE = "the file is incomplete: re-download or regenerate it"


def _decompressor(codec: str) -> Any:
    if codec == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip header and trailer (CRC, size)
    if codec == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj()
    if codec == "bz2":
        import bz2

        return bz2.BZ2Decompressor()
    if codec == "xz":
        import lzma

        return lzma.LZMADecompressor()
    raise ValueError(f"unknown compression {codec!r}")


class _Decompressed(io.RawIOBase):
    """The decompressed bytes of a gzip, zstd, bz2 or xz file; a truncated or corrupt one raises.

    The library readers do not all say when a file stops early: zstandard's
    stream reader ends quietly in the middle of a frame (a truncated file reads
    as a shorter one), gzip raises a bare EOFError naming no file. Here each
    compressed member (gzip member, zstd frame, bz2 or xz stream) must end
    before the input does, or InputError names the file. Concatenated members
    are read one after another; zero bytes after a gzip member are padding.
    """

    def __init__(self, raw: IO[bytes], path: str, codec: str):
        self._raw, self._path, self._codec = raw, path, codec
        self._member: Any = None  # the decompressor of the member being read
        self._view = memoryview(b"")
        self._pos = 0
        self._consumed = 0  # compressed bytes read so far
        self._read_size = _READ_SIZE
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while self._pos >= len(self._view):
            if self._done:
                return 0
            self._fill()
        n = min(len(b), len(self._view) - self._pos)
        b[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def _error(self, what: str) -> InputError:
        return InputError(
            f"{self._path}: truncated or corrupt {self._codec} stream ({what}); " + _INCOMPLETE
        )

    def _fill(self) -> None:
        data = self._raw.read(self._read_size)
        if not data:
            self._done = True
            if self._member is not None:
                raise self._error(
                    f"the data ends inside a compressed {self._codec} stream, "
                    f"after {self._consumed} bytes"
                )
            if self._consumed == 0:
                raise self._error("the file is empty; even a compressed empty file has a header")
            self._view, self._pos = memoryview(b""), 0
            return
        self._consumed += len(data)
        out = []
        try:
            while data:
                if self._member is None:
                    if self._codec == "gzip":
                        data = data.lstrip(b"\0")
                        if not data:
                            break
                    self._member = _decompressor(self._codec)
                out.append(self._member.decompress(data))
                if not self._member.eof:
                    break
                data = self._member.unused_data
                self._member = None
        except Exception as e:  # zlib.error, zstandard.ZstdError, OSError, lzma.LZMAError, EOFError
            raise self._error(
                f"{type(e).__name__}: {e}, within the first {self._consumed} bytes"
            ) from None
        chunk = out[0] if len(out) == 1 else b"".join(out)
        if len(chunk) > 4 * _OUT_SIZE:
            self._read_size = max(1 << 10, self._read_size // 4)
        elif len(chunk) < _OUT_SIZE // 4 and self._read_size < _READ_SIZE:
            self._read_size *= 2
        self._view = memoryview(chunk)
        self._pos = 0


@contextlib.contextmanager
def open_input(path: str) -> Iterator[IO[bytes]]:
    """A binary, decompressed stream of `path` (compression from its extension).

    A truncated or corrupt compressed file raises InputError naming it, never
    reads as a shorter file.
    """
    with fs.open_read(path) as raw:
        comp = compression_of(path)
        if comp is None:
            f = _past_bom(raw)
            # A compressed file under a plain name: a .csv of gzip bytes read as no records.
            error = compressed_error(path, f.peek(8)[:8] if hasattr(f, "peek") else b"")
            if error is not None:
                raise error
            yield f
        else:
            with io.BufferedReader(_Decompressed(raw, path, comp), 1 << 20) as f:
                yield _past_bom(f)


_BOM = b"\xef\xbb\xbf"


def _past_bom(f: IO[bytes]) -> IO[bytes]:
    """`f` past a UTF-8 byte order mark, which editors on Windows put before text and JSON
    parsers refuse as a broken first line. No format read here starts with those bytes
    (Parquet starts with PAR1), so for any other file nothing is consumed."""
    if hasattr(f, "peek"):
        if f.peek(3)[:3] == _BOM:
            f.read(3)
        return f
    head = f.read(3)
    if head == _BOM:
        return f
    try:
        f.seek(0)
        return f
    except ValueError:  # a stream that cannot go back (HTTP without ranges): its head first
        return io.BufferedReader(_Prepended(head, f))


class _Prepended(io.RawIOBase):
    """`head`, then the rest of `f`."""

    def __init__(self, head: bytes, f: IO[bytes]):
        self._head, self._f = head, f

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self._head[: len(b)] if self._head else self._f.read(len(b))
        self._head = self._head[len(data) :] if self._head else b""
        b[: len(data)] = data
        return len(data)


try:  # orjson, where installed, parses JSON lines about 3x faster than the stdlib.
    import orjson

    _loads = orjson.loads
    _DecodeError: tuple[type[Exception], ...] = (orjson.JSONDecodeError,)
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads
    _DecodeError = (json.JSONDecodeError,)


# A compressed file under a plain name reads as bytes that are not UTF-8: say what it is.
_MAGIC = {
    b"\x1f\x8b": ".gz",
    b"\x28\xb5\x2f\xfd": ".zst",
    b"BZh": ".bz2",
    b"\xfd7zXZ": ".xz",
}


def compressed_suffix(head: bytes) -> str | None:
    """The suffix of the compression whose magic bytes `head` starts with, or None."""
    return next((suffix for magic, suffix in _MAGIC.items() if head.startswith(magic)), None)


def compressed_error(path: str, head: bytes) -> InputError | None:
    """The error for a compressed file whose name does not say so, or None."""
    suffix = compressed_suffix(head)
    if suffix is None:
        return None
    return InputError(
        f"{path} is {suffix[1:]}-compressed, but its name says plain text: name it "
        f"{path.rsplit('/', 1)[-1]}{suffix}, so that it is decompressed as read"
    )


def _bad_line(path: str, lineno: int, line: bytes) -> Any:
    """A line orjson rejects: the stdlib's value (integers over 64 bits, NaN), or InputError."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{path}: line {lineno}: invalid UTF-8 at byte {e.start} of the line "
            f"({e.reason}); JSON lines must be UTF-8: re-encode the file "
            "(e.g. from Latin-1) or fix that line"
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        what = f"{e.msg.removesuffix(' at')} at column {e.colno}"
        if e.msg.startswith("Unterminated string") or (
            e.msg.startswith("Invalid control character") and not text[e.pos :].strip()
        ):
            # The line's own end, read as part of a string: the stdlib calls the newline a
            # control character.
            what = "a string is left open: no closing quote before the end of the line"
        raise InputError(
            f"{path}: line {lineno}: invalid JSON ({what}); fix or remove that line"
        ) from None


def iter_jsonl(
    path: str, cursor: Cursor | None = None, bad: list[InputError] | None = None
) -> Iterator[Any]:
    """The records of a JSON lines file; blank lines are skipped.

    With `cursor`, its position is the record's index and its line the
    record's 1-based line number (a bad line raises InputError naming both).
    With `bad`, a bad line's InputError is appended there and the line skipped.
    """
    with open_input(path) as f:
        index = -1
        for lineno, line in enumerate(f, 1):
            try:
                rec = _loads(line)
            except _DecodeError:
                if not line.strip():
                    continue  # blank lines are allowed
                if cursor is not None:
                    cursor.file, cursor.position, cursor.line = path, index + 1, lineno
                try:
                    rec = _bad_line(path, lineno, line)
                except InputError as e:
                    if bad is None:
                        raise
                    bad.append(e)
                    index += 1
                    continue
            index += 1
            if cursor is not None:
                cursor.file, cursor.position, cursor.line = path, index, lineno
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
                # Arrow's JSON parser does not check UTF-8: invalid bytes fail here and the
                # line reader below names the line.
                batch.validate(full=True)
                yield batch
                done += batch.num_rows
        return
    except pa.ArrowInvalid:
        pass
    yield from _jsonl_batches_python(path, done)


def _parquet_error(path: str, e: Exception) -> InputError:
    return InputError(
        f"{path}: cannot read Parquet ({type(e).__name__}: {e}); the file is not a "
        "complete Parquet file (truncated or corrupt?): re-download or regenerate it"
    )


class _WatchedFile:
    """A file that remembers whether a read failed.

    Arrow raises a corrupt Parquet file as a plain OSError (its ArrowIOError),
    the same class as a failed read from storage; the second may be transient
    (retried), the first is the file's (InputError).
    """

    def __init__(self, f: IO[bytes]):
        self._f = f
        self.read_failed = False

    def read(self, *args: Any) -> bytes:
        try:
            return self._f.read(*args)
        except BaseException:
            self.read_failed = True
            raise

    def readinto(self, b: Any) -> int | None:
        try:
            return self._f.readinto(b)
        except BaseException:
            self.read_failed = True
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


@contextlib.contextmanager
def _parquet_file(path: str) -> Iterator[tuple[pq.ParquetFile, _WatchedFile]]:
    with fs.open_read(path) as raw:
        f = _WatchedFile(raw)
        try:
            yield pq.ParquetFile(f), f
        except (pa.ArrowException, OSError) as e:
            if f.read_failed:
                raise  # the storage's error, not the file's
            raise _parquet_error(path, e) from None


def iter_parquet_batches(
    path: str, columns: list[str] | None = None, row_groups: list[int] | None = None
) -> Iterator[pa.RecordBatch]:
    """A Parquet file's batches; a truncated or corrupt file (or invalid UTF-8 in a string
    column) raises InputError naming it."""
    with _parquet_file(path) as (pf, _):
        if columns:
            # Arrow leaves out a column the file lacks: a misspelt name gave empty records.
            names = pf.schema_arrow.names
            missing = [c for c in columns if c not in names and c.split(".")[0] not in names]
            if missing:
                raise InputError(
                    f"{path}: no column {', '.join(map(repr, missing))}; its columns: "
                    f"{', '.join(names)}"
                )
        groups = row_groups if row_groups is not None else list(range(pf.num_row_groups))
        if not groups:
            return
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=groups, columns=columns):
            batch.validate(full=True)  # without page checksums, corruption can reach the strings
            yield batch


def _first_invalid_utf8_line(path: str) -> tuple[int, int] | None:
    """`(1-based line, byte in the line)` of the first invalid UTF-8 in `path` (error path only)."""
    with open_input(path) as f:
        for lineno, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                return lineno, e.start
    return None


# Arrow parses a CSV a block at a time, and a record must fit in one: its default of 1 MiB
# refused a document of a few MB ("straddling object straddles two block boundaries").
CSV_BLOCK = 16 << 20


def _csv_error(path: str, e: Exception) -> InputError:
    """The error for a CSV file Arrow refuses; invalid UTF-8 anywhere is named first, by line."""
    where = _first_invalid_utf8_line(path)
    if where is not None:
        return InputError(
            f"{path}: line {where[0]}: invalid UTF-8 at byte {where[1]} of the "
            "line; CSV files must be UTF-8: re-encode the file (e.g. from "
            "Latin-1) or fix that line"
        )
    if "straddl" in str(e):  # Arrow's advice, "increase block size", is no setting of ours
        return InputError(
            f"{path}: a CSV record too long for Arrow's reader (blocks of {CSV_BLOCK >> 20} "
            "MiB); write such documents as JSON lines (.jsonl), which have no such limit"
        )
    return InputError(f"{path}: cannot read CSV: {e}")


def csv_delimiter(path: str) -> str:
    """A tab for `.tsv` (plain or compressed), else a comma."""
    return "\t" if _uncompressed_name(path).endswith(".tsv") else ","


def csv_header(path: str) -> list[str] | None:
    """The names a CSV's first line gives its columns, or None for an empty file."""
    with open_input(path) as f:
        text = io.TextIOWrapper(f, encoding="utf-8", newline="")
        try:
            return next(csv.reader(text, delimiter=csv_delimiter(path)), None)
        except (UnicodeDecodeError, csv.Error) as e:
            raise _csv_error(path, e) from None


def iter_csv_batches(
    path: str, columns: list[str] | None = None, as_text: bool = False
) -> Iterator[pa.RecordBatch]:
    """A CSV file's batches. `as_text`: every value the string the file holds, as the steps
    that write a CSV back (dedup) or read its text need: inferred types turned "007" into 7,
    "NA" into null and "true" into True."""
    convert = pacsv.ConvertOptions(include_columns=columns) if columns else None
    if as_text:
        header = csv_header(path)
        if not header:
            return
        convert = pacsv.ConvertOptions(
            include_columns=columns or [],
            column_types={name: pa.string() for name in header},
            null_values=[],
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        )
    with open_input(path) as f:
        try:
            reader = pacsv.open_csv(
                f,
                read_options=pacsv.ReadOptions(block_size=CSV_BLOCK),
                # A quoted value may hold newlines (a document's paragraphs): without this, one
                # that crossed a block boundary was cut there ("Expected 2 columns, got 1").
                parse_options=pacsv.ParseOptions(
                    delimiter=csv_delimiter(path), newlines_in_values=True
                ),
                convert_options=convert,
            )
        except pa.ArrowInvalid as e:
            if "Empty CSV file" in str(e):
                return
            raise _csv_error(path, e) from None
        except pa.ArrowException as e:
            raise _csv_error(path, e) from None
        if any(pa.types.is_binary(t) for t in reader.schema.types):
            # Arrow infers binary, not string, for a column of invalid UTF-8 in its first block.
            raise _csv_error(path, pa.ArrowInvalid("invalid UTF8 data"))
        try:
            yield from reader
        except pa.ArrowException as e:  # e.g. invalid UTF-8 in a later block
            raise _csv_error(path, e) from None


def parquet_row_group_splits(path: str, approx_shard_bytes: int) -> list[list[int]]:
    """Row-group index lists of about approx_shard_bytes each (never splitting a group)."""
    with _parquet_file(path) as (pf, _):
        meta = pf.metadata
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


def iter_file_batches(
    path: str,
    fmt: str,
    columns: list[str] | None = None,
    row_groups: list[int] | None = None,
    csv_as_text: bool = False,
) -> Iterator[pa.RecordBatch]:
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == "jsonl":
        for batch in iter_jsonl_batches(path):
            yield batch.select(columns) if columns else batch
    elif fmt == "parquet":
        yield from iter_parquet_batches(path, columns, row_groups)
    elif fmt == "csv":
        yield from iter_csv_batches(path, columns, as_text=csv_as_text)
    else:
        raise ValueError(f"unknown file format {fmt!r} for {path}")


def iter_file_records(
    path: str,
    fmt: str,
    columns: list[str] | None = None,
    row_groups: list[int] | None = None,
    cursor: Cursor | None = None,
    csv_as_text: bool = False,
) -> Iterator[Any]:
    """`csv_as_text`: a CSV's values as the strings it holds (`iter_csv_batches`)."""
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == "jsonl":
        # Not a generator itself: each record would pass through one more frame.
        records = iter_jsonl(path, cursor)
        if columns:
            return ({c: rec.get(c) for c in columns} for rec in records)
        return records
    return _batch_records(path, fmt, columns, row_groups, cursor, csv_as_text)


def _batch_records(
    path: str,
    fmt: str,
    columns: list[str] | None,
    row_groups: list[int] | None,
    cursor: Cursor | None,
    csv_as_text: bool,
) -> Iterator[Any]:
    index = 0
    for batch in iter_file_batches(path, fmt, columns, row_groups, csv_as_text):
        for rec in batch.to_pylist():
            if cursor is not None:
                cursor.file, cursor.position = path, index
            index += 1
            yield rec
