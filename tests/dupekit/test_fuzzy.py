"""Fuzzy (MinHash-LSH) dedup on the Shakespeare corpus plus edited copies of its passages.

True Jaccard similarities are computed exactly here, from the shingle sets
themselves (character 5-grams, packed losslessly), never from signatures.
"""

from __future__ import annotations

import glob
import itertools
import logging
import os

import numpy as np
import pytest
from datasketch import MinHash

from marin_dagster.dupekit import DedupConfig, deduplicate, load_minhash_lsh, read_signatures
from marin_dagster.dupekit.hashing import shingle_hash
from marin_dagster.dupekit.shingles import ShingleConfig, shingle_strings
from tests.dupekit.corpus import (
    exact_shingle_set,
    jaccard,
    near_duplicate_docs,
    read_jsonl_gz,
    write_jsonl_gz,
)

logger = logging.getLogger(__name__)
THRESHOLD = 0.8  # deduplicate's default


@pytest.fixture(scope="module")
def corpus(shakespeare_docs, tmp_path_factory):
    """Every Shakespeare/Milton text plus 24 passages with 4 edited copies each, in 3 shards."""
    docs = [{"id": d["id"], "text": d["text"]} for d in shakespeare_docs]
    docs += near_duplicate_docs(shakespeare_docs)
    root = tmp_path_factory.mktemp("fuzzy-corpus")
    files = [write_jsonl_gz(str(root / f"part-{i}.jsonl.gz"), docs[i::3]) for i in range(3)]
    sets = {d["id"]: exact_shingle_set(d["text"]) for d in docs}
    return {"docs": docs, "files": files, "sets": sets}


@pytest.fixture(scope="module")
def similar_pairs(corpus) -> dict[tuple[str, str], float]:
    """Every pair whose true Jaccard is at least THRESHOLD + 0.05."""
    sets = corpus["sets"]
    bar = THRESHOLD + 0.05
    out = {}
    for a, b in itertools.combinations(sorted(sets), 2):
        sa, sb = sets[a], sets[b]
        if min(len(sa), len(sb)) < bar * max(len(sa), len(sb)):
            continue  # J <= |small| / |large|
        j = jaccard(sa, sb)
        if j >= bar:
            out[(a, b)] = j
    return out


def _attributes(result) -> dict:
    return {r["id"]: r for p in result.attributes for r in read_jsonl_gz(p)}


def test_fuzzy_recall_at_default_threshold(corpus, similar_pairs, local_ctx, tmp_path):
    result = deduplicate(
        corpus["files"], str(tmp_path / "out"), DedupConfig(mode="fuzzy"), context=local_ctx
    )
    attrs = _attributes(result)
    assert len(attrs) == len(corpus["docs"])
    # Qualifying pairs: the 7 identical Milton pairs and edited passages; the plays'
    # editions qualify only if their Jaccard reaches the bar (measured below).
    assert sum(1 for a, b in similar_pairs if a.startswith("milton/")) == 7
    assert len(similar_pairs) >= 60
    linked = [attrs[a]["cluster_id"] == attrs[b]["cluster_id"] for a, b in similar_pairs]
    assert sum(linked) / len(linked) >= 0.95, f"recall {sum(linked)}/{len(linked)}"

    sets = corpus["sets"]
    editions = {}
    for folio in (i for i in sets if i.endswith("_gut_f")):
        modern = max(
            (i for i in sets if i.startswith("shakespeare/") and not i.endswith("_gut_f")),
            key=lambda i: jaccard(sets[folio], sets[i]),
        )
        editions[(folio, modern)] = jaccard(sets[folio], sets[modern])
    logger.info(
        "modern vs First Folio Jaccard: %.3f..%.3f over %d plays",
        min(editions.values()),
        max(editions.values()),
        len(editions),
    )
    assert len(editions) == 35
    for pair, j in editions.items():
        assert (tuple(sorted(pair)) in similar_pairs) == (j >= THRESHOLD + 0.05)

    kept = [r for p in result.documents for r in read_jsonl_gz(p)]
    assert len(kept) == result.counts["document"]["unique"]
    assert result.counts["document"]["duplicates"] == sum(a["duplicate"] for a in attrs.values())
    assert result.counts["fuzzy"]["bands"] * result.counts["fuzzy"]["rows"] <= 128
    # One document kept per cluster, the smallest id.
    clusters: dict = {}
    for doc_id, a in attrs.items():
        clusters.setdefault(a["cluster_id"], []).append(doc_id)
    for cluster_id, members in clusters.items():
        assert cluster_id == min(members)
        assert [m for m in members if not attrs[m]["duplicate"]] == [cluster_id]


def test_fuzzy_verification_precision(corpus, similar_pairs, local_ctx, tmp_path):
    result = deduplicate(
        corpus["files"],
        str(tmp_path / "out"),
        DedupConfig(mode="fuzzy", verify=True),
        context=local_ctx,
    )
    links = {
        (r["a"], r["b"])
        for p in glob.glob(str(tmp_path / "out/links/*.jsonl.gz"))
        for r in read_jsonl_gz(p)
    }
    assert result.counts["fuzzy"]["linked_pairs"] == len(links) > 0
    sets = corpus["sets"]
    # Links estimated within verify_margin (0.1) above the threshold were checked exactly;
    # one above it joins documents below threshold - 0.1 with probability 2e-8.
    low = [pair for pair in links if jaccard(sets[pair[0]], sets[pair[1]]) < THRESHOLD - 0.1]
    assert low == [], f"{len(low)} of {len(links)} links below 0.7: {low}"
    assert result.counts["fuzzy"]["exact_checked"] > 0
    attrs = _attributes(result)
    linked = [attrs[a]["cluster_id"] == attrs[b]["cluster_id"] for a, b in similar_pairs]
    assert sum(linked) / len(linked) >= 0.9


def test_every_link_checked_exactly_with_the_widest_margin(corpus, local_ctx, tmp_path):
    """verify_margin=1: no link on an estimate; each holds at the threshold on the shingle sets."""
    result = deduplicate(
        corpus["files"],
        str(tmp_path / "out"),
        DedupConfig(mode="fuzzy", verify=True, verify_margin=1.0),
        context=local_ctx,
    )
    links = {
        (r["a"], r["b"])
        for p in glob.glob(str(tmp_path / "out/links/*.jsonl.gz"))
        for r in read_jsonl_gz(p)
    }
    assert links
    sets = corpus["sets"]
    # The check reads 32-bit shingle hashes; the sets here are lossless: allow a collision.
    below = {
        pair: jaccard(sets[pair[0]], sets[pair[1]])
        for pair in links
        if jaccard(sets[pair[0]], sets[pair[1]]) < THRESHOLD - 1e-3
    }
    assert below == {}
    fuzzy = result.counts["fuzzy"]
    assert fuzzy["exact_checked"] >= fuzzy["linked_pairs"] == len(links)
    # Edited copies near the threshold: some pass on their estimate and fail exactly.
    assert fuzzy["exact_rejected"] > 0
    logger.info("exact checks: %d, rejected %d", fuzzy["exact_checked"], fuzzy["exact_rejected"])


def test_exact_check_rereads_the_shingles_and_holds_at_the_threshold(tmp_path):
    from marin_dagster.dupekit.fuzzy import ExactJaccard, ShingleSets
    from marin_dagster.dupekit.records import resolve_sources
    from marin_dagster.dupekit.shingles import shingle_hash_set

    texts = ["To be, or not to be, that is the question", "", "Whether 'tis nobler in the mind"]
    path = write_jsonl_gz(
        str(tmp_path / "in/a.jsonl.gz"), [{"id": i, "text": t} for i, t in enumerate(texts)]
    )
    reread = ShingleSets(tuple(resolve_sources([path])), "text", "id", 20, ShingleConfig())
    got = list(
        reread(0, iter([(0, 2, ("k0", "k2"), 1), (0, 0, ("k0", "k2"), 0), (0, 0, ("k0", "k9"), 0)]))
    )
    assert [(pair, side) for pair, side, _h in got] == [
        (("k0", "k2"), 0),
        (("k0", "k9"), 0),
        (("k0", "k2"), 1),
    ]
    for (_pair, _side, hashes), record in zip(got, [0, 0, 2], strict=True):
        # The same truncation (max_chars) as the signature stage, as a sorted set.
        assert hashes.tolist() == sorted(shingle_hash_set(texts[record][:20], ShingleConfig()))

    check = ExactJaccard(0.8)
    a = np.arange(10, dtype=np.uint32)
    items = [
        (("a", "b"), 0, a),
        (("a", "b"), 1, a[:8]),  # 8 / 10: holds at the threshold
        (("c", "d"), 1, a),
        (("c", "d"), 0, a[1:9]),  # either side may come first
        (("e", "f"), 0, a[:9]),
        (("e", "f"), 1, a[2:]),  # 7 / 10: fails
        (("g", "h"), 0, a[:0]),
        (("g", "h"), 1, a[:0]),  # two empty sets: 0 / 0 holds
    ]
    assert list(check(7, iter(items))) == [
        {"a": "a", "b": "b"},
        {"a": "c", "b": "d"},
        {"a": "g", "b": "h"},
    ]
    with pytest.raises(ValueError, match=r"exact check of \('a', 'b'\) found 1 of its 2 documents"):
        list(check(7, iter([(("a", "b"), 0, a), (("a", "b"), 0, a)])))


def test_signature_set_matches_datasketch_and_answers_queries(corpus, local_ctx, tmp_path):
    files = corpus["files"][:1]
    deduplicate(files, str(tmp_path / "out"), DedupConfig(mode="fuzzy", seed=7), context=local_ctx)
    paths = sorted(glob.glob(str(tmp_path / "out/signatures/*.parquet")))
    ids, sigs, meta = read_signatures(paths)
    assert meta["num_perm"] == 128 and meta["seed"] == 7
    texts = {d["id"]: d["text"] for d in read_jsonl_gz(files[0])}
    assert sorted(ids) == sorted(texts)
    config = ShingleConfig()

    def datasketch_minhash(text: str) -> MinHash:
        m = MinHash(num_perm=128, seed=7, hashfunc=shingle_hash)
        m.update_batch(shingle_strings(text, config))
        return m

    # Bit-identical end to end: the passages, and one whole play or poem.
    checked = [i for i in ids if i.startswith("synthetic/")][::5] + [min(ids)]
    for doc_id in checked:
        np.testing.assert_array_equal(
            sigs[ids.index(doc_id)], datasketch_minhash(texts[doc_id]).hashvalues
        )
    lsh = load_minhash_lsh(str(tmp_path / "out/signatures/*.parquet"))  # a glob works too
    originals = [i for i in ids if i.endswith("/original")]
    assert originals
    for doc_id in originals:
        query = datasketch_minhash(texts[doc_id] + " and a new closing line for the query")
        assert doc_id in lsh.query(query)


def _output_bytes(root: str) -> dict[str, bytes]:
    out = {}
    for path in sorted(glob.glob(os.path.join(root, "**", "*"), recursive=True)):
        if os.path.isfile(path):
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def test_same_output_on_1_and_2_workers_and_ray(corpus, local_ctx, ray_cluster, tmp_path):
    docs = [d for d in corpus["docs"] if d["id"].startswith(("milton/", "synthetic/"))]
    files = [write_jsonl_gz(str(tmp_path / f"in/part-{i}.jsonl.gz"), docs[i::4]) for i in range(4)]
    outputs = []
    for name, kwargs in [
        ("one", {"max_workers": 1}),
        ("two", {"context": local_ctx}),
        ("ray", {"max_workers": 2, "backend": "ray"}),
    ]:
        out = str(tmp_path / name)
        deduplicate(files, out, DedupConfig(mode="fuzzy", verify=True), **kwargs)
        outputs.append(_output_bytes(out))
    assert set(outputs[0]) >= {
        "counts.json",
        "links/part-00000-of-00004.jsonl.gz",
        "attributes/part-0.jsonl.gz",
        "documents/part-3.jsonl.gz",
        "signatures/part-00002.parquet",
    }
    assert outputs[0] == outputs[1] == outputs[2]
    exact = [
        _output_bytes(out)
        for out in (
            deduplicate(
                files, str(tmp_path / "exact-local"), DedupConfig(mode="exact"), context=local_ctx
            ).output_path,
            deduplicate(
                files,
                str(tmp_path / "exact-ray"),
                DedupConfig(mode="exact"),
                max_workers=2,
                backend="ray",
            ).output_path,
        )
    ]
    assert exact[0] == exact[1]


def test_fuzzy_word_shingles_short_and_empty_documents(tmp_path):
    """Word 3-grams; documents with fewer than 3 words pass through and are counted."""
    base = "the quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun"
    files = [
        write_jsonl_gz(
            str(tmp_path / "in/a.jsonl"),
            [
                {"id": "x2", "text": base + " today"},
                {"id": "short", "text": "two words"},
                {"id": "empty", "text": ""},
            ],
        ),
        write_jsonl_gz(
            str(tmp_path / "in/b.jsonl"),
            [
                {"id": "x1", "text": base + "!"},
                {"id": "other", "text": "an entirely different sentence about ships and the sea"},
                {"id": "short2", "text": "two words"},
            ],
        ),
    ]
    result = deduplicate(
        files,
        str(tmp_path / "out"),
        DedupConfig(mode="fuzzy", shingle="word", ngram=3, threshold=0.7),
        backend="inline",
    )
    attrs = _attributes(result)
    assert {i for i, a in attrs.items() if a["duplicate"]} == {"x2"}
    assert attrs["x2"]["cluster_id"] == "x1"
    assert result.counts["document"]["passed_through"] == 3
    assert result.counts["document"]["total"] == 6 and result.counts["document"]["unique"] == 5
    ids, _sigs, meta = read_signatures(sorted(glob.glob(str(tmp_path / "out/signatures/*"))))
    assert sorted(ids) == ["other", "x1", "x2"] and meta["shingle_kind"] == "word"

    unique = deduplicate(
        files[1:], str(tmp_path / "out2"), DedupConfig(mode="fuzzy"), backend="inline"
    )
    assert unique.counts["document"]["duplicates"] == 0
    assert unique.counts["fuzzy"]["linked_pairs"] == 0
