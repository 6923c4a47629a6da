"""Documents out of input shards, with every bad record named by file and index.

The cache builder reads its shards itself (not through a generic JSON
reader) so that a line of invalid UTF-8 or broken JSON is one bad record
(reported with file, record index and reason, or skipped and counted), not a
crash of the whole shard.

Formats: JSON lines (``.jsonl``/``.json``, optionally ``.gz``/``.zst``/``.bz2``/
``.xz``), Parquet (``.parquet``) and CSV (``.csv``). A JSONL record's index is its 0-based
line number; blank lines are not records.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from marin_dagster.zephyr.readers import detect_format, iter_file_records, open_input


class BadRecordError(ValueError):
    """An input record that cannot become a document."""

    def __init__(
        self, source: str, record_index: int, reason: str, line: int | None = None
    ) -> None:
        self.source = source
        self.record_index = record_index
        self.reason = reason
        self.line = line
        # As dedup names a record: its line where it has one, then its index among records.
        where = (
            f"line {line}: record {record_index}" if line is not None else f"record {record_index}"
        )
        super().__init__(
            f"{source}: {where}: {reason}. "
            "Fix the input, or set skip_bad_records=True to skip such records and count them."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Raised in workers and sent back to the driver: pickle the fields, not the message.
        return (BadRecordError, (self.source, self.record_index, self.reason, self.line))


@dataclass(frozen=True)
class BadRecord:
    """A record that could not be read (undecodable bytes, broken JSON)."""

    reason: str


@dataclass(frozen=True)
class Document:
    index: int  # the record index in its file
    doc_id: str
    text: str
    num_bytes: int


@dataclass
class RecordCounts:
    records: int = 0
    empty: int = 0
    bad: int = 0


def read_records(path: str) -> Iterator[tuple[int, int | None, dict[str, Any] | BadRecord | Any]]:
    """``(record_index, line, record)`` for each record (`line`: the 1-based line of a JSONL
    record, whose blank lines are no records; None for Parquet and CSV); unreadable ones as
    BadRecord.

    Files open through Zephyr's reader (``open_input``, one place that knows
    compression), so a truncated or corrupt file raises zephyr's InputError
    naming it; it is never read as a shorter file, and it is not a bad record
    that ``skip_bad_records`` could skip.
    """
    try:
        fmt = detect_format(path)
    except ValueError:
        raise ValueError(
            f"{path}: unsupported input format; the token cache reads JSON lines "
            "(.jsonl, .jsonl.gz, .jsonl.zst), Parquet (.parquet) and CSV (.csv)"
        ) from None
    if fmt != "jsonl":
        # Parquet and CSV rows come whole or the file is unreadable (InputError): no line
        # of theirs is a bad record on its own.
        for index, record in enumerate(iter_file_records(path, fmt, csv_as_text=True)):
            yield index, None, record
        return
    index = 0
    with open_input(path) as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                record: Any = BadRecord(f"invalid UTF-8 at byte {e.start} of the line ({e.reason})")
            else:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    record = BadRecord(
                        f"not valid JSON ({e.msg.removesuffix(' at')} at column {e.colno})"
                    )
            yield index, number, record
            index += 1


def document_id(record: dict[str, Any], id_key: str | None, text: str) -> str:
    """The record's id field, else a hash of its text (stable across runs and files)."""
    if id_key and id_key in record and record[id_key] is not None:
        return str(record[id_key])
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def iter_documents(
    records: Iterable[tuple[int, int | None, Any]],
    source: str,
    text_key: str = "text",
    id_key: str | None = "id",
    *,
    skip_bad_records: bool = False,
    counts: RecordCounts | None = None,
    limit: int | None = None,
) -> Iterator[Document]:
    """Non-empty documents of ``records`` (from ``read_records(source)``), at most ``limit``.

    Bad records raise BadRecordError, or with ``skip_bad_records`` are counted
    in ``counts.bad``; empty texts are counted in ``counts.empty``.
    """
    counts = counts if counts is not None else RecordCounts()
    if limit is not None and limit <= 0:
        return
    produced = 0
    for index, line, record in records:
        counts.records += 1
        reason = None
        text = None
        if isinstance(record, BadRecord):
            reason = record.reason
        elif not isinstance(record, dict):
            reason = f"the record is a JSON {type(record).__name__}, not an object"
        elif text_key not in record:
            reason = f"no field {text_key!r} (the record's keys: {sorted(record)[:20]})"
        elif record[text_key] is None:
            reason = f"field {text_key!r} is null"
        elif not isinstance(record[text_key], str):
            reason = (
                f"field {text_key!r} is {type(record[text_key]).__name__}, not a string "
                f"(the record's keys: {sorted(record)[:20]})"
            )
        else:
            text = record[text_key]
        num_bytes = 0
        if text is not None:
            try:
                num_bytes = len(text.encode("utf-8"))
            except UnicodeEncodeError as e:
                reason = (
                    f"field {text_key!r} is not valid Unicode ({e.reason} at character {e.start})"
                )
        if reason is not None:
            if not skip_bad_records:
                raise BadRecordError(source, index, reason, line)
            counts.bad += 1
            continue
        if not text:
            counts.empty += 1
            continue
        yield Document(index, document_id(record, id_key, text), text, num_bytes)
        produced += 1
        if limit is not None and produced >= limit:
            return


def held_out(doc_id: str, fraction: float) -> bool:
    """True for documents in the held-out (validation) fraction, by a stable hash of the id."""
    if fraction <= 0:
        return False
    if fraction >= 1:
        return True
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8, person=b"marin-val").digest()
    return int.from_bytes(digest, "big") < fraction * (1 << 64)


def iter_texts(
    paths: Iterable[str],
    text_key: str = "text",
    id_key: str | None = "id",
    *,
    skip_bad_records: bool = False,
    counts: RecordCounts | None = None,
    held_out_fraction: float = 0.0,
    held_out_docs: list[Document] | None = None,
    max_held_out: int = 0,
) -> Iterator[str]:
    """Document texts of ``paths`` in order, streamed (one record in memory at a time).

    With ``held_out_fraction``, documents whose id hashes into that fraction
    are not yielded; the first ``max_held_out`` of them are appended to
    ``held_out_docs`` instead (a bounded sample for evaluating a tokenizer).
    """
    for path in paths:
        for doc in iter_documents(
            read_records(path),
            path,
            text_key,
            id_key,
            skip_bad_records=skip_bad_records,
            counts=counts,
        ):
            if held_out_fraction > 0 and held_out(doc.doc_id, held_out_fraction):
                if held_out_docs is not None and len(held_out_docs) < max_held_out:
                    held_out_docs.append(doc)
                continue
            yield doc.text
