"""sorted_merge_join: inner, left, duplicate keys, and the shard-count check (Marin's tests)."""

from __future__ import annotations

import pytest

from marin_dagster.zephyr import Dataset, ShardFailedError, ZephyrContext


def _by_id(rows: list[dict], n: int) -> Dataset:
    return (
        Dataset.from_list(rows)
        .reshard(2)
        .group_by(key=lambda r: r["id"], reducer=lambda k, items: list(items), num_output_shards=n)
        .flat_map(lambda group: group)
    )


LEFT = [{"id": i, "name": f"doc{i}"} for i in range(8)]
RIGHT = [{"id": i, "score": i * 10} for i in range(0, 8, 2)]


def test_inner_join(any_ctx: ZephyrContext) -> None:
    ds = _by_id(LEFT, 3).sorted_merge_join(_by_id(RIGHT, 3), lambda r: r["id"], lambda r: r["id"])
    out = sorted(any_ctx.execute(ds).results, key=lambda r: r["id"])
    assert out == [{"id": i, "name": f"doc{i}", "score": i * 10} for i in range(0, 8, 2)]


def test_left_join(any_ctx: ZephyrContext) -> None:
    ds = _by_id(LEFT, 3).sorted_merge_join(
        _by_id(RIGHT, 3),
        lambda r: r["id"],
        lambda r: r["id"],
        how="left",
        combiner=lambda left, right: {**left, "score": right["score"] if right else None},
    )
    out = sorted(any_ctx.execute(ds).results, key=lambda r: r["id"])
    assert out == [
        {"id": i, "name": f"doc{i}", "score": i * 10 if i % 2 == 0 else None} for i in range(8)
    ]


def test_left_join_default_combiner_needs_both_sides(local_ctx: ZephyrContext) -> None:
    ds = _by_id(LEFT, 2).sorted_merge_join(
        _by_id(RIGHT, 2), lambda r: r["id"], lambda r: r["id"], how="left"
    )
    with pytest.raises(ShardFailedError, match="combiner"):
        local_ctx.execute(ds)


def test_duplicate_keys_give_every_pair(any_ctx: ZephyrContext) -> None:
    left = [{"id": 1, "l": "a"}, {"id": 1, "l": "b"}, {"id": 2, "l": "c"}]
    right = [{"id": 1, "r": "x"}, {"id": 1, "r": "y"}, {"id": 3, "r": "z"}]
    ds = _by_id(left, 2).sorted_merge_join(_by_id(right, 2), lambda r: r["id"], lambda r: r["id"])
    out = sorted((r["l"], r["r"]) for r in any_ctx.execute(ds).results)
    assert out == [("a", "x"), ("a", "y"), ("b", "x"), ("b", "y")]


def test_shard_count_mismatch(any_ctx: ZephyrContext) -> None:
    ds = _by_id(LEFT, 3).sorted_merge_join(_by_id(RIGHT, 2), lambda r: r["id"], lambda r: r["id"])
    with pytest.raises(ValueError, match="left has 3, right has 2"):
        any_ctx.execute(ds)


def test_unknown_join_type() -> None:
    with pytest.raises(ValueError, match="how="):
        Dataset.from_list([]).sorted_merge_join(Dataset.from_list([]), str, str, how="outer")
