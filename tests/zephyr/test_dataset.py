"""The Dataset API, mirroring Marin's lib/zephyr tests (test_dataset.py)."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from marin_dagster.zephyr import Dataset, ShardInfo, ZephyrContext


def test_from_list_preserves_order(any_ctx: ZephyrContext) -> None:
    items = list(range(50, 0, -1))
    assert any_ctx.execute(Dataset.from_list(items)).results == items
    assert any_ctx.execute(Dataset.from_list(items).reshard(7)).results == items


def test_map_filter_flat_map(any_ctx: ZephyrContext) -> None:
    ds = (
        Dataset.from_list(list(range(10)))
        .reshard(3)
        .map(lambda x: x * 2)
        .filter(lambda x: x % 3 == 0)
        .flat_map(lambda x: [x, -x])
    )
    assert any_ctx.execute(ds).results == [0, 0, 6, -6, 12, -12, 18, -18]


def test_dataset_is_lazy() -> None:
    calls: list[int] = []
    ds = Dataset.from_list([1, 2, 3]).map(lambda x: calls.append(x) or x)
    assert calls == []
    assert ZephyrContext(backend="inline").execute(ds).results == [1, 2, 3]
    assert calls == [1, 2, 3]


def test_window() -> None:
    ctx = ZephyrContext(backend="inline")
    assert ctx.execute(Dataset.from_list([1, 2, 3, 4, 5]).window(2)).results == [
        [1, 2],
        [3, 4],
        [5],
    ]
    ds = Dataset.from_list([3, 4, 5, 1]).window_by(lambda total, x: (total + x <= 7, total + x), 0)
    assert ctx.execute(ds).results == [[3, 4], [5, 1]]


def test_reshard_zero_raises() -> None:
    with pytest.raises(ValueError, match="positive"):
        Dataset.from_list([1]).reshard(0)


def test_empty_datasets(any_ctx: ZephyrContext, tmp_path) -> None:
    assert any_ctx.execute(Dataset.from_list([]).map(lambda x: x)).results == []
    assert any_ctx.execute(Dataset.from_list([]).count()).results == [0]
    ds = Dataset.from_files(str(tmp_path / "nothing-*.jsonl"), empty_glob_ok=True).load_jsonl()
    assert any_ctx.execute(ds).results == []
    assert (
        any_ctx.execute(Dataset.from_list([]).write_jsonl(str(tmp_path / "o.jsonl"))).results == []
    )


def test_no_match_names_pattern(tmp_path) -> None:
    pattern = str(tmp_path / "missing-*.jsonl")
    with pytest.raises(FileNotFoundError, match="missing-"):
        ZephyrContext(backend="inline").execute(Dataset.from_glob(pattern).load_jsonl())


def test_shard_pattern_required(local_ctx: ZephyrContext, tmp_path) -> None:
    ds = Dataset.from_list(list(range(4))).reshard(2).map(lambda x: {"x": x})
    with pytest.raises(ValueError, match="shard"):
        local_ctx.execute(ds.write_jsonl(str(tmp_path / "out.jsonl")))
    # One shard needs no placeholder.
    out = local_ctx.execute(ds.reshard(1).write_jsonl(str(tmp_path / "out.jsonl"))).results
    assert out == [str(tmp_path / "out.jsonl")]


def test_map_shard_info_and_files(any_ctx: ZephyrContext, tmp_path) -> None:
    for i in range(3):
        with gzip.open(tmp_path / f"in-{i}.jsonl.gz", "wt") as f:
            for j in range(4):
                f.write(json.dumps({"i": i, "j": j}) + "\n")

    def tag(items, info: ShardInfo):
        for r in items:
            yield {
                **r,
                "shard": info.shard_idx,
                "of": info.total_shards,
                "src": os.path.basename(info.source_path),
            }

    ds = Dataset.from_files(str(tmp_path / "*.jsonl.gz")).load_jsonl().map_shard(tag)
    out = any_ctx.execute(ds).results
    assert len(out) == 12
    assert {(r["i"], r["shard"], r["of"], r["src"]) for r in out} == {
        (i, i, 3, f"in-{i}.jsonl.gz") for i in range(3)
    }


def test_group_by_writes_exact_shard_count(any_ctx: ZephyrContext, tmp_path) -> None:
    ds = (
        Dataset.from_list([{"k": i % 10, "v": i} for i in range(100)])
        .reshard(4)
        .group_by(
            key=lambda r: r["k"],
            reducer=lambda k, items: {"k": k, "n": sum(1 for _ in items)},
            num_output_shards=3,
        )
        .write_jsonl(str(tmp_path / "g-{shard:05d}-of-{total:05d}.jsonl"))
    )
    paths = any_ctx.execute(ds).results
    assert len(paths) == 3 and sorted(os.listdir(tmp_path)) == [os.path.basename(p) for p in paths]
    rows = [json.loads(line) for p in paths for line in open(p)]
    assert sorted((r["k"], r["n"]) for r in rows) == [(k, 10) for k in range(10)]


def test_map_batches_on_records_and_from_iterable() -> None:
    import pyarrow.compute as pc

    ctx = ZephyrContext(backend="inline")
    ds = Dataset.from_iterable({"x": i} for i in range(10)).map_batches(
        lambda b: b.append_column("y", pc.multiply(b.column("x"), 2)), batch_size=3
    )
    assert ctx.execute(ds).results == [{"x": i, "y": 2 * i} for i in range(10)]
    with pytest.raises(Exception, match="RecordBatch"):
        ctx.execute(Dataset.from_list([{"x": 1}]).map_batches(lambda b: 5))


def test_reshard_file_list_before_loading(local_ctx: ZephyrContext, tmp_path) -> None:
    for i in range(5):
        (tmp_path / f"f{i}.jsonl").write_text(json.dumps({"i": i}) + "\n")
    ds = (
        Dataset.from_files(str(tmp_path / "*.jsonl"))
        .reshard(2)
        .load_jsonl()
        .map_shard(lambda items, info: [(info.shard_idx, [r["i"] for r in items])])
    )
    assert local_ctx.execute(ds).results == [(0, [0, 1, 2]), (1, [3, 4])]


def test_stage_resources_limit_concurrency(tmp_path) -> None:
    import time

    running = tmp_path / "running"
    running.mkdir()

    def task(items, info):
        marker = running / str(info.shard_idx)
        marker.touch()
        seen, deadline = 1, time.monotonic() + 0.5
        while time.monotonic() < deadline and seen < 2:  # a second task would show up here
            seen = max(seen, len(os.listdir(running)))
        marker.unlink()
        return [(len(list(items)), seen)]

    ds = Dataset.from_list(list(range(3))).reshard(3).map_shard(task)
    with ZephyrContext(max_workers=2, stage_resources={"map_shard": {"num_cpus": 2}}) as ctx:
        assert ctx.execute(ds).results == [(1, 1), (1, 1), (1, 1)]
