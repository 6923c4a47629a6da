"""DuckDB connections with one view per dataset, local or on an fsspec filesystem (gs://).

Nothing here downloads a DuckDB extension: JSON, Parquet and CSV readers are
built into DuckDB, and remote files are read through the fsspec filesystem
registered on the connection (`con.register_filesystem`), not httpfs.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from marin_dagster import fs
from marin_dagster.ducky.catalog import CSV, JSONL, MIXED, PARQUET, TOKEN_CACHE, Dataset, format_of
from marin_dagster.execution.origins import note_origins
from marin_dagster.zephyr.readers import Cursor, InputError, iter_jsonl

logger = logging.getLogger(__name__)


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _file_list(files: Iterable[str]) -> str:
    return "[" + ", ".join(quote_str(f) for f in files) + "]"


def _read_ahead(fsys: Any) -> Any:
    """`fsys` opening its files with plain read-ahead, for DuckDB.

    gcsfs reads through fsspec's background prefetcher by default, whose task lives until
    the file is closed, and DuckDB drops the files it opened without closing them: each
    left its task pending until the file was collected, and asyncio then logged "Task was
    destroyed but it is pending!" (after every `marin sql` over gs://, again and again in
    `marin sql --serve`)."""

    class ReadAhead(type(fsys)):  # type: ignore[misc, valid-type]
        def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
            if "r" in mode:
                kwargs["cache_type"] = "readahead"
            return super()._open(path, mode, **kwargs)

    return ReadAhead(**fsys.storage_options)


def token_cache_table(dataset: Dataset) -> pa.Table:
    """One row per document of a token cache: split, shard, document index, token count."""
    splits, shards, docs, lengths = [], [], [], []
    root = dataset.path.rstrip("/") + "/"
    for path in dataset.files:
        rel = path[len(root) :] if path.startswith(root) else path
        parts = rel.split("/")
        split, shard = (parts[0], parts[-2]) if len(parts) >= 3 else ("train", parts[0])
        fsys, p = fs.url_to_fs(path)
        try:
            with fsys.open(p, "rb") as f:
                offsets = np.load(f)
        except ValueError as e:
            raise ValueError(
                f"{path} is not a valid offsets.npy ({e}); rebuild {dataset.name}"
            ) from e
        n = max(len(offsets) - 1, 0)
        splits.extend([split] * n)
        shards.extend([shard] * n)
        docs.append(np.arange(n, dtype=np.int64))
        lengths.append(np.diff(offsets).astype(np.int64))
    return pa.table(
        {
            "split": pa.array(splits, pa.string()),
            "shard": pa.array(shards, pa.string()),
            "document": pa.array(np.concatenate(docs) if docs else np.array([], np.int64)),
            "num_tokens": pa.array(np.concatenate(lengths) if lengths else np.array([], np.int64)),
        }
    )


def _read_sql(fmt: str, paths: Iterable[str]) -> str:
    files = _file_list(paths)
    if fmt == JSONL:
        return f"SELECT * FROM read_json({files}, format='newline_delimited', union_by_name=true)"
    if fmt == PARQUET:
        return f"SELECT * FROM read_parquet({files}, union_by_name=true)"
    return f"SELECT * FROM read_csv({files}, union_by_name=true)"


def view_sql(dataset: Dataset) -> str:
    if dataset.format in (JSONL, PARQUET, CSV):
        return _read_sql(dataset.format, dataset.files)
    if dataset.format != MIXED:
        raise ValueError(f"{dataset.name}: no SQL reader for format {dataset.format!r}")
    # Each format by its own reader, then one table: columns matched by name.
    by_format: dict[str, list[str]] = {}
    for path in dataset.files:
        by_format.setdefault(format_of(fs.basename(path), plain_json=True) or CSV, []).append(path)
    return " UNION ALL BY NAME ".join(
        f"({_read_sql(fmt, paths)})" for fmt, paths in sorted(by_format.items())
    )


def add_view(con: duckdb.DuckDBPyConnection, dataset: Dataset) -> None:
    if dataset.format == TOKEN_CACHE:
        # Token ids stay in their .npy files; the table lists documents and their lengths. A
        # table, not a registered Arrow object: those are seen by their connection alone, and
        # the SQL service runs each query on a cursor of its own.
        con.register("_token_cache", token_cache_table(dataset))
        try:
            con.execute(
                f"CREATE OR REPLACE TABLE {quote_ident(dataset.name)} AS SELECT * FROM _token_cache"
            )
        finally:
            con.unregister("_token_cache")
        return
    con.execute(f"CREATE OR REPLACE VIEW {quote_ident(dataset.name)} AS {view_sql(dataset)}")


def view_error(dataset: Dataset, error: Exception) -> str:
    """Why the view of `dataset` cannot be made, in one line, and what to do."""
    first = str(error).strip().split("\n")[0].strip().rstrip(".")
    if dataset.format in (JSONL, MIXED):
        lone = _lone_surrogate_line(first)
        if lone:
            # Python reads the escape and the steps keep the text as read, so a rebuild writes
            # the same line: the fix is where the text comes from.
            return (
                f"cannot read {dataset.path} ({dataset.format}, {len(dataset.files)} files): "
                f"{lone} holds a lone surrogate (a \\uD800-\\uDFFF escape with no pair), which "
                "DuckDB does not read; the steps keep such text as they read it, so rebuilding "
                "writes it again: fix or remove that record's text where it comes from, then "
                "rebuild"
            )
        first = _bad_json_line(first) or first
    where = f"cannot read {dataset.path} ({dataset.format}, {len(dataset.files)} files): {first}"
    # A copy of the user's file (dataset()'s output) is fixed at its source; the same version
    # rebuilt would skip, or copy the same bytes.
    copied = ValueError(first)
    note_origins(copied, {"view": dataset.path}, {"view": dataset.name})
    if getattr(copied, "__notes__", None):
        return f"{where}. {copied.__notes__[0]}"
    return (
        f"{where}; fix or remove the file named, or rebuild {dataset.name} (materialize it "
        "with op config force: true)"
    )


_MALFORMED = re.compile(r'Malformed JSON in file "([^"]+)"')


_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate_line(message: str) -> str | None:
    """Where the first lone surrogate is in the file DuckDB names (`line N of FILE`), when
    DuckDB's complaint is one. Python decodes a valid pair to one code point, so a surrogate
    left in a decoded string has none."""
    match = _MALFORMED.search(message)
    if match is None or "surrogate" not in message:
        return None
    cursor = Cursor()
    try:
        for record in iter_jsonl(match.group(1), cursor):
            if _SURROGATE.search(json.dumps(record, ensure_ascii=False)):
                return cursor.describe()
    except (InputError, OSError):
        return None
    return None


def _bad_json_line(message: str) -> str | None:
    """Our reader's account of the first bad line of the file DuckDB names: DuckDB counts
    the line where it noticed (a string left open reads on into the next line)."""
    match = _MALFORMED.search(message)
    if match is None:
        return None
    bad: list[InputError] = []
    try:
        for _ in iter_jsonl(match.group(1), bad=bad):
            if bad:
                break
    except (InputError, OSError):
        return None
    return str(bad[0]) if bad else None


def connect(
    datasets: Iterable[Dataset], prefix: str, unavailable: dict[str, str] | None = None
) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with a view per dataset, reading under `prefix`.

    A view that cannot be made raises ValueError, unless `unavailable` is given:
    then it is left out with a logged warning and its reason stored there by name.
    """
    con = duckdb.connect(":memory:")
    if not fs.is_local(prefix):
        fsys, _ = fs.url_to_fs(prefix)
        con.register_filesystem(_read_ahead(fsys))
    for dataset in datasets:
        try:
            add_view(con, dataset)
        except (duckdb.Error, ValueError, OSError) as e:
            reason = view_error(dataset, e)
            if unavailable is None:
                raise ValueError(f"cannot create the view {dataset.name!r}: {reason}") from e
            logger.warning(f"ducky: no view {dataset.name!r}: {reason}")
            unavailable[dataset.name] = reason
    return con


def lock_down(con: duckdb.DuckDBPyConnection, prefix: str) -> None:
    """No file access outside `prefix`, no extensions, no configuration changes from here on."""
    roots = {fs.normalize(prefix).rstrip("/") + "/"}
    if not fs.is_local(prefix):  # fsspec's own spelling too: memory://x is memory:///x to it
        fsys, fs_path = fs.url_to_fs(prefix)
        roots.add(fsys.unstrip_protocol(fs_path).rstrip("/") + "/")
    con.execute(f"SET allowed_directories = [{', '.join(quote_str(r) for r in sorted(roots))}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET lock_configuration = true")
