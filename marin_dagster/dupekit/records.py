"""Source documents as dedup sees them: ids, order keys, reading and validation.

Every document has a *node key*, a string whose order is the dedup order:
documents sort by id (integers numerically, then records without an id, then
strings in natural order: runs of digits by their length, then by code point, so
`doc9` comes before `doc10` and `a.jsonl:2` before `a.jsonl:12`; the rest by code
point), ties broken by file and record position. "Keep the
first document" means keep the smallest node key, so the choice is the same
whatever the shard, worker or backend that sees a group. The key also carries
the document's position (file index, record index), which is how later stages
find it again without a join.

A record without an id (missing or null) gets `"{relative file path}#{record
index}"`, stable across runs and machines, and keeps it in the outputs. Such
records sort by position, not by that string, in which `#11` comes before `#2`:
the first copy in the input is kept.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from marin_dagster import fs
from marin_dagster.words import a_type
from marin_dagster.zephyr.readers import Cursor, detect_format, iter_file_records

_INT_OFFSET = 1 << 63
_SEP = "\x00"


@dataclass(frozen=True)
class SourceFile:
    """One input file: its index in the sorted input list and its path relative to their root."""

    index: int
    path: str
    relative: str

    @property
    def format(self) -> str:
        """JSON lines (plain or compressed), Parquet or CSV: the deduplicated documents are
        written back in it."""
        return detect_format(self.path)


def resolve_sources(source_files: str | Sequence[str]) -> list[SourceFile]:
    """Input files (a glob pattern, a file, or a list of paths), sorted, with relative names."""
    if isinstance(source_files, str):
        filesystem, fs_path = fs.url_to_fs(source_files)
        if any(c in source_files for c in "*?["):
            matched = sorted(filesystem.glob(fs_path))
            protocol = source_files.split("://", 1)[0] + "://" if "://" in source_files else ""
            paths = [
                protocol + p if protocol and not p.startswith(protocol) else p for p in matched
            ]
            if not paths:
                raise FileNotFoundError(f"no input files match {source_files!r}")
        else:
            paths = [source_files]
    else:
        paths = sorted(str(p) for p in source_files)
    if not paths:
        raise ValueError("deduplicate needs at least one input file")
    if len(set(paths)) != len(paths):
        raise ValueError(
            f"input files are listed twice: {sorted({p for p in paths if paths.count(p) > 1})}"
        )
    for p in paths:
        try:
            detect_format(p)
        except ValueError:
            raise ValueError(
                f"{p}: dedup reads JSON lines (.jsonl, .json, .ndjson; plain or .gz, .zst, .bz2, .xz), "
                "Parquet and CSV files; this one's extension says none of them"
            ) from None
    local = [p.split("://", 1)[-1] for p in paths]
    root = os.path.dirname(local[0]) if len(local) == 1 else os.path.commonpath(local)
    return [
        SourceFile(i, p, os.path.relpath(lp, root) if root else lp)
        for i, (p, lp) in enumerate(zip(paths, local, strict=True))
    ]


def node_key(
    doc_id: int | str, file_index: int, record_index: int, *, generated: bool = False
) -> str:
    position = f"{file_index:08x}{record_index:012x}"
    if generated:  # ordered by the position in front of it; the id follows for key_id
        head = f"p{position}{doc_id}"
    elif isinstance(doc_id, int):
        if not -_INT_OFFSET <= doc_id < _INT_OFFSET:
            raise ValueError(f"integer id {doc_id} does not fit in 64 bits")
        head = f"i{doc_id + _INT_OFFSET:020d}"
    else:
        head = "s" + _natural(doc_id)
    return f"{head}{_SEP}{position}"


_DIGIT_RUN = re.compile(r"[0-9]+")


def _natural(doc_id: str) -> str:
    """`doc_id` with each run of digits led by its length (3 digits; a run of 1,000 or more
    in chunks of 999), so that code-point order of the result puts `doc9` before `doc10`
    and `a.jsonl:2` before `a.jsonl:12`. Reversible: `_unnatural`."""

    def encode(run: re.Match[str]) -> str:
        digits = run.group()
        return "".join(
            f"{len(c):03d}{c}" for c in (digits[i : i + 999] for i in range(0, len(digits), 999))
        )

    return _DIGIT_RUN.sub(encode, doc_id)


def _unnatural(encoded: str) -> str:
    out, i = [], 0
    while i < len(encoded):
        if "0" <= encoded[i] <= "9":
            n = int(encoded[i : i + 3])
            out.append(encoded[i + 3 : i + 3 + n])
            i += 3 + n
        else:
            out.append(encoded[i])
            i += 1
    return "".join(out)


def key_id(key: str) -> int | str:
    """The document id inside a node key."""
    head = key[: key.rindex(_SEP)]
    if head[0] == "i":
        return int(head[1:]) - _INT_OFFSET
    return head[21:] if head[0] == "p" else _unnatural(head[1:])


def key_position(key: str) -> tuple[int, int]:
    """`(file index, record index)` of a node key."""
    tail = key[key.rindex(_SEP) + 1 :]
    return int(tail[:8], 16), int(tail[8:], 16)


@dataclass
class SourceDoc:
    record_index: int
    record: dict[str, Any]
    doc_id: int | str
    text: str
    key: str


# With this id field missing, a record's id is made from its file and position (documented);
# another name that no record of a file holds is a typo, not data without ids.
DEFAULT_ID_KEY = "id"


def iter_docs(source: SourceFile, text_key: str, id_key: str) -> Iterator[SourceDoc]:
    """The documents of one input file, validated, with ids (generated where missing).

    A truncated, corrupt or mis-encoded file raises zephyr's InputError naming
    the file (and line); a record's index counts records, not lines.
    """
    cursor = Cursor()
    first_fields: list[str] | None = None
    any_id = False
    for index, record in enumerate(
        iter_file_records(
            # a CSV's values as it holds them: written back unchanged ("007", "NA", "true")
            source.path,
            source.format,
            cursor=cursor,
            csv_as_text=True,
        )
    ):
        line = f"line {cursor.line}: " if cursor.line else ""
        where = f"{source.path}: {line}record {index}"
        if not isinstance(record, dict):
            raise ValueError(
                f"{where} is a JSON {type(record).__name__}, not an object; "
                "each line must be one document object"
            )
        text = record.get(text_key)
        if text is None and text_key in record:
            raise ValueError(
                f"{where}: field {text_key!r} is null: give that record its text or remove it"
            )
        if not isinstance(text, str):
            what = "has no" if text is None else f"has {a_type(text)} in its"
            fix = (  # the records before it have the field: this one is to fix
                "give that record its text or remove it"
                if index
                else "pass text_key=... naming the field that holds the document text"
            )
            raise ValueError(f"{where} {what} {text_key!r} field; {fix}")
        if first_fields is None:
            first_fields = list(record)
        doc_id = record.get(id_key)
        generated = doc_id is None
        any_id = any_id or not generated
        if generated:
            doc_id = f"{source.relative}#{index}"
            record = {**record, id_key: doc_id}
        elif isinstance(doc_id, bool) or not isinstance(doc_id, int | str):
            raise ValueError(
                f"{where}: field {id_key!r} is {a_type(doc_id)} "
                f"({doc_id!r}); ids must be strings or integers"
            )
        yield SourceDoc(
            index, record, doc_id, text, node_key(doc_id, source.index, index, generated=generated)
        )
    if first_fields is not None and not any_id and id_key != DEFAULT_ID_KEY:
        # Ids made up for every record would decide which copy is kept by file order, and
        # each output record would gain the misspelt field.
        raise ValueError(
            f"{source.path}: no record has the id field {id_key!r} (id_key); its first "
            f"record's fields: {', '.join(first_fields)}. Name the field that holds the ids, "
            f"or leave id_key at {DEFAULT_ID_KEY!r} to number records by file and position"
        )
