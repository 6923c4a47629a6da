"""Compressed and damaged input files, seen from the tokenizer's user: a valid .jsonl.zst trains
and tokenizes; a truncated or corrupt file fails naming the file, never as a shorter corpus."""

from __future__ import annotations

import gzip
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from marin_dagster.tokenize import (
    TokenCache,
    build_token_cache,
    iter_texts,
    train_tokenizer_from_files,
)
from marin_dagster.tokenize.records import RecordCounts
from marin_dagster.zephyr import InputError

RECORDS = [{"id": f"d{i}", "text": f"to be or not to be, that is question {i}"} for i in range(60)]


def _jsonl(records: list[dict]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def _write(path, data: bytes) -> str:
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def test_tokenizer_trains_on_a_zst_file(tmp_path) -> None:
    path = _write(
        tmp_path / "in" / "a.jsonl.zst", zstandard.ZstdCompressor().compress(_jsonl(RECORDS))
    )
    assert list(iter_texts([path])) == [r["text"] for r in RECORDS]
    out = train_tokenizer_from_files(
        [path], str(tmp_path / "tok"), vocab_size=300, held_out_fraction=0.0
    )
    assert out.config["num_records"] == len(RECORDS)


def test_token_cache_of_a_zst_file(tmp_path, bpe_dir) -> None:
    path = _write(
        tmp_path / "in" / "a.jsonl.zst", zstandard.ZstdCompressor().compress(_jsonl(RECORDS))
    )
    stats = build_token_cache([path], bpe_dir, str(tmp_path / "c"), backend="inline")
    assert stats.num_records == len(RECORDS)
    assert TokenCache.open(str(tmp_path / "c")).num_docs == len(RECORDS)


@pytest.mark.parametrize("suffix", [".jsonl.zst", ".jsonl.gz"])
def test_truncated_file_is_refused_naming_it(tmp_path, suffix) -> None:
    raw = _jsonl(RECORDS)
    data = (
        zstandard.ZstdCompressor().compress(raw) if suffix.endswith("zst") else gzip.compress(raw)
    )
    path = _write(tmp_path / "in" / f"cut{suffix}", data[: len(data) - 5])
    counts = RecordCounts()
    with pytest.raises(InputError, match="cut" + suffix.replace(".", r"\.")):
        list(iter_texts([path], counts=counts, skip_bad_records=True))
    with pytest.raises(InputError, match="truncated"):
        train_tokenizer_from_files([path], str(tmp_path / "tok"), vocab_size=300)


def test_truncated_shard_fails_the_token_cache(tmp_path, bpe_dir) -> None:
    good = _write(
        tmp_path / "in" / "a.jsonl.zst", zstandard.ZstdCompressor().compress(_jsonl(RECORDS))
    )
    data = zstandard.ZstdCompressor().compress(_jsonl(RECORDS))
    bad = _write(tmp_path / "in" / "b.jsonl.zst", data[: len(data) // 2])
    with pytest.raises(InputError) as err:  # itself, not wrapped in the engine's shard failure
        build_token_cache(
            [good, bad], bpe_dir, str(tmp_path / "c"), backend="inline", skip_bad_records=True
        )
    assert bad in str(err.value) and "truncated" in str(err.value)


def test_truncated_parquet_names_the_file(tmp_path) -> None:
    good = tmp_path / "good.parquet"
    pq.write_table(pa.Table.from_pylist(RECORDS), good)
    data = good.read_bytes()
    path = _write(tmp_path / "in" / "cut.parquet", data[:-8])
    with pytest.raises(InputError, match="cut.parquet"):
        list(iter_texts([path]))
