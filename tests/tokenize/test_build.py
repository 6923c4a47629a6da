"""Building token caches from real Shakespeare shards: round trip, determinism, sampling,
validation splits, bad input, dtypes, parquet and gs://."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from marin_dagster.tokenize import TokenCache, summarize_cache
from marin_dagster.tokenize.build import build_token_cache as _build_token_cache
from marin_dagster.tokenize.records import BadRecordError, held_out
from marin_dagster.tokenize.tokenizer import load_tokenizer
from tests.tokenize.conftest import write_jsonl_gz


def build_token_cache(*args, **kwargs):
    """Builds run in this process unless a test is about the workers."""
    kwargs.setdefault("backend", "inline")
    return _build_token_cache(*args, **kwargs)


def tree_bytes(root: str) -> dict[str, bytes]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            full = os.path.join(dirpath, f)
            out[os.path.relpath(full, root)] = open(full, "rb").read()
    return out


def decoded_docs(cache: TokenCache, tok: Tokenizer, eos: bool = True) -> list[str]:
    out = []
    for ids in cache:
        if eos:
            assert ids[-1] == cache.eos_id
            ids = ids[:-1]
        out.append(tok.decode(ids.tolist(), skip_special_tokens=False))
    return out


def test_round_trip_every_document(tmp_path, shakespeare_shards, shakespeare_records, bpe_dir):
    stats = build_token_cache(shakespeare_shards, bpe_dir, str(tmp_path / "cache"))
    cache = TokenCache.open(str(tmp_path / "cache"))
    tok = load_tokenizer(bpe_dir)
    # Byte-level BPE has no normalizer, so decoding is exact.
    assert decoded_docs(cache, tok) == [r["text"] for r in shakespeare_records]
    assert cache.num_shards == len(shakespeare_shards) == stats.shards_total
    assert cache.eos_id == tok.token_to_id("<|endoftext|>") and cache.dtype == np.uint16
    num_bytes = sum(len(r["text"].encode()) for r in shakespeare_records)
    expected = {
        "num_tokens": cache.num_tokens,
        "num_docs": len(shakespeare_records),
        "num_bytes": num_bytes,
    }
    assert json.loads((tmp_path / "cache" / ".stats.json").read_text()) == {"train": expected}
    assert stats.splits == {"train": {**expected, "num_shards": len(shakespeare_shards)}}
    assert stats.shards_processed == len(shakespeare_shards) and stats.num_bad == 0
    # Packed sequences over the real cache: every token once per epoch.
    seqs = np.stack(list(cache.packed_sequences(128, seed=3, epochs=1)))
    assert seqs.shape == (cache.num_tokens // 128, 128)
    stream = np.concatenate(list(cache))
    counts = np.bincount(stream[: seqs.size], minlength=1024)
    np.testing.assert_array_equal(np.bincount(seqs.ravel(), minlength=1024), counts)

    summary = summarize_cache(str(tmp_path / "cache"), bpe_dir, n_samples=3, max_chars=50)
    assert (summary["num_tokens"], summary["num_docs"], summary["num_bytes"]) == (
        cache.num_tokens,
        len(shakespeare_records),
        num_bytes,
    )
    assert summary["bytes_per_token"] == pytest.approx(num_bytes / cache.num_tokens)
    samples = summary["splits"]["train"]["samples"]
    picks = [0, (len(shakespeare_records) - 1) // 2, len(shakespeare_records) - 1]
    assert samples == [shakespeare_records[i]["text"][:50] for i in picks]
    assert summary["samples_markdown"].count("**train sample") == 3

    # A second build over a finished cache does no work.
    again = build_token_cache(shakespeare_shards, bpe_dir, str(tmp_path / "cache"))
    assert again.shards_processed == 0 and again.shards_skipped == len(shakespeare_shards)
    assert again.splits == stats.splits


def test_byte_identical_for_one_and_two_workers(tmp_path, shakespeare_shards, bpe_dir):
    kw = dict(validation_fraction=0.2, sample_count=150)
    one = build_token_cache(
        shakespeare_shards, bpe_dir, str(tmp_path / "w1"), max_workers=1, backend="local", **kw
    )
    two = build_token_cache(
        shakespeare_shards, bpe_dir, str(tmp_path / "w2"), max_workers=2, backend="local", **kw
    )
    a, b = tree_bytes(str(tmp_path / "w1")), tree_bytes(str(tmp_path / "w2"))
    assert sorted(a) == sorted(b)
    assert "train/part-00003/input_ids.npy" in a and "validation/shard_ledger.json" in a
    for name in a:
        assert a[name] == b[name], name
    assert one.splits == two.splits


def test_sample_count_takes_the_first_documents(
    tmp_path, shakespeare_shards, shakespeare_records, bpe_dir
):
    tok = load_tokenizer(bpe_dir)
    n = len(shakespeare_records) // 2 + 3  # ends inside a later shard
    for workers in (1, 2):
        out = str(tmp_path / f"s{workers}")
        stats = build_token_cache(
            shakespeare_shards,
            bpe_dir,
            out,
            sample_count=n,
            max_workers=workers,
            backend="inline" if workers == 1 else "local",
        )
        cache = TokenCache.open(out)
        assert decoded_docs(cache, tok) == [r["text"] for r in shakespeare_records[:n]]
        # Still one cache shard per input shard; the ones past N are empty.
        assert stats.shards_total == len(shakespeare_shards)
        per_shard = cache.ledger["shard_num_docs"]
        assert len(per_shard) == len(shakespeare_shards) and per_shard[-1] == 0
        assert sum(per_shard) == n
    sample = build_token_cache(
        shakespeare_shards, bpe_dir, str(tmp_path / "big"), sample_count=10**9
    )
    assert sample.splits["train"]["num_docs"] == len(shakespeare_records)
    with pytest.raises(ValueError, match="sample_count must be positive"):
        build_token_cache(shakespeare_shards, bpe_dir, str(tmp_path / "x"), sample_count=0)


def test_validation_fraction_is_held_out_by_document_id(
    tmp_path, shakespeare_shards, shakespeare_records, bpe_dir
):
    tok = load_tokenizer(bpe_dir)
    stats = build_token_cache(
        shakespeare_shards, bpe_dir, str(tmp_path / "c"), validation_fraction=0.25
    )
    train = decoded_docs(TokenCache.open(str(tmp_path / "c"), "train"), tok)
    val = decoded_docs(TokenCache.open(str(tmp_path / "c"), "validation"), tok)
    expect_val = [r["text"] for r in shakespeare_records if held_out(r["id"], 0.25)]
    expect_train = [r["text"] for r in shakespeare_records if not held_out(r["id"], 0.25)]
    assert val == expect_val and train == expect_train
    assert 0.1 < len(val) / len(shakespeare_records) < 0.4
    assert set(stats.splits) == {"train", "validation"}
    # Same ids in a different sharding: the same documents are held out.
    write_jsonl_gz(str(tmp_path / "one" / "all.jsonl.gz"), list(reversed(shakespeare_records)))
    build_token_cache(
        [str(tmp_path / "one" / "all.jsonl.gz")],
        bpe_dir,
        str(tmp_path / "r"),
        validation_fraction=0.25,
    )
    val_r = decoded_docs(TokenCache.open(str(tmp_path / "r"), "validation"), tok)
    assert sorted(val_r) == sorted(expect_val)
    stats_json = json.loads((tmp_path / "c" / ".stats.json").read_text())
    assert stats_json["validation"]["num_docs"] == len(expect_val)


def test_validation_from_a_separate_source(
    tmp_path, shakespeare_shards, shakespeare_records, bpe_dir
):
    tok = load_tokenizer(bpe_dir)
    out = str(tmp_path / "c")
    stats = build_token_cache(
        shakespeare_shards[:3], bpe_dir, out, validation_files=shakespeare_shards[3:]
    )
    val = TokenCache.open(out, "validation")
    with gzip.open(shakespeare_shards[3], "rt") as f:
        expected = [json.loads(line)["text"] for line in f]
    assert decoded_docs(val, tok) == expected
    assert stats.splits["validation"]["num_shards"] == 1
    assert stats.splits["train"]["num_shards"] == 3
    with pytest.raises(ValueError, match="not both"):
        build_token_cache(
            shakespeare_shards,
            bpe_dir,
            out,
            validation_fraction=0.1,
            validation_files=shakespeare_shards,
        )


BAD_LINES = {
    "missing text field": (
        json.dumps({"id": "b", "content": "x", "meta": 1}),
        r"no field 'text' \(the record's keys: \['content', 'id', 'meta'\]\)",
    ),
    "non-string text": (json.dumps({"id": "b", "text": 42}), r"field 'text' is int, not a string"),
    "null text": (json.dumps({"id": "b", "text": None}), r"field 'text' is null"),
    "invalid utf-8": (b'{"id": "b", "text": "caf\xe9"}', r"invalid UTF-8 at byte 24"),
    "broken json": ('{"id": "b", "text": ', r"not valid JSON"),
    "not an object": ('["a", "b"]', r"is a JSON list, not an object"),
    "unpaired surrogate": ('{"id": "b", "text": "x\\ud800y"}', r"not valid Unicode"),
}


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
def test_bad_records_fail_with_file_index_and_reason(tmp_path, bpe_dir, kind):
    line, pattern = BAD_LINES[kind]
    path = str(tmp_path / "in" / "part-00000.jsonl")
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        for rec in [
            json.dumps({"id": "a", "text": "hello there"}),
            json.dumps({"id": "e", "text": ""}),
            b"",
            line,
            json.dumps({"id": "c", "text": "good night"}),
        ]:
            f.write(rec if isinstance(rec, bytes) else rec.encode("utf-8"))
            f.write(b"\n")
    with pytest.raises(BadRecordError, match=pattern) as e:
        build_token_cache([path], bpe_dir, str(tmp_path / "c"))
    assert e.value.source == path and e.value.record_index == 2
    # named as dedup names it: a blank line is no record (it said "record 3 (line 4 for
    # JSONL)" where dedup said "line 4: record 2")
    assert f"{path}: line 4: record 2: " in str(e.value) and "skip_bad_records" in str(e.value)

    stats = build_token_cache([path], bpe_dir, str(tmp_path / "c"), skip_bad_records=True)
    assert (stats.num_bad, stats.num_empty, stats.num_records) == (1, 1, 4)
    tok = load_tokenizer(bpe_dir)
    assert decoded_docs(TokenCache.open(str(tmp_path / "c")), tok) == ["hello there", "good night"]
    # The counts survive a resumed (no-op) build.
    again = build_token_cache([path], bpe_dir, str(tmp_path / "c"), skip_bad_records=True)
    assert (again.shards_processed, again.num_bad, again.num_empty) == (0, 1, 1)


def _word_level(vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def test_vocabulary_too_big_for_the_dtype_fails_before_any_work(tmp_path):
    tok = _word_level(70_000)
    path = write_jsonl_gz(
        str(tmp_path / "in" / "a.jsonl.gz"),
        [{"id": "1", "text": "w69999 w1 w65536"}, {"id": "2", "text": "w7"}],
    )
    out = tmp_path / "c"
    with pytest.raises(ValueError, match=r"70000 ids\) does not fit uint16"):
        build_token_cache([path], tok, str(out), dtype="uint16", append_eos=False)
    assert not out.exists()
    stats = build_token_cache([path], tok, str(out), append_eos=False)
    cache = TokenCache.open(str(out))
    assert stats.dtype == "uint32" and cache.dtype == np.uint32 and cache.eos_id is None
    assert cache[0].tolist() == [69999, 1, 65536] and cache[1].tolist() == [7]
    assert np.load(out / "train" / "part-00000" / "input_ids.npy").dtype == np.dtype("<u4")


def test_append_eos_needs_an_eos_token(tmp_path):
    path = write_jsonl_gz(str(tmp_path / "a.jsonl.gz"), [{"text": "w1 w2"}])
    with pytest.raises(ValueError, match="no end-of-document token"):
        build_token_cache([path], _word_level(10), str(tmp_path / "c"))
    assert not (tmp_path / "c").exists()
    stats = build_token_cache([path], _word_level(10), str(tmp_path / "c"), eos_token="w9")
    assert TokenCache.open(str(tmp_path / "c"))[0].tolist() == [1, 2, 9] and stats.eos_id == 9


def test_parquet_input_and_glob(tmp_path, shakespeare_records, bpe_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(tmp_path / "pq")
    half = len(shakespeare_records) // 2
    for i, part in enumerate([shakespeare_records[:half], shakespeare_records[half:]]):
        pq.write_table(pa.Table.from_pylist(part), str(tmp_path / "pq" / f"p{i}.parquet"))
    build_token_cache(str(tmp_path / "pq" / "*.parquet"), bpe_dir, str(tmp_path / "c"))
    tok = load_tokenizer(bpe_dir)
    assert decoded_docs(TokenCache.open(str(tmp_path / "c")), tok) == [
        r["text"] for r in shakespeare_records
    ]
    with pytest.raises(FileNotFoundError, match="no input files match"):
        build_token_cache(str(tmp_path / "none" / "*.jsonl"), bpe_dir, str(tmp_path / "d"))


def test_csv_input(tmp_path, shakespeare_records, bpe_dir):
    """CSV, as `dataset(...)` fetches it: its rows are the documents, in order."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    rows = [{"id": r["id"], "text": r["text"]} for r in shakespeare_records[:20]]
    pacsv.write_csv(pa.Table.from_pylist(rows), str(tmp_path / "plays.csv"))
    build_token_cache([str(tmp_path / "plays.csv")], bpe_dir, str(tmp_path / "c"))
    tok = load_tokenizer(bpe_dir)
    assert decoded_docs(TokenCache.open(str(tmp_path / "c")), tok) == [r["text"] for r in rows]


def test_gcs_cache_through_the_emulator(tmp_path, gcs_prefix, shakespeare_shards, bpe_dir):
    from marin_dagster import fs

    # Inputs, tokenizer and cache all on gs://.
    remote_inputs = []
    for p in shakespeare_shards[:2]:
        target = f"{gcs_prefix}/raw/{os.path.basename(p)}"
        fs.write_bytes(target, open(p, "rb").read())
        remote_inputs.append(target)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        fs.write_bytes(f"{gcs_prefix}/tok/{name}", open(os.path.join(bpe_dir, name), "rb").read())
    out = f"{gcs_prefix}/cache"
    stats = build_token_cache(
        f"{gcs_prefix}/raw/*.jsonl.gz", f"{gcs_prefix}/tok", out, validation_fraction=0.2
    )
    local = str(tmp_path / "local")
    build_token_cache(shakespeare_shards[:2], bpe_dir, local, validation_fraction=0.2)
    # The remote cache holds the very same bytes as a local build.
    for rel, data in tree_bytes(local).items():
        assert fs.read_bytes(f"{out}/{rel}") == data, rel
    cache = TokenCache.open(out)
    ref = TokenCache.open(local)
    assert len(cache) == len(ref) == stats.splits["train"]["num_docs"]
    for i in (0, len(ref) // 2, len(ref) - 1):
        np.testing.assert_array_equal(cache[i], ref[i])
    a = list(cache.packed_sequences(64, seed=1, start=5, epochs=1))
    b = list(ref.packed_sequences(64, seed=1, start=5, epochs=1))
    assert len(a) == len(b) > 0
    np.testing.assert_array_equal(np.stack(a), np.stack(b))
    again = build_token_cache(
        f"{gcs_prefix}/raw/*.jsonl.gz", f"{gcs_prefix}/tok", out, validation_fraction=0.2
    )
    assert again.shards_processed == 0


@pytest.mark.parametrize("template", ["bos", "bos_eos"])
def test_the_tokenizers_template_is_kept_with_one_eos_per_document(tmp_path, template):
    """As Levanter encodes: the template's BOS starts each document, and the EOS is appended
    only when the template does not end with it already."""
    from tokenizers import processors

    tok = _word_level(10)
    single = "w8 $A w9" if template == "bos_eos" else "w8 $A"
    tok.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[("w8", 8), ("w9", 9)]
    )
    path = write_jsonl_gz(str(tmp_path / "a.jsonl.gz"), [{"text": "w1 w2"}, {"text": "w3"}])
    build_token_cache([path], tok, str(tmp_path / "c"), eos_token="w9")
    cache = TokenCache.open(str(tmp_path / "c"))
    assert [cache[i].tolist() for i in range(len(cache))] == [[8, 1, 2, 9], [8, 3, 9]]
    build_token_cache(
        [path], tok, str(tmp_path / "plain"), eos_token="w9", add_special_tokens=False
    )
    plain = TokenCache.open(str(tmp_path / "plain"))
    assert [plain[i].tolist() for i in range(len(plain))] == [[1, 2, 9], [3, 9]]
