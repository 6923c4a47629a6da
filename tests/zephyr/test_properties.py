"""Property tests: group_by, deduplicate, count, reduce and shuffle equal plain Python on random
data, on the local backend and on a real local Ray cluster."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marin_dagster.zephyr import Dataset, ZephyrContext

keys = st.one_of(st.integers(-5, 5), st.sampled_from(["a", "b", "c", "é", ""]))
records = st.lists(st.tuples(keys, st.integers(-1000, 1000)), max_size=60)
shards = st.integers(1, 4)
SETTINGS = settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@SETTINGS
@given(rows=records, n_in=shards, n_out=shards)
def test_group_by_matches_python(any_ctx: ZephyrContext, rows, n_in, n_out) -> None:
    ds = (
        Dataset.from_list(rows)
        .reshard(n_in)
        .group_by(
            key=lambda r: r[0],
            reducer=lambda k, items: (k, sorted(v for _, v in items)),
            num_output_shards=n_out,
        )
    )
    expected: dict = {}
    for k, v in rows:
        expected.setdefault(k, []).append(v)
    out = any_ctx.execute(ds).results
    assert len(out) == len(expected)
    assert dict(out) == {k: sorted(v) for k, v in expected.items()}


@SETTINGS
@given(rows=records, n_in=shards)
def test_deduplicate_count_reduce_match_python(any_ctx: ZephyrContext, rows, n_in) -> None:
    ds = Dataset.from_list(rows).reshard(n_in)
    deduped = any_ctx.execute(ds.deduplicate(key=lambda r: r[0])).results
    assert Counter(k for k, _ in deduped) == Counter({k for k, _ in rows})  # each key once
    assert all((k, v) in rows for k, v in deduped)
    assert any_ctx.execute(ds.count()).results == [len(rows)]
    total = any_ctx.execute(ds.reduce(lambda items: sum(v for _, v in items), sum)).results
    assert total == [sum(v for _, v in rows)]


@SETTINGS
@given(rows=records, n_in=shards, seed=st.integers(0, 2**31))
def test_shuffle_is_a_permutation(any_ctx: ZephyrContext, rows, n_in, seed) -> None:
    out = any_ctx.execute(Dataset.from_list(rows).reshard(n_in).shuffle(seed)).results
    assert Counter(out) == Counter(rows)


def test_backends_agree(local_ctx: ZephyrContext, ray_ctx: ZephyrContext) -> None:
    ds = (
        Dataset.from_list([(i % 13, i) for i in range(300)])
        .reshard(3)
        .group_by(
            lambda r: r[0], lambda k, items: (k, sum(v for _, v in items)), num_output_shards=2
        )
        .shuffle(seed=3)
    )
    assert local_ctx.execute(ds).results == ray_ctx.execute(ds).results
