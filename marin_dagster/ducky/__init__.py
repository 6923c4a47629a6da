"""Ducky: DuckDB views over step outputs, dataset statistics and a read-only SQL service.

No Dagster here: the code location (`marin_dagster/cli.py`, `assets/stats.py`)
tells Ducky which assets exist; Ducky finds their outputs under the prefix.
"""

from marin_dagster.ducky.catalog import (
    AssetEntry,
    Dataset,
    NoView,
    Unavailable,
    resolve_catalog,
    resolve_dataset,
    resolve_views,
)
from marin_dagster.ducky.connection import connect, lock_down
from marin_dagster.ducky.guard import QueryRefused, check_read_only
from marin_dagster.ducky.table import format_table

__all__ = [
    "AssetEntry",
    "Dataset",
    "NoView",
    "QueryRefused",
    "Unavailable",
    "check_read_only",
    "connect",
    "format_table",
    "lock_down",
    "resolve_catalog",
    "resolve_dataset",
    "resolve_views",
]
