"""`dataset_stats`: documents, tokens and the length distribution of datasets, in DuckDB.

    stats = dataset_stats("stats/shakespeare_nano", datasets=[corpus, clean, ds])

Each dataset's output is read through Ducky's view of it (JSONL, Parquet, CSV
or a token cache, found from the output's files). The tables land in two
places: `datasets.parquet` and `length_histogram.parquet` in the asset's own
output (so `marin sql 'SELECT * FROM "stats/shakespeare_nano"'` shows them),
and the `datasets` / `length_histogram` tables of the stats database behind
the `duckdb` resource (dagster-duckdb's DuckDBResource), one row per dataset
and version, written by one writer at a time.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq

from assets.dataset import records_text_key
from marin_dagster import fs
from marin_dagster.ducky import catalog
from marin_dagster.ducky.stats import measure, stats_tables
from marin_dagster.execution.asset import (
    StepContext,
    asset_list,
    defining,
    step_for,
    steps_by_name,
    versioned_asset,
)
from marin_dagster.execution.status import StepStatus, read_status
from marin_dagster.execution.version import StepConfig, added_later
from marin_dagster.iris import ResourceConfig
from marin_dagster.zephyr import Dataset as ZephyrDataset
from resources.ducky import asset_entry, stats_writer

KIND = "dataset_stats"
catalog.register_kind(KIND, format=catalog.PARQUET, files="datasets.parquet")


class DatasetStatsConfig(StepConfig):
    """The statistics depend on the datasets (their versions) and where their text is."""

    text_keys: dict[str, str] = added_later({})
    """The text field of each dataset whose field is not "text" (`dataset(text_key=...)`):
    their lengths used to come back empty."""


# Steps whose output is no dataset: measured, a checkpoint's metrics.jsonl read as one.
_NOT_DATASETS = ("tokenizer", "train_lm", "evaluate", KIND, "watched_folder")


def _write_parquet(path: str, table: pa.Table) -> None:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    fs.write_bytes(path, buffer.getvalue())


_CREATE = {
    "datasets": "CREATE TABLE IF NOT EXISTS datasets AS SELECT * FROM new_datasets LIMIT 0",
    "length_histogram": "CREATE TABLE IF NOT EXISTS length_histogram AS SELECT * FROM new_histogram LIMIT 0",
}


def _store(step: StepContext, datasets: pa.Table, histogram: pa.Table) -> None:
    with stats_writer(step.resources.duckdb) as con:
        con.register("new_datasets", datasets)
        con.register("new_histogram", histogram)
        con.execute("BEGIN TRANSACTION")
        for sql in _CREATE.values():
            con.execute(sql)
        for table in _CREATE:
            con.execute(
                f"DELETE FROM {table} WHERE (dataset, version) IN "
                "(SELECT dataset, version FROM new_datasets)"
            )
        con.execute("INSERT INTO datasets SELECT * FROM new_datasets")
        con.execute("INSERT INTO length_histogram SELECT * FROM new_histogram")
        con.execute("COMMIT")


def _markdown(datasets: pa.Table) -> str:
    rows = ["| dataset | documents | tokens | chars | median length |", "|---|---|---|---|---|"]
    for r in datasets.to_pylist():
        median = f"{r['length_p50']:,.0f} {r['length_unit']}" if r["length_p50"] is not None else ""
        rows.append(
            f"| {r['dataset']} | {r['documents']:,} | {r['tokens'] or ''} | "
            f"{r['text_chars'] or ''} | {median} |"
        )
    return "\n".join(rows)


def _make_run(roles: Mapping[str, Any]):
    def run(
        config: DatasetStatsConfig, inputs: Mapping[str, str], output_path: str, step: StepContext
    ) -> dict[str, Any]:
        found = []
        for role, path in inputs.items():
            record = read_status(path)
            if record is None or record.status != StepStatus.SUCCESS:
                raise dg.Failure(
                    f"dataset_stats: {role} at {path} is not SUCCESS; materialize it first"
                )
            dataset = catalog.load_output(roles[role], path, record, current=True)
            if dataset is None:
                raise dg.Failure(
                    f"dataset_stats: {role} at {path} holds no JSONL, Parquet, CSV or "
                    "token-cache files to measure"
                )
            found.append(dataset)
        # One Zephyr task per dataset (on the ZephyrResource's backend and workers), each
        # with its own in-memory DuckDB over that dataset's files; the driver then writes
        # the tables, the stats database through its single writer.
        root = step.resources.storage.root
        zephyr = step.resources.zephyr
        jobs = [(d, root, config.text_keys.get(d.name, "text")) for d in found]
        ran = zephyr.execute(
            ZephyrDataset.from_list(jobs).reshard(len(found)).map(measure),
            context=step.dagster,
            output_path=output_path,
        )
        results = list(ran.results)
        for (dataset, _root, text_key), result in zip(jobs, results, strict=True):
            if result.row["length_unit"] is None:
                step.log.warning(
                    f"dataset_stats: {dataset.name} has no text field {text_key!r}: its "
                    "documents are counted, their lengths not measured"
                )
        datasets, histogram = stats_tables(results)
        _write_parquet(fs.join(output_path, "datasets.parquet"), datasets)
        _write_parquet(fs.join(output_path, "length_histogram.parquet"), histogram)
        _store(step, datasets, histogram)
        step.log.info(f"stats of {len(found)} datasets written to {step.resources.duckdb.database}")
        return {
            "datasets": len(found),
            "documents": sum(r.row["documents"] or 0 for r in results),
            "tokens": sum(r.row["tokens"] or 0 for r in results),
            "database": dg.MetadataValue.path(step.resources.duckdb.database),
            "stats": dg.MetadataValue.md(_markdown(datasets)),
            **zephyr.metadata(ran, writes=False),
        }

    return run


def dataset_stats(
    name: str, datasets: Sequence[dg.AssetsDefinition], *, resources: str | ResourceConfig = "cpu"
) -> dg.AssetsDefinition:
    """Statistics of `datasets` (each a dataset asset from a marin factory)."""
    with defining("dataset_stats", name):
        datasets = asset_list(datasets, "datasets")
    if not datasets:
        raise ValueError(f"dataset_stats({name!r}): give at least one dataset asset")
    with defining("dataset_stats", name):
        steps_by_name(datasets, "dataset")  # by name below: one name, one dataset
        for a in datasets:
            step = step_for(a, "dataset")
            if step.kind in _NOT_DATASETS:
                raise ValueError(
                    f"datasets: {step.name} is a {step.kind} output, not a dataset; give the "
                    "datasets (dataset, deduplicated, tokenized, ... assets) to measure"
                )
        text_keys = {step_for(a).name: records_text_key(a, "dataset") for a in datasets}
    upstream = {step_for(a).name: a for a in datasets}
    roles = {role: asset_entry(step_for(a)) for role, a in upstream.items()}
    return versioned_asset(
        name=name,
        kind=KIND,
        config=DatasetStatsConfig(text_keys={n: k for n, k in text_keys.items() if k != "text"}),
        run=_make_run(roles),
        upstream=upstream,
        description="Documents, tokens and length distribution per dataset "
        f"({', '.join(upstream)}), in DuckDB.",
        resources=resources,
        required_resources=("duckdb", "zephyr"),
        kinds=("duckdb",),
    )
