"""`Dataset.write_levanter_cache` and the token-cache build as a Zephyr pipeline, on the
local and the Ray backend.

"Today's token cache" is what the format's own writer (`TokenCacheShardWriter`, then
`finalize_split` and `write_cache_stats`) writes when driven by a plain Python loop with no
Zephyr in between. Every comparison here is byte for byte, over every file of the cache
(ids, offsets, `.success` markers, ledgers, `.stats.json`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import cloudpickle
import numpy as np
import pytest

import tests
from marin_dagster.tokenize import TokenCache
from marin_dagster.tokenize.build import build_token_cache
from marin_dagster.tokenize.cache import (
    TokenCacheShardWriter,
    finalize_cache,
    finalize_split,
    shard_name,
    write_cache_stats,
)
from marin_dagster.tokenize.records import RecordCounts, held_out, iter_documents, read_records
from marin_dagster.tokenize.tokenizer import find_eos_id, load_tokenizer
from marin_dagster.zephyr import Dataset, ShardFailedError, ZephyrContext
from tests.tokenize.test_build import tree_bytes

# Functions defined here travel by value, so Ray workers need not import tests/.
cloudpickle.register_pickle_by_value(tests)


@pytest.fixture(scope="module", params=["local", "ray"])
def ctx(request: pytest.FixtureRequest) -> Iterator[ZephyrContext]:
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
    with ZephyrContext(max_workers=2, backend=request.param) as c:
        yield c


def _documents(seed: int = 0) -> list:
    """Token-id documents in every form the writer takes: lists, arrays, dicts, empties."""
    rng = np.random.default_rng(seed)
    docs: list = []
    for i in range(40):
        ids = rng.integers(0, 65536, size=int(rng.integers(0, 300)))
        if i % 3 == 0:
            docs.append(ids.tolist())
        elif i % 3 == 1:
            docs.append(ids.astype(np.int64))
        else:
            docs.append({"input_ids": ids.astype(np.uint16), "num_bytes": int(4 * ids.size)})
    return docs


def _split(items: list, n: int) -> list[list]:
    q, r = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        size = q + (1 if i < r else 0)
        out.append(items[start : start + size])
        start += size
    return out


def test_writer_output_equals_the_format_writers(tmp_path, ctx: ZephyrContext) -> None:
    docs = _documents()
    out = str(tmp_path / "zephyr")
    paths = ctx.execute(
        Dataset.from_list(docs)
        .reshard(3)
        .write_levanter_cache(f"{out}/train/part-{{shard:05d}}", dtype="uint16")
    ).results
    assert paths == [f"{out}/train/part-{i:05d}" for i in range(3)]
    finalize_cache(out, {"train": paths}, "uint16", None)

    ref = str(tmp_path / "reference")
    for i, part in enumerate(_split(docs, 3)):
        w = TokenCacheShardWriter(os.path.join(ref, "train", shard_name(i)), dtype="uint16")
        for d in part:
            if isinstance(d, dict):
                w.add(d["input_ids"], num_bytes=d["num_bytes"])
            else:
                w.add(d)
        w.finish()
    write_cache_stats(
        ref,
        {
            "train": finalize_split(
                f"{ref}/train", [shard_name(i) for i in range(3)], "uint16", None
            )
        },
    )

    got, want = tree_bytes(out), tree_bytes(ref)
    assert sorted(got) == sorted(want)
    assert all(got[name] == want[name] for name in want)
    cache = TokenCache.open(out)
    assert len(cache) == len(docs)
    for k, d in enumerate(docs):
        ids = d["input_ids"] if isinstance(d, dict) else d
        np.testing.assert_array_equal(cache[k], np.asarray(ids))


def test_writer_refuses_ids_outside_the_dtype_and_records_without_ids(tmp_path, ctx) -> None:
    with pytest.raises(
        ShardFailedError, match=r"token id 70000 does not fit the cache dtype uint16"
    ):
        ctx.execute(Dataset.from_list([[1, 70000]]).write_levanter_cache(str(tmp_path / "a")))
    with pytest.raises(
        ShardFailedError, match=r"record 1 has no 'input_ids' \(its keys: \['ids'\]\)"
    ):
        ctx.execute(
            Dataset.from_list([{"input_ids": [1]}, {"ids": [2]}]).write_levanter_cache(
                str(tmp_path / "b")
            )
        )
    with pytest.raises(ValueError, match="dtype must be 'uint16' or 'uint32'"):
        Dataset.from_list([[1]]).write_levanter_cache(str(tmp_path / "c"), dtype="int8")
    assert not (tmp_path / "a" / ".success").exists()
    assert not (tmp_path / "b" / ".success").exists()


def _fail_on(doc: list, bad: int) -> list:
    if doc and doc[0] == bad:
        raise RuntimeError("killed mid-shard")
    return doc


def test_a_failed_run_leaves_nothing_that_looks_finished_and_a_rerun_does_the_rest(
    tmp_path, ctx
) -> None:
    docs = [[k, k + 1, k + 2] for k in range(0, 60, 3)]  # 20 documents, 4 shards of 5
    out = str(tmp_path / "cache")
    pattern = f"{out}/train/part-{{shard:05d}}"
    # Shard 2 fails after writing some of its documents, every attempt.
    failing = (
        Dataset.from_list(docs)
        .reshard(4)
        .map(lambda d: _fail_on(d, 33))
        .write_levanter_cache(pattern, skip_existing=True)
    )
    with pytest.raises(ShardFailedError, match="killed mid-shard"):
        ctx.execute(failing)
    shard2 = tmp_path / "cache" / "train" / "part-00002"
    # No marker and no array under its final name: nothing a reader or a rerun could take
    # for a finished shard.
    assert not (shard2 / ".success").exists() and not (shard2 / "input_ids.npy").exists()
    done = sorted(p.parent.name for p in (tmp_path / "cache" / "train").glob("*/.success"))
    assert "part-00002" not in done
    before = {n: os.stat(f"{out}/train/{n}/input_ids.npy").st_mtime_ns for n in done}
    # A folder holding arrays but no .success (a writer killed between files) is redone too.
    os.makedirs(shard2, exist_ok=True)
    (shard2 / "input_ids.npy").write_bytes(b"partial")

    fixed = Dataset.from_list(docs).reshard(4).write_levanter_cache(pattern, skip_existing=True)
    result = ctx.execute(fixed)
    assert result.counters["partitions_skipped"] == len(done)
    assert {n: os.stat(f"{out}/train/{n}/input_ids.npy").st_mtime_ns for n in done} == before
    finalize_cache(out, {"train": result.results}, "uint16", None)
    assert [c.tolist() for c in TokenCache.open(out)] == docs


def _reference_build(
    files: list[str], tokenizer_dir: str, out: str, fraction: float, limits: list[int | None]
) -> None:
    """The token cache built without Zephyr: one plain loop over the documents, `encode`
    per document, the format's own shard writer."""
    tok = load_tokenizer(tokenizer_dir)
    eos = find_eos_id(tok, None)
    train, val = [], []
    for i, (path, limit) in enumerate(zip(files, limits, strict=True)):
        counts = RecordCounts()
        writers = {"train": TokenCacheShardWriter(f"{out}/train/{shard_name(i)}")}
        if fraction:
            writers["validation"] = TokenCacheShardWriter(f"{out}/validation/{shard_name(i)}")
        for doc in iter_documents(
            read_records(path), path, "text", "id", counts=counts, limit=limit
        ):
            ids = tok.encode(doc.text, add_special_tokens=False).ids + [eos]
            split = "validation" if fraction and held_out(doc.doc_id, fraction) else "train"
            writers[split].add(ids, num_bytes=doc.num_bytes)
        if fraction:
            writers["validation"].finish()
            val.append(shard_name(i))
        writers["train"].finish(
            {"num_records": counts.records, "num_empty": counts.empty, "num_bad": counts.bad}
        )
        train.append(shard_name(i))
    ledgers = {"train": finalize_split(f"{out}/train", train, "uint16", eos)}
    if val:
        ledgers["validation"] = finalize_split(f"{out}/validation", val, "uint16", eos)
    write_cache_stats(out, ledgers)


@pytest.mark.parametrize("fraction", [0.0, 0.2])
def test_build_equals_the_plain_reference(tmp_path, ctx, shakespeare_shards, bpe_dir, fraction):
    out = str(tmp_path / "built")
    sample_count = 100  # ends inside the third of four shards: a limit, then empty shards
    stats = build_token_cache(
        shakespeare_shards,
        bpe_dir,
        out,
        validation_fraction=fraction,
        sample_count=sample_count,
        context=ctx,
    )
    per_file = [
        sum(1 for _ in iter_documents(read_records(p), p, "text", "id")) for p in shakespeare_shards
    ]
    limits, left = [], sample_count
    for n in per_file:
        limits.append(min(n, left))
        left -= limits[-1]
    assert limits[-1] == 0 and limits[0] > 0
    ref = str(tmp_path / "reference")
    _reference_build(shakespeare_shards, bpe_dir, ref, fraction, limits)
    got, want = tree_bytes(out), tree_bytes(ref)
    assert sorted(got) == sorted(want)
    assert [n for n in want if got[n] != want[n]] == []
    assert stats.num_docs == sample_count and stats.shards_processed == len(shakespeare_shards)
    assert stats.num_records >= sample_count
