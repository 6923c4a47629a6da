"""The stats asset: documents, tokens and length distributions, in the DuckDBResource's database."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import dagster as dg
import duckdb
import numpy as np

from assets.stats import dataset_stats
from marin_dagster import fs
from marin_dagster.ducky import AssetEntry, connect, resolve_catalog
from marin_dagster.execution.asset import StepContext, versioned_asset
from marin_dagster.execution.version import StepConfig
from resources.ducky import stats_database_path, stats_duckdb, stats_writer
from resources.storage import StorageResource
from resources.zephyr import ZephyrResource
from tests.conftest import subprocess_env
from tests.ducky.conftest import jsonl_gz

TOKEN_DOCS = [[1, 2, 3, 0], [4, 0], [5, 6, 7, 8, 9, 10, 11, 0], []]


class FixtureConfig(StepConfig):
    seed: int = 0


def _text_asset(records: list[dict[str, Any]]) -> dg.AssetsDefinition:
    def run(config: FixtureConfig, inputs: Mapping[str, str], out: str, step: StepContext) -> dict:
        fs.write_bytes(fs.join(out, "part-00000.jsonl.gz"), jsonl_gz(records))
        return {"documents": len(records)}

    return versioned_asset(
        name="raw/stats_text", kind="fixture_text", config=FixtureConfig(), run=run
    )


def _token_asset() -> dg.AssetsDefinition:
    from marin_dagster.tokenize import TokenCacheShardWriter, finalize_split, write_cache_stats

    def run(config: FixtureConfig, inputs: Mapping[str, str], out: str, step: StepContext) -> dict:
        with TokenCacheShardWriter(fs.join(out, "train", "part-00000")) as writer:
            for doc in TOKEN_DOCS:
                writer.add(np.asarray(doc, np.uint16))
        ledger = finalize_split(fs.join(out, "train"), ["part-00000"], np.uint16, eos_id=0)
        write_cache_stats(out, {"train": ledger})
        return {}

    return versioned_asset(
        name="tokenized/stats_tokens", kind="tokenized", config=FixtureConfig(), run=run
    )


def test_stats_asset_measures_text_and_token_datasets(tmp_path, dagster_home, corpus_records):
    prefix = str(tmp_path / "data")
    text, tokens = _text_asset(corpus_records), _token_asset()
    stats = dataset_stats("stats/fixture", datasets=[text, tokens])
    resources = {
        "storage": StorageResource(prefix=prefix),
        "duckdb": stats_duckdb(prefix),
        "zephyr": ZephyrResource(max_workers=2),
    }
    with dg.DagsterInstance.get() as instance:
        result = dg.materialize([text, tokens, stats], resources=resources, instance=instance)
        assert result.success
        md = instance.get_latest_materialization_event(stats.key).asset_materialization.metadata
    lengths = sorted(len(r["text"]) for r in corpus_records)
    assert md["documents"].value == len(corpus_records) + len(TOKEN_DOCS)
    assert md["tokens"].value == sum(len(d) for d in TOKEN_DOCS)
    assert "| raw/stats_text | 40 |" in md["stats"].value
    assert md["zephyr/shards"].value == 2 and "zephyr/records_written" not in md

    database = stats_database_path(prefix)
    assert database == str(tmp_path / "data" / "ducky" / "stats.duckdb")
    with duckdb.connect(database, read_only=True) as con:
        rows = {
            r[0]: r
            for r in con.execute(
                "SELECT dataset, documents, tokens, text_chars, length_unit, length_min, length_max, "
                "length_p50 FROM datasets"
            ).fetchall()
        }
        hist = con.execute(
            "SELECT bucket_lo, bucket_hi, documents FROM length_histogram "
            "WHERE dataset = 'tokenized/stats_tokens' ORDER BY bucket_lo"
        ).fetchall()
        text_hist_total = con.execute(
            "SELECT sum(documents) FROM length_histogram WHERE dataset = 'raw/stats_text'"
        ).fetchone()[0]
    assert rows["raw/stats_text"][1:] == (
        40,
        None,
        sum(lengths),
        "chars",
        lengths[0],
        lengths[-1],
        float(np.median(lengths)),
    )
    assert rows["tokenized/stats_tokens"][1:7] == (4, 14, None, "tokens", 0, 8)
    # lengths 4, 2, 8, 0 -> buckets [0,1), [2,4), [4,8), [8,16)
    assert hist == [(0, 1, 1), (2, 4, 1), (4, 8, 1), (8, 16, 1)]
    assert text_hist_total == 40

    # The stats output is itself a dataset Ducky can query by name.
    entries = [
        AssetEntry(
            "stats/fixture", "dataset_stats", stats.metadata_by_key[stats.key]["marin/version"]
        )
    ]
    con = connect(resolve_catalog(prefix, entries), prefix)
    assert con.execute(
        'SELECT dataset, documents FROM "stats/fixture" ORDER BY dataset'
    ).fetchall() == [("raw/stats_text", 40), ("tokenized/stats_tokens", 4)]


# What stats_writer does, without importing Dagster in each writer (seconds per process):
# take the writer lock, then open the database for writing.
WRITER = """
import sys, time
import duckdb
from marin_dagster.ducky.stats_db import writer_lock
database = sys.argv[1]
with writer_lock(database), duckdb.connect(database) as con:
    con.execute("CREATE TABLE IF NOT EXISTS writes (writer INTEGER, n INTEGER)")
    for n in range(20):
        con.execute("INSERT INTO writes VALUES (?, ?)", [int(sys.argv[2]), n])
    time.sleep(0.3)  # hold the database while the others try to write
"""


def test_writers_to_the_stats_database_take_turns(tmp_path):
    database = stats_database_path(str(tmp_path / "data"))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, database, str(i)],
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(3)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()[-2000:]
    # A writer through the resource queues behind the same lock.
    with stats_writer(stats_duckdb(str(tmp_path / "data"))) as con:
        con.execute("INSERT INTO writes VALUES (99, 0)")
    with duckdb.connect(database, read_only=True) as con:
        assert con.execute(
            "SELECT writer, count(*) FROM writes GROUP BY writer ORDER BY writer"
        ).fetchall() == [(i, 20) for i in range(3)] + [(99, 1)]


def test_stats_measure_each_datasets_own_text_field_and_refuse_what_is_no_dataset(
    tmp_path, dagster_home
):
    """A CSV read with `text_key="body"` (and a dedup of it) came back with no lengths, and
    nothing said so; a tokenizer or a checkpoint was accepted as a dataset (a checkpoint's
    metrics.jsonl measured as its documents)."""
    import pytest

    from assets import dataset, deduplicated, tokenizer

    src = tmp_path / "table.csv"
    src.write_text("id,body,label\n" + "".join(f"{i},{'word ' * (i + 1)},x\n" for i in range(9)))
    raw = dataset("raw/table", str(src), text_key="body")
    clean = deduplicated("dedup/table", source=raw, mode="exact")
    stats = dataset_stats("stats/table", datasets=[raw, clean])
    prefix = str(tmp_path / "data")
    resources = {
        "storage": StorageResource(prefix=prefix),
        "duckdb": stats_duckdb(prefix),
        "zephyr": ZephyrResource(max_workers=1),
    }
    with dg.DagsterInstance.get() as instance:
        assert dg.materialize([raw, clean, stats], resources=resources, instance=instance).success
    with duckdb.connect(stats_database_path(prefix), read_only=True) as con:
        rows = con.execute(
            "SELECT dataset, text_chars, length_unit FROM datasets ORDER BY dataset"
        ).fetchall()
    chars = sum(len("word " * (i + 1)) for i in range(9))
    assert rows == [("dedup/table", chars, "chars"), ("raw/table", chars, "chars")]

    tok = tokenizer("tokenizers/table", source=raw, vocab_size=300)
    with pytest.raises(ValueError, match=r"tokenizers/table is a tokenizer output, not a dataset"):
        dataset_stats("stats/tok", datasets=[raw, tok])
