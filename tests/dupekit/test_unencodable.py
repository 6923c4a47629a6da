"""Lone surrogates (a JSON "\\ud800" escape decodes to one) never break a dupekit path.

Each hash sees them replaced by U+FFFD (the same value whichever path hashes
the text), each step counts the documents holding them, and the documents are
written out unchanged (JSON escapes the surrogates, which read back as the same
strings).
"""

from __future__ import annotations

import glob
import gzip
import json

import numpy as np
import pytest
from datasketch import MinHash

from marin_dagster.dupekit import DedupConfig, deduplicate, read_signatures
from marin_dagster.dupekit.hashing import shingle_hash, text_hash128
from marin_dagster.dupekit.minhash import MinHasher
from marin_dagster.dupekit.shingles import (
    ShingleConfig,
    batch_shingle_hashes,
    shingle_hash_set,
    shingle_hashes,
    shingle_strings,
)
from marin_dagster.dupekit.text import (
    codepoints_for_shingles,
    count_unencodable,
    normalize_for_shingles,
    replace_unencodable,
)
from marin_dagster.zephyr.writers import write_jsonl

PASSAGE = (
    "Now is the winter of our discontent made glorious summer by this sun of York; "
    "and all the clouds that lour'd upon our house in the deep bosom of the ocean buried. "
    "Now are our brows bound with victorious wreaths; our bruised arms hung up for monuments; "
    "our stern alarums changed to merry meetings, our dreadful marches to delightful measures."
)
# Lone high and low surrogates, a reversed pair (two lone ones) and an emoji beside them.
HOSTILE = [
    "\ud800",
    "a\udfffb",
    PASSAGE.replace("winter", "win\ud800ter").replace("York", "York \udc00\ud83d 😀"),
    "\udc00\ud800" * 40,
    "é\ud800" + PASSAGE,
]
CONFIGS = [ShingleConfig("char", 5), ShingleConfig("word", 3), ShingleConfig("char", 1)]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.kind}{c.n}")
def test_shingle_hashes_replace_surrogates_the_same_way_on_every_path(config):
    for text in HOSTILE:
        replaced = replace_unencodable(text)
        assert "\ud800" not in replaced and len(replaced) == len(text)
        assert normalize_for_shingles(text) == normalize_for_shingles(replaced)
        assert np.array_equal(codepoints_for_shingles(text), codepoints_for_shingles(replaced))
        single = shingle_hashes(text, config)
        assert np.array_equal(single, shingle_hashes(replaced, config))
        assert set(single.tolist()) == shingle_hash_set(text, config)
    batch = batch_shingle_hashes(HOSTILE + [PASSAGE], config)
    for text, hashes in zip(HOSTILE + [PASSAGE], batch, strict=True):
        assert np.array_equal(hashes, shingle_hashes(text, config))


def test_signatures_of_surrogate_texts_equal_datasketchs():
    config = ShingleConfig("char", 5)
    hasher = MinHasher(64, seed=3)
    sigs = hasher.signatures(batch_shingle_hashes(HOSTILE, config))
    for text, sig in zip(HOSTILE, sigs, strict=True):
        reference = MinHash(num_perm=64, seed=3, hashfunc=shingle_hash)
        for shingle in set(shingle_strings(text, config)):
            reference.update(shingle)
        assert np.array_equal(sig, reference.hashvalues)


def test_exact_hash_and_count():
    assert text_hash128("a\ud800b") == text_hash128("a\ufffdb") != text_hash128("ab")
    assert shingle_hash("x\ud800") == shingle_hash("x\ufffd")
    assert count_unencodable(HOSTILE + [PASSAGE, "plain ascii", "é"]) == len(HOSTILE)


def test_zephyr_jsonl_writer_keeps_lone_surrogates(tmp_path):
    records = [{"text": "a\ud800b"}, {"text": "ok ☃"}, {"id": "\udfff", "text": "x"}]
    path = str(tmp_path / "out.jsonl.gz")
    result = write_jsonl(path, iter(records))
    assert result.records == 3
    with gzip.open(path, "rb") as f:
        lines = f.read().splitlines()
    assert [json.loads(line) for line in lines] == records
    assert lines[1] == '{"text": "ok ☃"}'.encode()  # only the lines that need escapes get them


def _write_raw(path, records: list[dict]) -> str:
    # json.dumps escapes a lone surrogate as \ud800, as other producers of JSON lines do.
    with gzip.open(path, "wt", encoding="ascii") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return str(path)


def _read(pattern: str) -> list[dict]:
    out = []
    for p in sorted(glob.glob(pattern)):
        opener = gzip.open if p.endswith(".gz") else open
        with opener(p, "rt", encoding="utf-8") as f:
            out.extend(json.loads(line) for line in f)
    return out


@pytest.fixture(scope="module")
def surrogate_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("surrogates")
    second = PASSAGE.replace("Now is the winter", "Now is the \ud800 winter")
    records = [
        {"id": "a", "text": PASSAGE.replace("sun of York", "sun of \ud800York")},
        {"id": "b", "text": second},  # a near-copy of "a", with its own surrogate
        {"id": "c\udc00", "text": "Line one.\nA repeated line \ud83d here.\n"},
        {"id": "d", "text": "Line two.\nA repeated line \ud83d here.\n"},
        {"id": "e", "text": "Line one.\nA repeated line \ud83d HERE.\n"},
        {"id": "f", "text": "an unrelated short text about nothing at all, " * 3},
        {"id": "g", "text": "\ud800\udc00\udfff"},  # a pair (U+10000) and a lone one
    ]
    (root / "in").mkdir()
    path = _write_raw(root / "in/part-0.jsonl.gz", records[:4])
    path2 = _write_raw(root / "in/part-1.jsonl.gz", records[4:])
    # As a JSON reader sees them: "\ud800\udc00" escapes are one pair, U+10000.
    return [json.loads(json.dumps(r)) for r in records], [path, path2]


@pytest.mark.parametrize(
    "mode,extra",
    [
        ("exact", {}),
        ("paragraph", {}),
        ("fuzzy", {"verify_margin": 1.0}),  # every link checked exactly: the reread path too
        ("fuzzy", {"verify": False, "shingle": "word", "ngram": 3}),
    ],
    ids=["exact", "paragraph", "fuzzy-verified", "fuzzy-word-unverified"],
)
def test_dedup_runs_counts_and_writes_surrogates_unchanged(
    surrogate_corpus, local_ctx, tmp_path, mode, extra
):
    records, files = surrogate_corpus
    out = tmp_path / "out"
    result = deduplicate(files, str(out), DedupConfig(mode=mode, **extra), context=local_ctx)
    counts = result.counts["document"]
    assert counts["total"] == len(records)
    # Every record but "f" holds a lone surrogate in its text.
    assert counts["unencodable"] == len(records) - 1
    assert json.loads((out / "counts.json").read_text())["document"]["unencodable"] == 6
    attributes = _read(str(out / "attributes/*.jsonl.gz"))
    assert [a["id"] for a in attributes] == [r["id"] for r in records]
    kept = _read(str(out / "documents/*.jsonl.gz"))
    originals = {r["id"]: r for r in records}
    dup = {a["id"]: a for a in attributes}
    if mode == "paragraph":
        # "d" repeats "c"'s second line (surrogate and all): cut out; "e" repeats both of
        # "c"'s lines (case aside): emptied and dropped; the others unchanged.
        assert {r["id"]: r["text"] for r in kept}["d"] == "Line two.\n"
        assert "e" not in {r["id"] for r in kept}
        assert [r for r in kept if r["id"] not in ("d", "e")] == [
            originals[i] for i in originals if i not in ("d", "e")
        ]
    else:
        for record in kept:  # surrogates and all, field for field
            assert record == originals[record["id"]]
    if mode == "exact":
        # "e" is "c" but for case; its cluster is named by "c"'s id, lone surrogate and all.
        assert counts["duplicates"] == 1
        assert dup["e"]["duplicate"] and dup["e"]["cluster_id"] == "c\udc00"
    if mode == "fuzzy" and "verify" not in extra:
        assert dup["b"]["duplicate"] and dup["b"]["cluster_id"] == "a"
        assert result.counts["fuzzy"]["exact_checked"] >= 1
        ids, sigs, _meta = read_signatures(str(out / "signatures/*.parquet"))
        # Arrow strings are UTF-8: the saved set names "c\udc00" with U+FFFD.
        assert "c\ufffd" in ids and "g" not in ids  # "g" normalizes to nothing: no shingle
        assert len(sigs) == len(ids)
