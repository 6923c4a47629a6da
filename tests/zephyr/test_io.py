"""Readers and writers: formats, compression, schema widening, {basename}, skip_existing."""

from __future__ import annotations

import gzip
import json
import os

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import zstandard

from marin_dagster.zephyr import Dataset, SchemaConflictError, ShardFailedError, ZephyrContext

ROWS = [{"id": i, "text": f"line {i}", "score": i / 10} for i in range(30)]


def _write_jsonl(path, rows) -> None:
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    if str(path).endswith(".gz"):
        data = gzip.compress(data)
    elif str(path).endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("ext", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_jsonl_round_trip(any_ctx: ZephyrContext, tmp_path, ext: str) -> None:
    _write_jsonl(tmp_path / f"in{ext}", ROWS)
    out = any_ctx.execute(
        Dataset.from_files(str(tmp_path / f"in{ext}"))
        .load_jsonl()
        .write_jsonl(str(tmp_path / f"out/{{basename}}-copy{ext}"))
    ).results
    assert out == [str(tmp_path / f"out/in-copy{ext}")]
    back = any_ctx.execute(Dataset.from_files(out[0]).load_file()).results
    assert back == ROWS


def test_parquet_csv_round_trip_and_row_group_splits(local_ctx: ZephyrContext, tmp_path) -> None:
    table = pa.Table.from_pylist(ROWS)
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=5)  # 6 row groups
    pacsv.write_csv(table, tmp_path / "in.csv")
    ds = Dataset.from_files(str(tmp_path / "in.parquet")).load_parquet(columns=["id", "text"])
    assert local_ctx.execute(ds).results == [{"id": r["id"], "text": r["text"]} for r in ROWS]
    size = pq.ParquetFile(tmp_path / "in.parquet").metadata.row_group(0).total_byte_size
    split = (
        Dataset.from_files(str(tmp_path / "in.parquet"))
        .load_parquet(approx_shard_bytes=2 * size)
        .map_shard(lambda items, info: [(info.shard_idx, len(list(items)))])
    )
    shards = local_ctx.execute(split).results
    assert len(shards) >= 3 and sum(n for _, n in shards) == 30
    assert (
        local_ctx.execute(Dataset.from_files(str(tmp_path / "in.csv")).load_csv()).results == ROWS
    )
    out = local_ctx.execute(Dataset.from_list(ROWS).write_csv(str(tmp_path / "o.csv"))).results
    assert pacsv.read_csv(out[0]).to_pylist() == ROWS


def test_a_parquet_column_the_file_lacks_is_named(local_ctx: ZephyrContext, tmp_path) -> None:
    """Arrow leaves out columns a file does not have: a misspelt one gave empty records."""
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "in.parquet")
    ds = Dataset.from_files(str(tmp_path / "in.parquet")).load_parquet(columns=["docid", "text"])
    with pytest.raises(
        ShardFailedError, match=r"in.parquet: no column 'docid'; its columns: id, text, score"
    ):
        local_ctx.execute(ds)


def test_include_file_paths(local_ctx: ZephyrContext, tmp_path) -> None:
    _write_jsonl(tmp_path / "a.jsonl", ROWS[:2])
    out = local_ctx.execute(
        Dataset.from_files(str(tmp_path / "*.jsonl")).load_jsonl(include_file_paths=True)
    ).results
    assert {r["file_path"] for r in out} == {str(tmp_path / "a.jsonl")}


def test_parquet_schema_widens(local_ctx: ZephyrContext, tmp_path, monkeypatch) -> None:
    rows = [{"a": 1, "b": None}] * 3 + [{"a": 2.5, "b": "x"}] + [{"a": 3, "c": [1, 2]}]
    from marin_dagster.zephyr import writers

    # Tiny buffers, so widening happens after rows were already written (the rewrite path).
    monkeypatch.setattr(writers, "PARQUET_ROWS", 2)
    ctx = ZephyrContext(backend="inline")
    out = ctx.execute(Dataset.from_list(rows).write_parquet(str(tmp_path / "w.parquet"))).results
    table = pq.read_table(out[0])
    assert table.schema.field("a").type == pa.float64()
    assert table.schema.field("b").type == pa.string()
    assert table.to_pylist() == [{"a": 1.0, "b": None, "c": None}] * 3 + [
        {"a": 2.5, "b": "x", "c": None},
        {"a": 3.0, "b": None, "c": [1, 2]},
    ]
    assert pq.ParquetFile(out[0]).metadata.row_group(0).column(0).compression == "ZSTD"


def test_parquet_records_with_other_keys_keep_every_field(tmp_path) -> None:
    """Uniform records take a fast path; a record with as many keys as the first but a
    different one, or with one more, must still keep every field (none dropped)."""
    from marin_dagster.zephyr.writers import write_parquet

    path = str(tmp_path / "k.parquet")
    same_count = [{"a": 1, "b": 2}, {"b": 3, "a": 4}, {"a": 5, "c": 6}]
    assert write_parquet(path, iter(same_count)).records == 3
    assert pq.read_table(path).to_pylist() == [
        {"a": 1, "b": 2, "c": None},
        {"a": 4, "b": 3, "c": None},
        {"a": 5, "b": None, "c": 6},
    ]
    one_more = [{"a": 1, "b": 2}, {"a": 7, "b": 8, "d": 9}]
    assert write_parquet(path, iter(one_more)).records == 2
    assert pq.read_table(path).to_pylist() == [
        {"a": 1, "b": 2, "d": None},
        {"a": 7, "b": 8, "d": 9},
    ]
    uniform = [{"a": i, "b": str(i)} for i in range(1000)]
    assert write_parquet(path, iter(uniform)).records == 1000
    assert pq.read_table(path).to_pylist() == uniform


def test_parquet_type_conflict_names_field(local_ctx: ZephyrContext, tmp_path) -> None:
    rows = [{"id": i, "tag": "t"} for i in range(5)] + [{"id": 5, "tag": {"nested": 1}}]
    with pytest.raises(ShardFailedError, match="'tag'") as err:
        local_ctx.execute(Dataset.from_list(rows).write_parquet(str(tmp_path / "bad.parquet")))
    assert isinstance(err.value.__cause__, SchemaConflictError)
    assert not os.listdir(tmp_path), "a failed write leaves no file behind"


def test_map_batches_and_select(any_ctx: ZephyrContext, tmp_path) -> None:
    import pyarrow.compute as pc

    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "in.parquet")
    ds = (
        Dataset.from_files(str(tmp_path / "*.parquet"))
        .load_parquet()
        .map_batches(lambda b: b.append_column("len", pc.utf8_length(b.column("text"))))
        .write_parquet(str(tmp_path / "out/{basename}.parquet"))
    )
    out = any_ctx.execute(ds).results
    assert pq.read_table(out[0]).column("len").to_pylist() == [len(r["text"]) for r in ROWS]
    sel = Dataset.from_list(ROWS).select("id").take_per_shard(3)
    assert any_ctx.execute(sel).results == [{"id": 0}, {"id": 1}, {"id": 2}]


def test_skip_existing_does_not_touch_or_rerun(any_ctx: ZephyrContext, tmp_path) -> None:
    for i in range(3):
        _write_jsonl(tmp_path / f"in-{i}.jsonl", [{"shard": i}])
    calls = tmp_path / "calls"
    calls.mkdir()

    def record_call(r: dict) -> dict:
        # One file per call: proves which shards' upstream ran, across processes.
        open(calls / f"{r['shard']}-{os.getpid()}-{len(os.listdir(calls))}", "w").close()
        return r

    out_pattern = str(tmp_path / "out/part-{shard:05d}-of-{total:05d}.jsonl")
    ds = (
        Dataset.from_files(str(tmp_path / "in-*.jsonl"))
        .load_jsonl()
        .map(record_call)
        .write_jsonl(out_pattern, skip_existing=True)
    )
    first = any_ctx.execute(ds)
    assert len(os.listdir(calls)) == 3 and first.counters["partitions_skipped"] == 0
    # Overwrite shard 1 with marker bytes and remove shard 2: only shard 2 may run again.
    with open(first.results[1], "wb") as f:
        f.write(b"marker bytes\n")
    os.remove(first.results[2])
    for f in os.listdir(calls):
        os.remove(calls / f)
    second = any_ctx.execute(ds)
    assert second.results == first.results
    assert [f.split("-")[0] for f in os.listdir(calls)] == ["2"]
    assert open(first.results[1], "rb").read() == b"marker bytes\n"
    assert second.counters["partitions_skipped"] == 2
    # Everything there: nothing runs at all, even after a barrier.
    for f in os.listdir(calls):
        os.remove(calls / f)
    grouped = (
        Dataset.from_files(str(tmp_path / "in-*.jsonl"))
        .load_jsonl()
        .map(record_call)
        .group_by(lambda r: r["shard"], lambda k, items: {"k": k}, num_output_shards=2)
        .write_jsonl(str(tmp_path / "g/{shard}.jsonl"), skip_existing=True)
    )
    any_ctx.execute(grouped)
    for f in os.listdir(calls):
        os.remove(calls / f)
    third = any_ctx.execute(grouped)
    assert os.listdir(calls) == [] and third.counters["partitions_skipped"] == 2


def test_dry_run_plans_without_running(tmp_path) -> None:
    calls: list[int] = []
    ds = (
        Dataset.from_list([1, 2])
        .map(lambda x: calls.append(x) or x)
        .filter(bool)
        .group_by(lambda x: x, lambda k, it: k)
        .map(str)
    )
    result = ZephyrContext(backend="inline").execute(ds, dry_run=True)
    assert calls == [] and result.results == []
    assert "2 stage(s)" in result.plan and "scatter" in result.plan


def test_local_io_never_imports_fsspec_in_a_worker(tmp_path) -> None:
    """A worker that reads, skips and writes local files starts and runs without fsspec
    (a fifth of its start-up): local paths and file:// URLs go through the OS."""
    _write_jsonl(tmp_path / "a.jsonl.gz", ROWS)
    _write_jsonl(tmp_path / "b.jsonl", ROWS)

    def seen(r: dict) -> dict:
        import sys

        return {**r, "fsspec": "fsspec" in sys.modules}

    def run() -> list[dict]:
        with ZephyrContext(max_workers=1, backend="local") as ctx:
            ctx.execute(
                Dataset.from_files(str(tmp_path / "*.jsonl*"))
                .load_jsonl()
                .map(seen)
                .write_parquet(f"file://{tmp_path}/out/{{basename}}.parquet")
            )
            out = f"file://{tmp_path}/out/*.parquet"
            return ctx.execute(Dataset.from_files(out).load_file().map(seen)).results

    rows = run()
    assert len(rows) == 2 * len(ROWS)
    assert not any(r["fsspec"] for r in rows)
    os.remove(tmp_path / "out" / "b.parquet")
    assert len(run()) == 2 * len(ROWS)  # the skip check and the rewrite are local too


@pytest.mark.parametrize("ext", [".jsonl", ".jsonl.gz", ".csv"])
def test_a_utf8_byte_order_mark_is_not_a_broken_first_line(local_ctx, tmp_path, ext) -> None:
    """Editors on Windows save UTF-8 with a byte order mark; the JSON parsers refused line 1
    ("Unexpected UTF-8 BOM"), the token cache too, and CSV's first column was named
    '\\ufeffid'."""
    from marin_dagster.tokenize.records import read_records
    from marin_dagster.zephyr.readers import iter_jsonl

    rows = [{"id": f"d{i}", "text": f"line {i}"} for i in range(3)]
    if ext == ".csv":
        data = "id,text\n" + "".join(f"{r['id']},{r['text']}\n" for r in rows)
    else:
        data = "".join(json.dumps(r) + "\n" for r in rows)
    raw = b"\xef\xbb\xbf" + data.encode()
    path = tmp_path / f"in{ext}"
    path.write_bytes(gzip.compress(raw) if ext.endswith(".gz") else raw)
    loaded = local_ctx.execute(Dataset.from_files(str(path)).load_file()).results
    assert loaded == rows
    assert [r for _, _, r in read_records(str(path))] == rows
    if ext == ".jsonl":  # a stream with no peek (fsspec's memory files), read past it too
        from marin_dagster import fs

        fs.write_bytes("memory://bom/in.jsonl", raw)
        assert list(iter_jsonl("memory://bom/in.jsonl")) == rows


@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"])
def test_a_stream_that_cannot_seek_back_loses_no_byte_to_the_mark_check(tmp_path, bom) -> None:
    """fsspec streams an HTTP file it cannot range (HTTPStreamFile): the check read three
    bytes it could not put back. Served here by a real HTTP server."""
    import functools
    import http.server
    import threading

    import fsspec

    from marin_dagster.zephyr.readers import _past_bom

    body = b'{"text": "one"}\n{"text": "two"}\n'
    (tmp_path / "in.jsonl").write_bytes(bom + body)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/in.jsonl"
        with fsspec.filesystem("http").open(url, "rb", block_size=0) as f:
            assert type(f).__name__ == "HTTPStreamFile"
            assert _past_bom(f).read() == body
    finally:
        server.shutdown()
        server.server_close()
