"""The last two stages of every mode: duplicate marks per file, then the outputs per file.

Marks (`{file, record, cluster}` for a duplicate document, `{file, record,
span}` for a duplicate paragraph) are grouped by input file and sorted by
record, one marks file per input file. Then each input file is read once more
beside its marks and written as

- `documents/{relative path}`: the records kept (document modes) or with
  their duplicate paragraphs cut out (paragraph mode), fields unchanged, in the
  input file's format (JSON lines, Parquet with the input's own schema, or CSV);
- `attributes/{relative path, as .jsonl.gz}`: one record per input record,
  same order (`a.csv` and `a.jsonl` side by side keep their whole names:
  `a.csv.jsonl.gz`, `a.jsonl.jsonl.gz`).

Files are written atomically (Zephyr's writers, marin_dagster.fs).
"""

from __future__ import annotations

import collections
import gzip
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from marin_dagster import fs
from marin_dagster.dupekit.records import SourceFile, iter_docs, key_id
from marin_dagster.zephyr import counters
from marin_dagster.zephyr.readers import iter_jsonl
from marin_dagster.zephyr.writers import (
    SchemaConflictError,
    write_csv,
    write_jsonl,
    write_parquet,
)


def attributes_name(relative: str) -> str:
    """The attributes file of an input file: same name, always gzipped JSONL."""
    stem = re.sub(r"\.(jsonl|json|ndjson|parquet|pq|csv|tsv)(\.[a-z0-9]+)?$", "", relative)
    return stem + ".jsonl.gz"


def attributes_names(relatives: Sequence[str]) -> dict[str, str]:
    """Each input file's attributes file (`attributes_name`), except where two inputs would
    share one (`a.jsonl` and `a.csv`): each of those keeps its whole name, `a.csv.jsonl.gz`,
    so that neither overwrites the other's."""
    by_name: dict[str, list[str]] = collections.defaultdict(list)
    for relative in relatives:
        by_name[attributes_name(relative)].append(relative)
    names = {
        relative: name if len(group) == 1 else relative + ".jsonl.gz"
        for name, group in by_name.items()
        for relative in group
    }
    taken: dict[str, str] = {}
    for relative, name in names.items():
        other = taken.setdefault(name, relative)
        if other != relative:
            raise ValueError(
                f"input files {other} and {relative} would both write attributes/{name}; "
                "rename one of them"
            )
    return names


_WRITERS = {"jsonl": write_jsonl, "parquet": write_parquet, "csv": write_csv}


def _parquet_schema(source: SourceFile, id_key: str) -> pa.Schema:
    """The input file's own schema (its types and metadata: int32 stays int32, a dictionary
    column a dictionary), with a string id column where the file has none (generated ids)."""
    with fs.open_read(source.path) as f:
        schema = pq.read_schema(f)
    if id_key not in schema.names:
        schema = schema.append(pa.field(id_key, pa.string()))
    return schema


def marks_path(marks_dir: str, file_index: int) -> str:
    return fs.join(marks_dir, f"file-{file_index:05d}.jsonl.gz")


def file_of(mark: dict) -> int:
    return mark["file"]


def mark_order(mark: dict) -> tuple:
    return (mark["record"], *mark.get("span", ()))


@dataclass(frozen=True)
class WriteMarks:
    marks_dir: str

    def __call__(self, file_index: int, marks: Iterator[dict]) -> Iterator[str]:
        path = marks_path(self.marks_dir, file_index)
        write_jsonl(path, marks)
        yield path


def _marks_by_record(path: str) -> Iterator[tuple[int, list[dict]]]:
    if not fs.exists(path):
        return
    current: int | None = None
    group: list[dict] = []
    for mark in iter_jsonl(path):
        if mark["record"] != current and group:
            yield current, group  # type: ignore[misc]
            group = []
        current = mark["record"]
        group.append(mark)
    if group:
        yield current, group  # type: ignore[misc]


def cut_spans(text: str, spans: list[list[int]]) -> str:
    """`text` without the given line spans (and the newline that ends each)."""
    out = []
    pos = 0
    for start, end in sorted(spans):
        out.append(text[pos:start])
        pos = end + 1 if end < len(text) and text[end] == "\n" else end
    out.append(text[pos:])
    return "".join(out)


@dataclass(frozen=True)
class WriteOutputs:
    """Per input file: the deduplicated records and their attributes; returns its counts."""

    mode: str
    text_key: str
    id_key: str
    marks_dir: str
    documents_dir: str
    attributes_dir: str
    attributes_names: dict[str, str]
    """Input file (relative path) -> its attributes file (`attributes_names`)."""

    def __call__(self, source: SourceFile) -> dict[str, Any]:
        schema = _parquet_schema(source, self.id_key) if source.format == "parquet" else None
        try:
            return self._write(source, schema)
        except SchemaConflictError:
            if schema is None:
                raise
            # An id generated for a record without one, in an integer id column: that
            # file's ids are written as strings, the other columns as they were.
            index = schema.get_field_index(self.id_key)
            text_ids = schema.set(index, pa.field(self.id_key, pa.string()))
            return self._write(source, text_ids, ids_as_text=True)

    def _write(
        self, source: SourceFile, schema: pa.Schema | None, ids_as_text: bool = False
    ) -> dict[str, Any]:
        counts = {
            "documents": 0,
            "duplicates": 0,
            "paragraphs_removed": 0,
            "chars_removed": 0,
            "documents_emptied": 0,
        }
        marks = _marks_by_record(marks_path(self.marks_dir, source.index))
        pending = next(marks, None)
        documents_path = fs.join(self.documents_dir, source.relative)
        attributes_path = fs.join(self.attributes_dir, self.attributes_names[source.relative])
        encode_utf8 = json.JSONEncoder(ensure_ascii=False).encode
        encode_ascii = json.JSONEncoder(ensure_ascii=True).encode

        def line(attrs: dict) -> bytes:
            try:
                return (encode_utf8(attrs) + "\n").encode("utf-8")
            except UnicodeEncodeError:  # an id holding a lone surrogate: JSON escapes it
                return (encode_ascii(attrs) + "\n").encode("ascii")

        def docs(attributes: IO[bytes]) -> Iterator[dict]:
            nonlocal pending
            for doc in iter_docs(source, self.text_key, self.id_key):
                counts["documents"] += 1
                mine: list[dict] = []
                if pending is not None and pending[0] == doc.record_index:
                    mine = pending[1]
                    pending = next(marks, None)
                if self.mode == "paragraph":
                    record, attrs = self._paragraphs(doc.record, doc.doc_id, doc.text, mine, counts)
                else:
                    record, attrs = self._document(doc.record, doc.doc_id, mine, counts)
                attributes.write(line(attrs))
                if record is not None:
                    if ids_as_text and not isinstance(record.get(self.id_key), str):
                        record = {**record, self.id_key: str(record[self.id_key])}
                    yield record

        # Both files stream side by side; each appears only once complete.
        with (
            fs.atomic_write(attributes_path, "wb") as raw,
            gzip.GzipFile(
                filename="", fileobj=raw, mode="wb", compresslevel=1, mtime=0
            ) as attributes,
        ):
            if source.format == "parquet":
                kept = write_parquet(documents_path, docs(attributes), schema=schema)
            else:
                kept = _WRITERS[source.format](documents_path, docs(attributes))
            if pending is not None:
                raise ValueError(
                    f"{source.path}: marks name record {pending[0]}, which the file "
                    "does not have; was the input changed during the run?"
                )
        counts["kept"] = kept.records
        counters.increment("dedup/document/total", counts["documents"])
        counters.increment("dedup/document/duplicates", counts["duplicates"])
        if self.mode == "paragraph":
            counters.increment("dedup/paragraph/duplicates", counts["paragraphs_removed"])
        return {
            "file": source.relative,
            "documents_file": documents_path,
            "attributes_file": attributes_path,
            **counts,
        }

    def _document(
        self, record: dict, doc_id: Any, mine: list[dict], counts: dict
    ) -> tuple[dict | None, dict]:
        if mine:
            counts["duplicates"] += 1
            return None, {"id": doc_id, "duplicate": True, "cluster_id": key_id(mine[0]["cluster"])}
        return record, {"id": doc_id, "duplicate": False, "cluster_id": doc_id}

    def _paragraphs(
        self, record: dict, doc_id: Any, text: str, mine: list[dict], counts: dict
    ) -> tuple[dict | None, dict]:
        spans = [m["span"] for m in mine]
        attrs = {"id": doc_id, "duplicate_spans": spans}
        if not spans:
            return record, attrs
        counts["paragraphs_removed"] += len(spans)
        new_text = cut_spans(text, spans)
        counts["chars_removed"] += len(text) - len(new_text)
        if not new_text.strip():
            # Every paragraph repeats one seen before: nothing of this document is new.
            counts["documents_emptied"] += 1
            return None, attrs
        return {**record, self.text_key: new_text}, attrs
