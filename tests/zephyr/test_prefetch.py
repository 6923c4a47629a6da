"""Prefetch: batch stages overlap reading, the user's function and writing in threads."""

from __future__ import annotations

import contextvars
import threading
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from marin_dagster.zephyr import Dataset, ShardFailedError, ZephyrContext, counters
from marin_dagster.zephyr.prefetch import prefetch

_var: contextvars.ContextVar[str] = contextvars.ContextVar("test_prefetch_var", default="unset")


def test_prefetch_yields_in_order_runs_ahead_and_sees_the_callers_context() -> None:
    produced: list[int] = []
    seen: list[str] = []

    def source():
        for i in range(10):
            seen.append(_var.get())
            produced.append(i)
            yield i

    _var.set("caller")
    it = prefetch(source(), depth=2)
    assert next(it) == 0
    deadline = time.monotonic() + 5
    while len(produced) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(produced) >= 3, "the thread reads ahead while the consumer holds an item"
    assert list(it) == list(range(1, 10))
    assert set(seen) == {"caller"}


def test_prefetch_raises_the_sources_error_unchanged() -> None:
    def source():
        yield 1
        raise KeyError("missing field 'text'")

    it = prefetch(source())
    assert next(it) == 1
    with pytest.raises(KeyError, match="missing field 'text'"):
        next(it)


def test_closing_early_stops_the_thread_and_closes_the_source() -> None:
    closed = threading.Event()

    def source():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    before = threading.active_count()
    it = prefetch(source(), depth=1)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    it.close()
    assert closed.is_set()
    assert threading.active_count() == before


def _count_and_lengthen(b: pa.RecordBatch) -> pa.RecordBatch:
    counters.increment("batch_rows", b.num_rows)
    return b.append_column("len", pc.utf8_length(b.column("text")))


def _fails_on_seven(b: pa.RecordBatch) -> pa.RecordBatch:
    if 7 in b.column("id").to_pylist():
        raise ValueError("id 7 is not allowed")
    return b


def test_batch_stage_counters_and_fatal_errors_cross_the_threads(
    local_ctx: ZephyrContext, tmp_path
) -> None:
    for i in range(2):
        pq.write_table(
            pa.Table.from_pylist([{"id": i * 100 + j, "text": "x" * j} for j in range(50)]),
            tmp_path / f"in-{i}.parquet",
        )
    ds = (
        Dataset.from_files(str(tmp_path / "in-*.parquet"))
        .load_parquet()
        .map_batches(_count_and_lengthen)
        .write_parquet(str(tmp_path / "out/{basename}.parquet"))
    )
    result = local_ctx.execute(ds)
    assert result.counters["batch_rows"] == 100
    assert result.counters["records_written"] == 100
    back = pq.read_table(sorted(result.results)[0])
    assert back.column("len").to_pylist() == list(range(50))

    bad = (
        Dataset.from_files(str(tmp_path / "in-*.parquet"))
        .load_parquet()
        .map_batches(_fails_on_seven)
        .write_parquet(str(tmp_path / "bad/{basename}.parquet"))
    )
    with pytest.raises(ShardFailedError, match="id 7 is not allowed") as err:
        local_ctx.execute(bad)
    assert isinstance(err.value.__cause__, ValueError)
    assert not (tmp_path / "bad" / "in-0.parquet").exists()
