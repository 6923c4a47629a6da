"""The stats database (dagster-duckdb's DuckDBResource) and its one-writer-at-a-time lock.

DuckDB allows one writer per database file, across processes; two runs
writing stats at once would fail on the file lock, so writers first take an
exclusive `flock` on `{database}.lock` (ducky/stats_db.py) and wait for each other.

DuckDB writes only local files: under a local prefix the database is
`{prefix}/ducky/stats.duckdb`; under a remote prefix (gs://) it is a local
file keyed by the prefix (`~/.cache/marin-dagster/ducky/<hash>/stats.duckdb`),
and the stats asset also writes its tables as Parquet into its output on the
prefix, so they are never only local.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator

import duckdb
from dagster_duckdb import DuckDBResource

from marin_dagster import fs
from marin_dagster.ducky.catalog import AssetEntry
from marin_dagster.ducky.stats_db import writer_lock
from marin_dagster.execution.asset import Step

STATS_DATABASE = "stats.duckdb"


def stats_database_path(prefix: str) -> str:
    root = fs.normalize(prefix)
    if fs.is_local(root):
        return os.path.join(root, "ducky", STATS_DATABASE)
    digest = hashlib.sha256(root.encode()).hexdigest()[:12]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(cache, "marin-dagster", "ducky", digest, STATS_DATABASE)


def stats_duckdb(prefix: str) -> DuckDBResource:
    """The DuckDBResource of the stats database for `prefix`."""
    return DuckDBResource(database=stats_database_path(prefix))


@contextlib.contextmanager
def stats_writer(resource: DuckDBResource) -> Iterator[duckdb.DuckDBPyConnection]:
    """A write connection to the stats database, held by one writer at a time."""
    database = resource.database
    if database == ":memory:":
        with resource.get_connection() as con:
            yield con
        return
    with writer_lock(database), resource.get_connection() as con:
        try:
            yield con
        finally:
            con.close()  # DuckDBResource closes only on success; never leave the file locked


def asset_entry(step: Step) -> AssetEntry:
    """What Ducky needs to know about a step's asset: name, kind, version, reader overrides."""
    metadata = step.asset.metadata_by_key.get(step.asset.key, {})

    def text(key: str) -> str | None:
        value = metadata.get(key)
        value = getattr(value, "value", value)
        return str(value) if value else None

    return AssetEntry(step.name, step.kind, step.version, text("marin/format"), text("marin/files"))
