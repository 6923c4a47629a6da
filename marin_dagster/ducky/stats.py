"""Per-dataset statistics in SQL: documents, tokens where tokenized, the length distribution.

Text datasets measure length in characters (of their text field, `text` unless given);
token caches in tokens. The histogram uses power-of-two buckets `[2^k, 2^(k+1))` (bucket 0
holds empty documents), so datasets of any size compare on one axis.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import duckdb
import pyarrow as pa

from marin_dagster.ducky.catalog import TOKEN_CACHE, Dataset
from marin_dagster.ducky.connection import connect, quote_ident

DATASETS_SCHEMA = pa.schema(
    [
        ("dataset", pa.string()),
        ("version", pa.string()),
        ("path", pa.string()),
        ("format", pa.string()),
        ("documents", pa.int64()),
        ("tokens", pa.int64()),
        ("text_chars", pa.int64()),
        ("length_unit", pa.string()),
        ("length_min", pa.int64()),
        ("length_p50", pa.float64()),
        ("length_p90", pa.float64()),
        ("length_p99", pa.float64()),
        ("length_max", pa.int64()),
        ("length_mean", pa.float64()),
    ]
)
HISTOGRAM_SCHEMA = pa.schema(
    [
        ("dataset", pa.string()),
        ("version", pa.string()),
        ("bucket_lo", pa.int64()),
        ("bucket_hi", pa.int64()),
        ("documents", pa.int64()),
    ]
)


@dataclasses.dataclass(frozen=True)
class DatasetStats:
    row: dict[str, Any]
    histogram: list[dict[str, Any]]


def _length_expr(
    con: duckdb.DuckDBPyConnection, dataset: Dataset, text_key: str
) -> tuple[str | None, str]:
    if dataset.format == TOKEN_CACHE:
        return "num_tokens", "tokens"
    columns = {r[0] for r in con.execute(f"DESCRIBE {quote_ident(dataset.name)}").fetchall()}
    if text_key in columns:
        return f"length(CAST({quote_ident(text_key)} AS VARCHAR))", "chars"
    return None, ""


def dataset_stats(
    con: duckdb.DuckDBPyConnection, dataset: Dataset, text_key: str = "text"
) -> DatasetStats:
    """Statistics of one dataset whose view exists on `con`, its text in `text_key`."""
    view = quote_ident(dataset.name)
    length, unit = _length_expr(con, dataset, text_key)
    row: dict[str, Any] = {name: None for name in DATASETS_SCHEMA.names}
    row.update(
        dataset=dataset.name,
        version=dataset.version,
        path=dataset.path,
        format=dataset.format,
        length_unit=unit or None,
    )
    if length is None:
        row["documents"] = con.execute(f"SELECT count(*) FROM {view}").fetchone()[0]
        return DatasetStats(row, [])
    (documents, total, lo, p50, p90, p99, hi, mean) = con.execute(
        f"SELECT count(*), sum(n), min(n), quantile_cont(n, 0.5), quantile_cont(n, 0.9), "
        f"quantile_cont(n, 0.99), max(n), avg(n) FROM (SELECT {length} AS n FROM {view})"
    ).fetchone()
    row.update(
        documents=documents,
        length_min=lo,
        length_p50=p50,
        length_p90=p90,
        length_p99=p99,
        length_max=hi,
        length_mean=mean,
    )
    row["tokens" if unit == "tokens" else "text_chars"] = int(total or 0)
    buckets = con.execute(
        f"SELECT CASE WHEN n = 0 THEN 0 ELSE 1 + floor(log2(n))::BIGINT END AS b, count(*) "
        f"FROM (SELECT {length} AS n FROM {view}) GROUP BY b ORDER BY b"
    ).fetchall()
    histogram = [
        {
            "dataset": dataset.name,
            "version": dataset.version,
            "bucket_lo": 0 if b == 0 else 2 ** (b - 1),
            "bucket_hi": 1 if b == 0 else 2**b,
            "documents": count,
        }
        for b, count in buckets
    ]
    return DatasetStats(row, histogram)


def measure(job: tuple[Dataset, str, str]) -> DatasetStats:
    """The statistics of one dataset under a prefix, its text in a field: a Zephyr task of
    `dataset_stats`, here rather than in `assets/` so a worker unpickling it does not import
    Dagster."""
    dataset, prefix, text_key = job
    con = connect([dataset], prefix)
    try:
        return dataset_stats(con, dataset, text_key)
    finally:
        con.close()


def stats_tables(results: list[DatasetStats]) -> tuple[pa.Table, pa.Table]:
    datasets = pa.Table.from_pylist([r.row for r in results], schema=DATASETS_SCHEMA)
    histogram = pa.Table.from_pylist(
        [h for r in results for h in r.histogram], schema=HISTOGRAM_SCHEMA
    )
    return datasets, histogram
