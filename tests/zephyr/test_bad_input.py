"""Bad input files, seen from Zephyr's user: a truncated, corrupt or mis-encoded file fails the
run at once (no retry) with an error naming the file (and, for JSONL, the 1-based line); it is
never read as a shorter file."""

from __future__ import annotations

import bz2
import gzip
import json
import os
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from marin_dagster.zephyr import Dataset, InputError, ShardFailedError, ZephyrContext

ROWS = [{"id": i, "text": f"document number {i}"} for i in range(200)]


def _jsonl_bytes(rows: list[dict]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _write(path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def _fails_once(ctx: ZephyrContext, ds: Dataset, *needles: str) -> ShardFailedError:
    with pytest.raises(ShardFailedError) as err:
        ctx.execute(ds)
    msg = str(err.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg}"
    assert err.value.attempts == 1, "a bad input file is not a transient error: no retry"
    assert isinstance(err.value.__cause__, InputError)
    return err.value


def test_zst_reads_completely(local_ctx: ZephyrContext, tmp_path) -> None:
    path = _write(tmp_path / "a.jsonl.zst", zstandard.ZstdCompressor().compress(_jsonl_bytes(ROWS)))
    res = local_ctx.execute(Dataset.from_files(path).load_jsonl())
    assert sorted(r["id"] for r in res.results) == list(range(200))
    assert res.counters["records_in"] == 200


def test_multi_frame_zst_reads_completely(local_ctx: ZephyrContext, tmp_path) -> None:
    c = zstandard.ZstdCompressor()
    data = c.compress(_jsonl_bytes(ROWS[:50])) + c.compress(_jsonl_bytes(ROWS[50:]))
    path = _write(tmp_path / "a.jsonl.zst", data)
    res = local_ctx.execute(Dataset.from_files(path).load_jsonl())
    assert [r["id"] for r in res.results] == list(range(200))


def test_truncated_small_zst_is_refused(local_ctx: ZephyrContext, tmp_path) -> None:
    data = zstandard.ZstdCompressor().compress(_jsonl_bytes(ROWS[:5]))
    path = _write(tmp_path / "small.jsonl.zst", data[: len(data) - 3])
    _fails_once(local_ctx, Dataset.from_files(path).load_jsonl(), "small.jsonl.zst", "truncated")


def test_truncated_gz_is_refused_without_retry(local_ctx: ZephyrContext, tmp_path) -> None:
    data = gzip.compress(_jsonl_bytes(ROWS))
    path = _write(tmp_path / "cut.jsonl.gz", data[: len(data) // 2])
    ctx = ZephyrContext(max_workers=1, backend="inline", max_shard_failures=3)
    err = _fails_once(
        ctx,
        Dataset.from_files(path).load_jsonl(),
        "cut.jsonl.gz",
        "truncated or corrupt gzip stream",
        "re-download or regenerate",
    )
    assert "EOFError" not in str(err).split("\n")[0]


def test_truncated_gz_in_batch_mode_is_refused(local_ctx: ZephyrContext, tmp_path) -> None:
    data = gzip.compress(_jsonl_bytes(ROWS))
    path = _write(tmp_path / "cut.jsonl.gz", data[:-6])
    ds = (
        Dataset.from_files(path)
        .load_jsonl()
        .map_batches(lambda b: b)
        .write_parquet(str(tmp_path / "out-{shard}.parquet"))
    )
    _fails_once(local_ctx, ds, "cut.jsonl.gz", "truncated or corrupt gzip stream")


def test_empty_compressed_file_is_refused(local_ctx: ZephyrContext, tmp_path) -> None:
    path = _write(tmp_path / "empty.jsonl.gz", b"")
    _fails_once(local_ctx, Dataset.from_files(path).load_jsonl(), "empty.jsonl.gz")


def test_invalid_utf8_names_file_and_line(local_ctx: ZephyrContext, tmp_path) -> None:
    lines = [json.dumps(r).encode() for r in ROWS[:3]] + [b"", b""]
    lines.append(b'{"id": 5, "text": "caf\xe9 au lait"}')
    path = _write(tmp_path / "latin1.jsonl", b"\n".join(lines) + b"\n")
    _fails_once(local_ctx, Dataset.from_files(path).load_jsonl(), "latin1.jsonl", "line 6", "UTF-8")


def test_invalid_json_error_names_the_line_not_the_record(
    local_ctx: ZephyrContext, tmp_path
) -> None:
    lines = [json.dumps(r) for r in ROWS[:3]] + ["", "", '{"id": 5, "text": ']
    path = _write(tmp_path / "broken.jsonl", "\n".join(lines).encode() + b"\n")
    err = _fails_once(local_ctx, Dataset.from_files(path).load_jsonl(), "broken.jsonl", "line 6")
    assert "record 2 of" not in str(err)


@pytest.mark.parametrize("end", [b"\n", b""])
def test_a_string_left_open_is_named_as_such(tmp_path, end) -> None:
    """The stdlib called the line's own newline an "Invalid control character"."""
    from marin_dagster.zephyr.readers import iter_jsonl

    path = _write(
        tmp_path / "open.jsonl", b'{"id": 1, "text": "ok"}\n{"id": 20, "text": "unte' + end
    )
    with pytest.raises(InputError) as err:
        list(iter_jsonl(path))
    assert str(err.value) == (
        f"{path}: line 2: invalid JSON (a string is left open: no closing quote before the end "
        "of the line); fix or remove that line"
    )


def test_user_error_names_the_line(local_ctx: ZephyrContext, tmp_path) -> None:
    # Records 0..3 on lines 1, 2, 4, 6: the failing record 3 is on line 6.
    lines = [
        json.dumps(ROWS[0]),
        json.dumps(ROWS[1]),
        "",
        json.dumps(ROWS[2]),
        "",
        json.dumps({"id": "bad", "text": "x"}),
    ]
    path = _write(tmp_path / "gaps.jsonl", "\n".join(lines).encode() + b"\n")

    def check(r: dict) -> dict:
        if r["id"] == "bad":
            raise ValueError("bad id")
        return r

    with pytest.raises(ShardFailedError) as err:
        local_ctx.execute(Dataset.from_files(path).load_jsonl().map(check))
    assert "line 6 of" in str(err.value) and "gaps.jsonl" in str(err.value)


def _open_second(item: str) -> str:
    if item == "b.jsonl":
        raise ValueError("b.jsonl: line 2: record 1 has no 'text' field")
    return item


def test_an_error_over_an_in_memory_input_names_the_item(local_ctx: ZephyrContext) -> None:
    """Over a list (files a task opens itself, as dedup's), the position is an item of the
    list: "record 0" read as the record the cause's own message names by line."""
    ds = Dataset.from_list(["a.jsonl", "b.jsonl"]).reshard(1).map(_open_second)
    with pytest.raises(ShardFailedError) as err:
        local_ctx.execute(ds)
    assert "failed at item 1 of its input: ValueError: b.jsonl: line 2: record 1" in str(err.value)


def _fails_on_33(record: dict) -> dict:
    if record["i"] == 33:
        raise ValueError("bad record")
    return record


def _reduce_fails_on_3(key: int, items: Iterator[dict]) -> tuple[int, int]:
    if key == 3:
        raise ValueError("reducer failed")
    return key, sum(1 for _ in items)


def test_an_error_after_a_reshard_or_a_shuffle_names_the_item_and_key(
    local_ctx: ZephyrContext, tmp_path
) -> None:
    """After a reshard or a group_by, an error on record 33 said "failed at its start", and
    a reducer's error named no key."""
    for f in range(2):
        _write(
            tmp_path / f"{f}.jsonl",
            "".join(json.dumps({"i": f * 50 + i}) + "\n" for i in range(50)).encode(),
        )
    files = Dataset.from_files(str(tmp_path / "*.jsonl")).load_jsonl()
    with pytest.raises(ShardFailedError) as err:
        local_ctx.execute(files.reshard(3).map(_fails_on_33))
    # record 33 is the first of the second of three shards of 33, 33 and 34 records
    assert "shard 1 of 3 (attempt 1) failed at item 0 of its input" in str(err.value)
    with pytest.raises(ShardFailedError) as err:
        local_ctx.execute(files.group_by(key=lambda r: r["i"] % 7, reducer=_reduce_fails_on_3))
    assert "failed at item 3 of its input: ValueError: reducer failed" in str(err.value)
    assert err.value.__cause__.__notes__ == ["raised by the reducer of key 3"]


def test_truncated_parquet_names_the_file(local_ctx: ZephyrContext, tmp_path) -> None:
    good = tmp_path / "good.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), good)
    data = good.read_bytes()
    path = _write(tmp_path / "cut.parquet", data[: len(data) - 10])
    _fails_once(
        local_ctx,
        Dataset.from_files(path).load_parquet(),
        "cut.parquet",
        "not a complete Parquet file",
    )


@pytest.mark.parametrize(
    "name, compress, load, says",
    [
        ("e.jsonl", gzip.compress, "load_jsonl", "name it e.jsonl.gz"),
        # a gzip CSV under a plain name read as no records at all, with no error
        ("c.csv", gzip.compress, "load_csv", "name it c.csv.gz"),
        ("z.jsonl", zstandard.compress, "load_jsonl", "name it z.jsonl.zst"),
        ("b.jsonl", bz2.compress, "load_jsonl", "name it b.jsonl.bz2"),
    ],
)
def test_a_compressed_file_under_a_plain_name_is_named_as_such(
    local_ctx: ZephyrContext, tmp_path, name, compress, load, says
) -> None:
    """It was read as text: invalid UTF-8 "(re-encode it from Latin-1)" for JSON lines, and
    no records for a CSV."""
    body = b"id,text\n1,one\n" if name.endswith(".csv") else json.dumps(ROWS[0]).encode() + b"\n"
    path = _write(tmp_path / name, compress(body))
    _fails_once(local_ctx, getattr(Dataset.from_files(path), load)(), name, "-compressed", says)


def test_csv_documents_of_megabytes_and_of_many_lines_read_whole(
    local_ctx: ZephyrContext, tmp_path
) -> None:
    """A 5 MB field failed with Arrow's "straddling object straddles two block boundaries
    (try to increase block size?)", a setting users cannot reach; a quoted value of many
    lines failed where it crossed a block ("Expected 2 columns, got 1")."""
    words = "word " * 1_000_000
    lines = "a line of a paragraph\n" * 200_000
    rows = [f'1,"{words}"', f'2,"{lines}"'] + [
        f'{i},"line one\nline two"' for i in range(3, 20_000)
    ]
    path = _write(tmp_path / "long.csv", ("id,text\n" + "\n".join(rows) + "\n").encode())
    out = local_ctx.execute(Dataset.from_files(path).load_csv()).results
    assert [len(r["text"]) for r in out[:2]] == [len(words), len(lines)]
    assert len(out) == 19_999 and out[-1] == {"id": 19_999, "text": "line one\nline two"}


def test_corrupt_csv_names_file_and_line(local_ctx: ZephyrContext, tmp_path) -> None:
    body = b"id,text\n1,one\n2,two\n3,caf\xe9\n4,four\n"
    path = _write(tmp_path / "latin1.csv", body)
    _fails_once(local_ctx, Dataset.from_files(path).load_csv(), "latin1.csv", "line 4")


def test_good_and_truncated_file_never_give_the_good_half(
    local_ctx: ZephyrContext, tmp_path
) -> None:
    os.makedirs(tmp_path / "in")
    _write(tmp_path / "in" / "a.jsonl.zst", zstandard.ZstdCompressor().compress(_jsonl_bytes(ROWS)))
    data = zstandard.ZstdCompressor().compress(_jsonl_bytes(ROWS))
    _write(tmp_path / "in" / "b.jsonl.zst", data[: len(data) * 2 // 3])
    _fails_once(
        local_ctx,
        Dataset.from_files(str(tmp_path / "in" / "*.jsonl.zst")).load_jsonl(),
        "b.jsonl.zst",
    )


def test_invalid_utf8_in_a_later_csv_block_names_the_line(
    local_ctx: ZephyrContext, tmp_path
) -> None:
    # Arrow reads CSV in 1 MB blocks: the bad byte is far past the first one.
    rows = [f"{i},line number {i} of a long file".encode() for i in range(60_000)]
    rows[55_000] = b"55000,caf\xe9"
    path = _write(tmp_path / "long.csv", b"id,text\n" + b"\n".join(rows) + b"\n")
    _fails_once(local_ctx, Dataset.from_files(path).load_csv(), "long.csv", "line 55002")


def test_a_failed_read_from_storage_is_not_an_input_error(tmp_path, monkeypatch) -> None:
    """A Parquet read that fails in the storage layer stays itself (retried), not InputError."""
    from marin_dagster import fs
    from marin_dagster.zephyr import readers

    path = str(tmp_path / "good.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS), path)

    class Flaky:
        def __init__(self, f):
            self._f = f

        def read(self, *args):
            raise ConnectionError("storage hiccup")

        def __getattr__(self, name):
            return getattr(self._f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

    real = fs.open_read
    monkeypatch.setattr(readers.fs, "open_read", lambda p: Flaky(real(p)))
    with pytest.raises(ConnectionError):
        list(readers.iter_parquet_batches(path))
