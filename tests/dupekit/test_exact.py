"""Exact document and paragraph dedup on real files, through Zephyr."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from marin_dagster.dupekit import DedupConfig, deduplicate
from marin_dagster.dupekit.pipeline import MAX_CHARS
from tests.dupekit.corpus import read_jsonl_gz, write_jsonl_gz


@pytest.fixture(scope="module")
def corpus_files(shakespeare_docs, tmp_path_factory) -> list[str]:
    """The whole corpus in three shards, round-robin, so duplicate pairs cross files."""
    root = tmp_path_factory.mktemp("exact-corpus")
    docs = [{"id": d["id"], "text": d["text"], "title": d["title"]} for d in shakespeare_docs]
    return [write_jsonl_gz(str(root / f"part-{i}.jsonl.gz"), docs[i::3]) for i in range(3)]


def _all(paths: list[str]) -> list[dict]:
    return [r for p in paths for r in read_jsonl_gz(p)]


def test_exact_finds_every_identical_milton_pair(
    shakespeare_docs, corpus_files, local_ctx, tmp_path
):
    out = str(tmp_path / "dedup")
    result = deduplicate(corpus_files, out, DedupConfig(mode="exact"), context=local_ctx)

    by_bytes: dict[str, list[str]] = {}
    for d in shakespeare_docs:
        by_bytes.setdefault(hashlib.sha256(d["text"].encode()).hexdigest(), []).append(d["id"])
    groups = [sorted(ids) for ids in by_bytes.values() if len(ids) > 1]
    assert len(groups) == 7 and all(i.startswith("milton/") for g in groups for i in g)
    expected_dups = {i: g[0] for g in groups for i in g[1:]}

    attrs = {a["id"]: a for a in _all(result.attributes)}
    assert len(attrs) == len(shakespeare_docs)
    found = {i: a["cluster_id"] for i, a in attrs.items() if a["duplicate"]}
    assert found == expected_dups  # every pair, the first id kept, nothing else removed
    assert all(a["cluster_id"] == i for i, a in attrs.items() if not a["duplicate"])

    kept = _all(result.documents)
    assert sorted(d["id"] for d in kept) == sorted(set(attrs) - set(expected_dups))
    source = {d["id"]: d for d in shakespeare_docs}
    for d in kept:  # records come through whole, fields unchanged
        assert d["text"] == source[d["id"]]["text"] and d["title"] == source[d["id"]]["title"]
    assert [os.path.basename(p) for p in result.documents] == [
        f"part-{i}.jsonl.gz" for i in range(3)
    ]

    counts = json.load(open(os.path.join(out, "counts.json")))
    assert counts == result.counts
    assert counts["document"]["total"] == len(shakespeare_docs)
    # only the settings exact mode uses (the MinHash ones were listed at their defaults)
    assert counts["config"] == {
        "mode": "exact",
        "text_key": "text",
        "id_key": "id",
        "num_shards": None,
    }
    assert counts["document"]["duplicates"] == 7
    assert counts["document"]["unique"] == counts["document"]["kept"] == len(shakespeare_docs) - 7
    assert result.counters["dedup/document/duplicates"] == 7
    assert not os.path.exists(os.path.join(out, "_work"))


def test_exact_edge_cases(tmp_path):
    """Case/whitespace-only differences, empty docs, missing ids, long documents hashed whole,
    the first id wins."""
    head = "x" * MAX_CHARS
    write_jsonl_gz(
        str(tmp_path / "in/a.jsonl.gz"),
        [
            {"id": "b", "text": "Hello   World"},
            {"text": "no id here"},
            {"id": "e1", "text": ""},
            {"id": "e2", "text": "   \n "},
            {"id": 10, "text": "numbers"},
            {"id": "long-1", "text": head + "tail one"},
            {"id": "long-3", "text": head + "tail two"},
        ],
    )
    write_jsonl_gz(
        str(tmp_path / "in/sub/b.jsonl.gz"),
        [
            {"id": "a", "text": "hello world"},
            {"id": 9, "text": "numbers"},
            {"id": "c", "text": "no id here"},
            {"id": "long-2", "text": head + "tail one"},
        ],
    )
    out = str(tmp_path / "out")
    result = deduplicate(
        str(tmp_path / "in/**/*.jsonl.gz"),
        out,
        DedupConfig(mode="exact"),
        max_workers=1,
        backend="inline",
    )
    attrs = [r for p in result.attributes for r in read_jsonl_gz(p)]
    dup = {r["id"]: r["cluster_id"] for r in attrs if r["duplicate"]}
    # "a" < "b"; 9 < 10 (integers numerically, not as strings); the generated id
    # "a.jsonl.gz#1" < "c"; of the long ones, equal in their first MAX_CHARS characters
    # (fuzzy's limit), only the copy is a duplicate.
    assert dup == {"b": "a", 10: 9, "c": "a.jsonl.gz#1", "long-2": "long-1"}
    docs = [r for p in result.documents for r in read_jsonl_gz(p)]
    assert {"text": "no id here", "id": "a.jsonl.gz#1"} in docs
    assert {r["id"] for r in docs} >= {"e1", "e2"}  # empty documents pass through
    assert result.counts["document"]["passed_through"] == 2
    assert "truncated" not in result.counts["document"]
    assert [os.path.relpath(p, out) for p in result.documents] == [
        "documents/a.jsonl.gz",
        "documents/sub/b.jsonl.gz",
    ]


@pytest.mark.parametrize("mode", ["exact", "fuzzy"])
def test_records_without_ids_keep_the_first_copy_in_the_input(tmp_path, mode):
    """Their generated ids compare as strings "a.jsonl#11" < "a.jsonl#2": the later copy was
    kept and the original removed."""
    text = "the original text of a document, long enough for a few shingles of five"
    records = [{"text": text if i in (2, 11) else f"filler {i} " + "x" * i} for i in range(12)]
    (tmp_path / "in").mkdir()
    (tmp_path / "in/a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "in/b.jsonl").write_text(json.dumps({"text": text}) + "\n")
    result = deduplicate(
        str(tmp_path / "in/*.jsonl"), str(tmp_path / "out"), DedupConfig(mode=mode), max_workers=1
    )
    dup = {
        r["id"]: r["cluster_id"]
        for p in result.attributes
        for r in read_jsonl_gz(p)
        if r["duplicate"]
    }
    # a.jsonl's record 2 comes first, then its record 11, then b.jsonl's record 0.
    assert dup == {"a.jsonl#11": "a.jsonl#2", "b.jsonl#0": "a.jsonl#2"}


@pytest.mark.parametrize("mode", ["exact", "fuzzy"])
def test_string_ids_with_numbers_keep_the_first_in_natural_order(tmp_path, mode):
    """folder_corpus names records "x.jsonl:2", "x.jsonl:10": by code point the later line
    came first and its copy was kept; "doc10" likewise won over "doc9"."""
    text = "the original text of a document, long enough for a few shingles of five"
    records = [
        {"id": "x.jsonl:10", "text": text},
        {"id": "x.jsonl:2", "text": text},
        {"id": "doc10", "text": text + " and more"},
        {"id": "doc9", "text": text + " and more"},
        {"id": "doc011", "text": "a third text, which has a copy under a zero-padded id"},
        {"id": "doc012", "text": "a third text, which has a copy under a zero-padded id"},
    ]
    (tmp_path / "in").mkdir()
    (tmp_path / "in/a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    config = DedupConfig(mode=mode, **({"threshold": 0.95} if mode == "fuzzy" else {}))
    result = deduplicate(
        str(tmp_path / "in/a.jsonl"), str(tmp_path / "out"), config, backend="inline"
    )
    dup = {
        r["id"]: r["cluster_id"]
        for p in result.attributes
        for r in read_jsonl_gz(p)
        if r["duplicate"]
    }
    assert dup == {"x.jsonl:10": "x.jsonl:2", "doc10": "doc9", "doc012": "doc011"}


def test_paragraph_dedup(local_ctx, tmp_path):
    shared = "A line every page repeats."
    f1 = write_jsonl_gz(
        str(tmp_path / "in/1.jsonl"),
        [
            {"id": "d2", "text": f"Unique opening.\n{shared}\n\nSecond unique line."},
            {"id": "d3", "text": f"{shared}\n  a line every page REPEATS.  "},
        ],
    )
    f2 = write_jsonl_gz(
        str(tmp_path / "in/2.jsonl"),
        [
            {"id": "d1", "text": f"First.\n{shared}"},
            {"id": "d4", "text": "First."},
        ],
    )
    result = deduplicate(
        [f2, f1], str(tmp_path / "out"), DedupConfig(mode="paragraph"), context=local_ctx
    )
    attrs = {r["id"]: r for p in result.attributes for r in read_jsonl_gz(p)}
    docs = {r["id"]: r for p in result.documents for r in read_jsonl_gz(p)}
    source = {
        "d2": f"Unique opening.\n{shared}\n\nSecond unique line.",
        "d3": f"{shared}\n  a line every page REPEATS.  ",
    }
    # d1 holds the first copy of `shared` (smallest id), so d2 and d3 lose theirs.
    assert attrs["d1"]["duplicate_spans"] == []
    start = source["d2"].index(shared)
    assert attrs["d2"]["duplicate_spans"] == [[start, start + len(shared)]]
    assert docs["d2"]["text"] == "Unique opening.\n\nSecond unique line."
    assert [source["d3"][s:e] for s, e in attrs["d3"]["duplicate_spans"]] == [
        shared,
        "  a line every page REPEATS.  ",
    ]
    assert "d3" not in docs  # nothing new left in it
    assert attrs["d4"]["duplicate_spans"] == [[0, 6]] and "d4" not in docs
    # d3 loses all its text, d2 one line and its newline, d4 its only line.
    removed = len(source["d3"]) + len(shared) + 1 + len("First.")
    assert result.counts["paragraph"] == {
        "total": 8,
        "duplicates": 4,
        "unique": 4,
        "chars_removed": removed,
    }
    assert result.counts["document"]["emptied"] == 2


@pytest.mark.parametrize(
    "line,message",
    [
        ('{"id": 1, "body": "x"}', "record 1 has no 'text' field; give that record its text"),
        ('{"id": 1, "text": null}', "record 1: field 'text' is null: give that record its text"),
        ('{"id": 1.5, "text": "x"}', "field 'id' is a float"),
        ('{"id": 1, "text": 7}', "record 1 has an int in its 'text' field"),
        ("[1, 2]", "record 1 is a JSON list"),
        ('{"id": 1, "text": ', "line 2: invalid JSON"),
    ],
)
def test_bad_records_are_named(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": 0, "text": "fine"}\n' + line + "\n")
    with pytest.raises(Exception, match=message) as info:
        deduplicate(str(path), str(tmp_path / "out"), DedupConfig(mode="exact"), backend="inline")
    assert "bad.jsonl" in str(info.value)
    assert not os.path.exists(tmp_path / "out" / "counts.json")


def test_a_first_record_without_the_text_field_asks_for_text_key(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": 0, "body": "fine"}\n')
    with pytest.raises(Exception, match="record 0 has no 'text' field; pass text_key=..."):
        deduplicate(str(path), str(tmp_path / "out"), DedupConfig(mode="exact"), backend="inline")


def test_paragraph_cut_by_max_chars_is_never_a_duplicate(tmp_path):
    # Two documents share a line and the first 60 characters of a long paragraph, which
    # then differs. Only the shared line is a duplicate: the long paragraphs are not, and
    # cutting their hashed heads out left the rest of a paragraph behind.
    head = "x" * 60
    path = write_jsonl_gz(
        str(tmp_path / "in/long.jsonl"),
        [
            {"id": "a", "text": f"shared line\n{head} ending about cats"},
            {"id": "b", "text": f"shared line\n{head} ending about dogs\nshort tail"},
        ],
    )
    result = deduplicate(
        path, str(tmp_path / "out"), DedupConfig(mode="paragraph", max_chars=50), backend="inline"
    )
    docs = {r["id"]: r["text"] for p in result.documents for r in read_jsonl_gz(p)}
    assert docs == {
        "a": f"shared line\n{head} ending about cats",
        "b": f"{head} ending about dogs\nshort tail",
    }
    assert result.counts["document"]["truncated"] == 2
    assert result.counts["paragraph"]["duplicates"] == 1
