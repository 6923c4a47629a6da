"""Views by asset name over real step outputs, on local disk and on gs:// (the GCS emulator)."""

from __future__ import annotations

import io
import json
import logging
import time

import duckdb
import pyarrow as pa
import pyarrow.csv  # noqa: F401 -- pa.csv
import pyarrow.parquet as pq
import pytest
import zstandard

from marin_dagster import fs
from marin_dagster.ducky import (
    AssetEntry,
    Dataset,
    connect,
    lock_down,
    resolve_catalog,
    resolve_dataset,
    resolve_views,
)
from marin_dagster.ducky.catalog import detect_format
from tests.ducky.conftest import jsonl_gz, write_output, write_token_cache


def test_jsonl_and_token_cache_views_by_asset_name(prefix, corpus_records):
    write_output(
        prefix,
        "raw/corpus",
        "aaaaaaaa",
        {
            "part-00000.jsonl.gz": jsonl_gz(corpus_records[:25]),
            "part-00001.jsonl.gz": jsonl_gz(corpus_records[25:]),
        },
    )
    docs = [[[1, 2, 3, 0], [4, 0]], [[5, 6, 7, 8, 9, 0]]]
    write_token_cache(
        prefix, "tokenized/corpus", "bbbbbbbb", {"train": docs, "validation": [[[7, 0]]]}
    )
    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": ["a", "b"], "score": [0.5, 0.25]}), buffer)
    write_output(prefix, "scores/corpus", "cccccccc", {"scores.parquet": buffer.getvalue()})

    entries = [
        AssetEntry("raw/corpus", "sample_corpus", "aaaaaaaa"),
        AssetEntry("tokenized/corpus", "tokenized", "bbbbbbbb"),
        AssetEntry("scores/corpus", "scores", "cccccccc"),
        AssetEntry("never/built", "sample_corpus", "dddddddd"),
    ]
    catalog = resolve_catalog(prefix, entries)
    assert [(d.name, d.format) for d in catalog] == [
        ("raw/corpus", "jsonl"),
        ("tokenized/corpus", "token_cache"),
        ("scores/corpus", "parquet"),
    ]
    con = connect(catalog, prefix)
    lock_down(con, prefix)

    rows = con.execute('SELECT id, text, title FROM "raw/corpus" ORDER BY id').fetchall()
    expected = sorted((r["id"], r["text"], r["title"]) for r in corpus_records)
    assert rows == expected
    assert con.execute('SELECT * FROM "raw/corpus" LIMIT 5').fetchall().__len__() == 5

    per_split = con.execute(
        'SELECT split, count(*), sum(num_tokens) FROM "tokenized/corpus" '
        "GROUP BY split ORDER BY split"
    ).fetchall()
    assert per_split == [("train", 3, 12), ("validation", 1, 2)]
    assert (
        con.sql('SELECT sum(score) FROM "scores/corpus"').to_arrow_table().column(0)[0].as_py()
        == 0.75
    )
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
    fs.write_json(
        fs.join(prefix, "raw/corpus-22222222/.status.json"),
        {"status": "FAILED", "version": "22222222"},
    )
    assert resolve_dataset(prefix, AssetEntry("raw/corpus", "k", "99999999")).version == "11111111"


def test_format_detection_ignores_side_files():
    assert (
        detect_format(["part-0.jsonl.zst", "part-1.jsonl.zst", ".stats.json", "README.md"])
        == "jsonl"
    )
    assert (
        detect_format(
            [
                "train/part-00000/offsets.npy",
                "train/part-00000/input_ids.npy",
                ".stats.json",
                "train/shard_ledger.json",
            ]
        )
        == "token_cache"
    )
    assert detect_format(["a.parquet", "b.parquet", "c.csv"]) == "mixed"
    assert detect_format(["model.safetensors", ".manifest.json"]) is None


def test_nothing_downloads_an_extension(tmp_path, corpus_records):
    """JSON and Parquet readers are built in; the connection cannot load or install any extension."""
    prefix = str(tmp_path / "data")
    write_output(prefix, "raw/corpus", "aaaaaaaa", {"a.jsonl.gz": jsonl_gz(corpus_records)})
    con = connect(resolve_catalog(prefix, [AssetEntry("raw/corpus", "k", "aaaaaaaa")]), prefix)
    assert con.execute('SELECT count(*) FROM "raw/corpus"').fetchone()[0] == len(corpus_records)
    loaded = {
        path
        for name, loaded, path in con.execute(
            "SELECT extension_name, loaded, install_path FROM duckdb_extensions()"
        ).fetchall()
        if loaded
    }
    assert loaded == {"(BUILT-IN)"}
    lock_down(con, prefix)
    for statement in ("INSTALL httpfs", "LOAD httpfs", "SET autoinstall_known_extensions = true"):
        with pytest.raises(duckdb.Error):
            con.execute(statement)


def _pretty(obj: object) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


def test_a_view_reads_one_table_of_data_shards_never_side_files(prefix, corpus_records):
    """A dedup output holds documents/ (the dataset), attributes/, signatures/, links/ and counts.json;
    its view is documents/. Top-level shards win over folders; splits in folders are one table."""
    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": ["doc-0"], "signature": [[1, 2]]}), buffer)
    write_output(
        prefix,
        "dedup/corpus",
        "aaaaaaaa",
        {
            "documents/a.jsonl.gz": jsonl_gz(corpus_records[:30]),
            "documents/sub/b.jsonl.gz": jsonl_gz(corpus_records[30:35]),
            "attributes/a.jsonl.gz": jsonl_gz(
                [{"id": r["id"], "duplicate": False} for r in corpus_records]
            ),
            "signatures/part-00000.parquet": buffer.getvalue(),
            "links/part-00000-of-00001.jsonl.gz": jsonl_gz([{"a": "doc-0", "b": "doc-1"}]),
            "_work/marks/file-00000.jsonl.gz": jsonl_gz([{"file": 0}]),
            "counts.json": _pretty({"document": {"total": 40, "kept": 35}}),
        },
    )
    write_output(
        prefix,
        "raw/corpus",
        "bbbbbbbb",
        {
            "part-00000.jsonl.zst": zstandard.ZstdCompressor().compress(
                b"".join(json.dumps(r).encode() + b"\n" for r in corpus_records[:10])
            ),
            "metrics/extra.jsonl": b'{"other": 1}\n',
            "eval.json": _pretty({"loss": 1.0}),
        },
    )
    write_output(
        prefix,
        "splits/corpus",
        "cccccccc",
        {
            "train/part-0.jsonl.gz": jsonl_gz(corpus_records[:7]),
            "validation/part-0.jsonl.gz": jsonl_gz(corpus_records[7:9]),
            "train/ledger.json": _pretty({"shards": 1}),
        },
    )
    write_output(
        prefix,
        "tokenizers/corpus",
        "dddddddd",
        {
            "tokenizer.json": b'{"version": "1.0", "model": {}}',
            "tokenizer_config.json": _pretty({"eos": "<|endoftext|>"}),
        },
    )
    entries = [
        AssetEntry("dedup/corpus", "deduplicated", "aaaaaaaa"),
        AssetEntry("raw/corpus", "sample_corpus", "bbbbbbbb"),
        AssetEntry("splits/corpus", "other", "cccccccc"),
        AssetEntry("tokenizers/corpus", "tokenizer", "dddddddd"),
    ]
    catalog = {d.name: d for d in resolve_catalog(prefix, entries)}
    assert sorted(catalog) == [
        "dedup/corpus",
        "raw/corpus",
        "splits/corpus",
    ]  # a tokenizer has no data
    rel = {name: sorted(f[len(d.path) + 1 :] for f in d.files) for name, d in catalog.items()}
    assert rel == {
        "dedup/corpus": ["documents/a.jsonl.gz", "documents/sub/b.jsonl.gz"],
        "raw/corpus": ["part-00000.jsonl.zst"],
        "splits/corpus": ["train/part-0.jsonl.gz", "validation/part-0.jsonl.gz"],
    }

    con = connect(list(catalog.values()), prefix)
    assert con.execute('SELECT count(*), count(DISTINCT id) FROM "dedup/corpus"').fetchone() == (
        35,
        35,
    )
    columns = [c[0] for c in con.execute('DESCRIBE "dedup/corpus"').fetchall()]
    assert sorted(columns) == ["id", "text", "title"]
    assert con.execute('SELECT count(*) FROM "raw/corpus"').fetchone() == (10,)
    assert con.execute('SELECT count(*) FROM "splits/corpus"').fetchone() == (9,)


def test_a_dataset_copy_of_several_formats_and_folders_is_one_table(tmp_path, corpus_records):
    """dataset() copies a user's folder as it is. Its view read only the most common format
    and, with files at the top level, none in subfolders: 18 of 22 records, no note."""
    import assets.dataset  # noqa: F401 -- registers the dataset kind's reader hint

    prefix = str(tmp_path / "data")
    records = [{"id": i, "text": f"record {i}"} for i in range(11)]
    parquet, csv = io.BytesIO(), io.BytesIO()
    pq.write_table(pa.Table.from_pylist(records[5:7]), parquet)
    pa.csv.write_csv(pa.Table.from_pylist(records[7:9]), csv)
    write_output(
        prefix,
        "raw/mine",
        "aaaaaaaa",
        {
            "a.jsonl": b"".join(json.dumps(r).encode() + b"\n" for r in records[:3]),
            "b.jsonl.gz": jsonl_gz(records[3:5]),
            "c.parquet": parquet.getvalue(),
            "d.csv": csv.getvalue(),
            "sub/e.jsonl": b"".join(json.dumps(r).encode() + b"\n" for r in records[9:]),
        },
    )
    [view] = resolve_catalog(prefix, [AssetEntry("raw/mine", "dataset", "aaaaaaaa")])
    assert view.format == "mixed" and len(view.files) == 5
    con = connect([view], prefix)
    rows = con.execute('SELECT id, text FROM "raw/mine" ORDER BY id').fetchall()
    assert rows == [(r["id"], r["text"]) for r in records]


def test_a_factory_can_name_plain_json_shards(tmp_path, corpus_records):
    prefix = str(tmp_path / "data")
    lines = b"".join(json.dumps(r).encode() + b"\n" for r in corpus_records)
    write_output(
        prefix,
        "raw/json",
        "aaaaaaaa",
        {"shards/part-0.json": lines, "stats.json": _pretty({"n": 40})},
    )
    assert resolve_catalog(prefix, [AssetEntry("raw/json", "k", "aaaaaaaa")]) == []
    [dataset] = resolve_catalog(
        prefix, [AssetEntry("raw/json", "k", "aaaaaaaa", files="shards/*.json")]
    )
    assert dataset.format == "jsonl" and connect([dataset], prefix).execute(
        'SELECT count(*) FROM "raw/json"'
    ).fetchone() == (40,)


def test_an_output_that_cannot_be_read_is_unavailable_not_fatal(tmp_path, corpus_records, caplog):
    prefix = str(tmp_path / "data")
    write_output(prefix, "raw/good", "aaaaaaaa", {"a.jsonl.gz": jsonl_gz(corpus_records)})
    bad = write_output(prefix, "raw/torn", "bbbbbbbb", {"a.jsonl.gz": jsonl_gz(corpus_records)})
    broken = write_output(prefix, "raw/garbage", "cccccccc", {"a.jsonl": b"not json at all\n"})
    with open(f"{bad}/.status.json", "w") as f:
        f.write('{"status": "SUCC')  # torn
    entries = [
        AssetEntry("raw/good", "k", "aaaaaaaa"),
        AssetEntry("raw/torn", "k", "bbbbbbbb"),
        AssetEntry("raw/garbage", "k", "cccccccc"),
    ]
    with caplog.at_level(logging.WARNING, logger="marin_dagster"):
        views = resolve_views(prefix, entries)
    assert [type(v).__name__ for v in views] == ["Dataset", "Unavailable", "Dataset"]
    assert views[1].name == "raw/torn" and ".status.json" in views[1].reason
    assert any("raw/torn" in r.getMessage() for r in caplog.records)
    assert [d.name for d in resolve_catalog(prefix, entries)] == ["raw/good", "raw/garbage"]

    datasets = [v for v in views if isinstance(v, Dataset)]
    with pytest.raises(ValueError, match="raw/garbage"):
        connect(datasets, prefix)  # strict by default: the stats asset wants to know
    unavailable: dict[str, str] = {}
    con = connect(datasets, prefix, unavailable)
    assert list(unavailable) == ["raw/garbage"]
    assert (
        f"{broken}/a.jsonl" in unavailable["raw/garbage"]
        and "rebuild raw/garbage (materialize it with op config force: true)"
        in unavailable["raw/garbage"]
    )
    assert con.execute('SELECT count(*) FROM "raw/good"').fetchone() == (40,)


def test_queries_on_gs_leave_no_reader_task_behind(gcs_prefix, corpus_records, caplog):
    """DuckDB drops the files it opens without closing them. Read through gcsfs's default
    background prefetcher, each left a task pending on fsspec's loop until the file was
    collected, and asyncio then logged "Task was destroyed but it is pending!": on every
    `marin sql` over gs://, and on and on in `marin sql --serve`."""
    import gc

    lines = "".join(json.dumps(r) + "\n" for r in corpus_records * 200).encode()
    write_output(gcs_prefix, "raw/corpus", "aaaaaaaa", {"part-00000.jsonl": lines})
    catalog = resolve_catalog(gcs_prefix, [AssetEntry("raw/corpus", "sample_corpus", "aaaaaaaa")])
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        for _ in range(3):
            con = connect(catalog, gcs_prefix)
            rows = con.execute('SELECT count(*) FROM "raw/corpus"').fetchone()
            assert rows == (200 * len(corpus_records),)
            con.close()
            del con
        gc.collect()
    assert not [r for r in caplog.records if "destroyed" in r.getMessage()]


def test_a_broken_line_in_a_copy_is_named_by_its_line_and_its_original(tmp_path):
    """DuckDB read an open string on into the next line and named that one (line 3 for
    line 2), named the copy, and advised rematerializing it, which skips: the view's error
    now gives the bad line as the reader counts it and the file to fix, the original."""
    from marin_dagster.execution.origins import write_origins

    prefix = str(tmp_path / "data")
    lines = b'{"text": "fine"}\n{"text": "left open\n{"text": "fine again"}\n'
    copy = write_output(prefix, "raw/notes", "dddddddd", {"notes.jsonl": lines})
    write_origins(copy, {"notes.jsonl": "/home/someone/notes.jsonl"})
    (dataset,) = resolve_catalog(prefix, [AssetEntry("raw/notes", "k", "dddddddd")])
    unavailable: dict[str, str] = {}
    connect([dataset], prefix, unavailable)
    reason = unavailable["raw/notes"]
    assert f"{copy}/notes.jsonl: line 2: invalid JSON" in reason, reason
    assert "line 3" not in reason
    assert (
        f"{copy}/notes.jsonl is raw/notes's copy of /home/someone/notes.jsonl: a fix to the file "
        "belongs there, not in the copy"
    ) in reason
    assert "rebuild" not in reason


def test_a_lone_surrogate_is_named_with_its_line_and_no_rebuild_advice(tmp_path):
    """dupekit keeps a lone surrogate as read and writes it as a JSON escape, which Python
    reads and DuckDB does not. The reason said "rebuild (force: true)", which writes the same
    line again, and DuckDB's line number was the next line's."""
    prefix = str(tmp_path / "data")
    lines = b'{"id": "ok", "text": "plain"}\n{"id": "lone", "text": "abc \\ud800 def"}\n'
    out = write_output(prefix, "dedup/s", "eeeeeeee", {"documents/a.jsonl": lines})
    (dataset,) = resolve_catalog(prefix, [AssetEntry("dedup/s", "k", "eeeeeeee")])
    unavailable: dict[str, str] = {}
    connect([dataset], prefix, unavailable)
    reason = unavailable["dedup/s"]
    assert (
        f"line 2 of {out}/documents/a.jsonl (record 1 of that file, from 0) holds a lone" in reason
    )
    assert "fix or remove that record's text where it comes from" in reason
    assert "force: true" not in reason
