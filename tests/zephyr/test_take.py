"""take(n) / limit(n): the first n records of the whole dataset, and reading stops there."""

from __future__ import annotations

import itertools
import json

from marin_dagster.zephyr import Dataset, ZephyrContext


def test_take_stops_an_endless_source(any_ctx: ZephyrContext) -> None:
    # itertools.count never ends: only a take that stops pulling lets this finish.
    endless = Dataset.from_list([0]).flat_map(lambda _: itertools.count())
    assert any_ctx.execute(endless.take(5)).results == [0, 1, 2, 3, 4]
    assert any_ctx.execute(endless.limit(3).map(lambda x: -x)).results == [0, -1, -2]


def test_take_keeps_dataset_order_across_shards(any_ctx: ZephyrContext) -> None:
    ds = Dataset.from_list(list(range(100))).reshard(4)  # 25 records a shard
    assert any_ctx.execute(ds.take(30)).results == list(range(30))
    after = ds.filter(lambda x: x % 3 == 0).take(12).map(lambda x: x * 2)
    assert any_ctx.execute(after).results == [x * 2 for x in range(0, 36, 3)]
    assert any_ctx.execute(ds.take(0)).results == []
    assert any_ctx.execute(ds.take(1000)).results == list(range(100))


def test_take_reads_only_the_shards_it_needs(tmp_path) -> None:
    for f in range(10):
        lines = [json.dumps({"file": f, "i": i}) for i in range(100)]
        (tmp_path / f"part-{f}.jsonl").write_text("\n".join(lines) + "\n")
    ds = Dataset.from_files(str(tmp_path / "*.jsonl")).load_jsonl().take(7)
    with ZephyrContext(max_workers=2) as ctx:
        result = ctx.execute(ds)
    assert result.results == [{"file": 0, "i": i} for i in range(7)]
    # 10 files of 100 records: at most the two shards started at once ran, each reading
    # no more than the 7 records take needs.
    assert result.counters["shards"] <= 2
    assert result.counters["records_in"] <= 14
    assert result.counters["records_out"] == 7


def test_take_then_write(local_ctx: ZephyrContext, tmp_path) -> None:
    ds = Dataset.from_list(list(range(50))).reshard(5).take(12)
    out = local_ctx.execute(ds.write_jsonl(str(tmp_path / "out-{shard}.jsonl"))).results
    assert len(out) == 1
    assert [json.loads(x) for x in open(out[0])] == list(range(12))
