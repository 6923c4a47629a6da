"""sorted_merge_join: inner, left, right and outer against a plain-Python join, duplicate
keys, unsorted input, and the shard-count check (Marin's tests)."""

from __future__ import annotations

import random

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


def _reference(left: list[dict], right: list[dict], how: str, combine) -> list:
    """A plain-Python join: every matching pair, then the unmatched rows `how` keeps."""
    out = []
    left_keys = {r["id"] for r in left}
    for lrow in left:
        matches = [r for r in right if r["id"] == lrow["id"]]
        out += [combine(lrow, r) for r in matches]
        if not matches and how in ("left", "outer"):
            out.append(combine(lrow, None))
    if how in ("right", "outer"):
        out += [combine(None, r) for r in right if r["id"] not in left_keys]
    return out


def _pair(left, right):
    return (left and left["l"], right and right["r"])


def test_every_join_type_matches_a_python_join(any_ctx: ZephyrContext) -> None:
    rng = random.Random(7)
    # Duplicate keys on both sides, keys only on one side, and a shard (of 4) that one
    # side leaves empty: ids 0-29 on the left, 15-44 on the right.
    left = [{"id": rng.randrange(0, 30), "l": f"l{i}"} for i in range(60)]
    right = [{"id": rng.randrange(15, 45), "r": f"r{i}"} for i in range(60)]
    for how in ("inner", "left", "right", "outer"):
        for combiner in (None, _pair):
            ds = _by_id(left, 4).sorted_merge_join(
                _by_id(right, 4), lambda r: r["id"], lambda r: r["id"], combiner, how=how
            )
            got = any_ctx.execute(ds).results
            want = _reference(left, right, how, combiner or _merge)
            assert sorted(map(repr, got)) == sorted(map(repr, want)), (how, combiner)
            if combiner is _pair and how != "inner":
                assert any(None in p for p in got), how  # None on the missing side


def _merge(left, right):
    return {**(left or {}), **(right or {})}


def test_unsorted_side_is_an_error(local_ctx: ZephyrContext) -> None:
    unsorted = Dataset.from_list([{"id": 2}, {"id": 1}])
    ds = Dataset.from_list([{"id": 1}, {"id": 2}]).sorted_merge_join(
        unsorted, lambda r: r["id"], lambda r: r["id"], how="outer"
    )
    with pytest.raises(ShardFailedError, match="right side is not sorted"):
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
        Dataset.from_list([]).sorted_merge_join(Dataset.from_list([]), str, str, how="cross")
