"""Views by asset name over real step outputs, on local disk and on gs:// (the GCS emulator)."""

from __future__ import annotations

import io
import time

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from marin_dagster import fs
from marin_dagster.ducky import AssetEntry, connect, lock_down, resolve_catalog, resolve_dataset
from marin_dagster.ducky.catalog import detect_format
from tests.ducky.conftest import jsonl_gz, write_output, write_token_cache


def test_jsonl_and_token_cache_views_by_asset_name(prefix, corpus_records):
    write_output(prefix, "raw/corpus", "aaaaaaaa", {
        "part-00000.jsonl.gz": jsonl_gz(corpus_records[:25]),
        "part-00001.jsonl.gz": jsonl_gz(corpus_records[25:]),
    })
    docs = [[[1, 2, 3, 0], [4, 0]], [[5, 6, 7, 8, 9, 0]]]
    write_token_cache(prefix, "tokenized/corpus", "bbbbbbbb", {"train": docs, "validation": [[[7, 0]]]})
    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": ["a", "b"], "score": [0.5, 0.25]}), buffer)
    write_output(prefix, "scores/corpus", "cccccccc", {"scores.parquet": buffer.getvalue()})

    entries = [AssetEntry("raw/corpus", "sample_corpus", "aaaaaaaa"),
               AssetEntry("tokenized/corpus", "tokenized", "bbbbbbbb"),
               AssetEntry("scores/corpus", "scores", "cccccccc"),
               AssetEntry("never/built", "sample_corpus", "dddddddd")]
    catalog = resolve_catalog(prefix, entries)
    assert [(d.name, d.format) for d in catalog] == [
        ("raw/corpus", "jsonl"), ("tokenized/corpus", "token_cache"), ("scores/corpus", "parquet")]
    con = connect(catalog, prefix)
    lock_down(con, prefix)

    rows = con.execute('SELECT id, text, title FROM "raw/corpus" ORDER BY id').fetchall()
    expected = sorted((r["id"], r["text"], r["title"]) for r in corpus_records)
    assert rows == expected
    assert con.execute('SELECT * FROM "raw/corpus" LIMIT 5').fetchall().__len__() == 5

    per_split = con.execute('SELECT split, count(*), sum(num_tokens) FROM "tokenized/corpus" '
                            "GROUP BY split ORDER BY split").fetchall()
    assert per_split == [("train", 3, 12), ("validation", 1, 2)]
    assert con.sql('SELECT sum(score) FROM "scores/corpus"').to_arrow_table().column(0)[0].as_py() == 0.75
    # Locked down, the views still read under the prefix, and nothing else can be read.
    with pytest.raises(duckdb.PermissionException):
        con.execute("SELECT * FROM read_text('/etc/hostname')")
    with pytest.raises(duckdb.PermissionException):
        con.execute(f"SELECT * FROM read_json('{prefix.rsplit('/', 1)[0]}/elsewhere/*.jsonl')")


def test_view_points_at_current_version_else_newest_success(tmp_path, corpus_records):
    prefix = str(tmp_path / "data")
    write_output(prefix, "raw/corpus", "11111111", {"a.jsonl.gz": jsonl_gz(corpus_records[:3])})
    time.sleep(0.01)
    write_output(prefix, "raw/corpus", "22222222", {"a.jsonl.gz": jsonl_gz(corpus_records[:7])})
    # A longer name sharing the prefix is another asset, not a version of this one.
    write_output(prefix, "raw/corpus-extra", "33333333", {"a.jsonl.gz": jsonl_gz(corpus_records)})

    current = resolve_dataset(prefix, AssetEntry("raw/corpus", "k", "11111111"))
    assert (current.version, current.current) == ("11111111", True)

    # The code's version is not materialized yet: the newest SUCCESS of the name serves.
    fallback = resolve_dataset(prefix, AssetEntry("raw/corpus", "k", "99999999"))
    assert (fallback.version, fallback.current) == ("22222222", False)
    con = connect([fallback], prefix)
    assert con.execute('SELECT count(*) FROM "raw/corpus"').fetchone()[0] == 7

    # A RUNNING or FAILED output is never served.
    fs.write_json(fs.join(prefix, "raw/corpus-22222222/.status.json"),
                  {"status": "FAILED", "version": "22222222"})
    assert resolve_dataset(prefix, AssetEntry("raw/corpus", "k", "99999999")).version == "11111111"


def test_format_detection_ignores_side_files():
    assert detect_format(["part-0.jsonl.zst", "part-1.jsonl.zst", ".stats.json", "README.md"]) == "jsonl"
    assert detect_format(["train/part-00000/offsets.npy", "train/part-00000/input_ids.npy",
                          ".stats.json", "train/shard_ledger.json"]) == "token_cache"
    assert detect_format(["a.parquet", "b.parquet", "c.csv"]) == "parquet"
    assert detect_format(["model.safetensors", ".manifest.json"]) is None


def test_nothing_downloads_an_extension(tmp_path, corpus_records):
    """JSON and Parquet readers are built in; the connection cannot load or install any extension."""
    prefix = str(tmp_path / "data")
    write_output(prefix, "raw/corpus", "aaaaaaaa", {"a.jsonl.gz": jsonl_gz(corpus_records)})
    con = connect(resolve_catalog(prefix, [AssetEntry("raw/corpus", "k", "aaaaaaaa")]), prefix)
    assert con.execute('SELECT count(*) FROM "raw/corpus"').fetchone()[0] == len(corpus_records)
    loaded = {path for name, loaded, path in con.execute(
        "SELECT extension_name, loaded, install_path FROM duckdb_extensions()").fetchall() if loaded}
    assert loaded == {"(BUILT-IN)"}
    lock_down(con, prefix)
    for statement in ("INSTALL httpfs", "LOAD httpfs", "SET autoinstall_known_extensions = true"):
        with pytest.raises(duckdb.Error):
            con.execute(statement)
