"""Damaged input files, seen from the dedup user: a truncated or mis-encoded file fails the run
naming the file (and line), never a run that succeeds on part of the corpus."""

from __future__ import annotations

import gzip
import json
import os

import pytest
import zstandard

from marin_dagster.dupekit import DedupConfig, deduplicate

DOCS = [{"id": i, "text": f"the quick brown fox number {i % 40}"} for i in range(120)]


def _jsonl(docs: list[dict]) -> bytes:
    return b"".join(json.dumps(d).encode() + b"\n" for d in docs)


def _write(path, data: bytes) -> str:
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


@pytest.mark.parametrize("suffix", [".jsonl.zst", ".jsonl.gz"])
def test_good_file_plus_truncated_file_fails(tmp_path, suffix) -> None:
    def compress(b: bytes) -> bytes:
        return (
            zstandard.ZstdCompressor().compress(b) if suffix.endswith("zst") else gzip.compress(b)
        )

    good = _write(tmp_path / "in" / f"a{suffix}", compress(_jsonl(DOCS[:60])))
    data = compress(_jsonl(DOCS[60:]))
    bad = _write(tmp_path / "in" / f"b{suffix}", data[: len(data) - 4])
    with pytest.raises(Exception) as err:
        deduplicate([good, bad], str(tmp_path / "out"), DedupConfig(mode="exact"), backend="inline")
    msg = str(err.value)
    assert bad in msg and "truncated" in msg and "re-download or regenerate" in msg
    assert not os.path.exists(tmp_path / "out" / "counts.json")


def test_invalid_utf8_names_file_and_line(tmp_path) -> None:
    lines = [json.dumps(d).encode() for d in DOCS[:3]] + [b""]
    lines.append(b'{"id": 99, "text": "na\xefve"}')
    path = _write(tmp_path / "in" / "latin1.jsonl", b"\n".join(lines) + b"\n")
    with pytest.raises(Exception) as err:
        deduplicate(path, str(tmp_path / "out"), DedupConfig(mode="exact"), backend="inline")
    msg = str(err.value)
    assert "latin1.jsonl" in msg and "line 5" in msg and "UTF-8" in msg


def test_record_errors_name_the_line(tmp_path) -> None:
    text = json.dumps(DOCS[0]) + "\n\n\n" + json.dumps({"id": 1, "body": "x"}) + "\n"
    path = _write(tmp_path / "in" / "gaps.jsonl", text.encode())
    with pytest.raises(Exception, match=r"gaps\.jsonl: line 4: record 1 has no 'text' field"):
        deduplicate(path, str(tmp_path / "out"), DedupConfig(mode="exact"), backend="inline")


def test_an_id_field_no_record_has_is_named_not_made_up(tmp_path) -> None:
    """A misspelt id_key made up ids for every record: which copy was kept then went by file
    order, and every output record gained the misspelt field. The default name still
    numbers records that have no ids, as documented."""
    docs = [{"doc_id": f"d{i}", "text": d["text"]} for i, d in enumerate(DOCS)]
    path = _write(tmp_path / "in" / "ids.jsonl", _jsonl(docs))
    with pytest.raises(
        Exception,
        match=r"ids\.jsonl: no record has the id field 'docid' \(id_key\); its first record's fields: doc_id, text",
    ):
        deduplicate(
            path, str(tmp_path / "out"), DedupConfig(mode="exact", id_key="docid"), backend="inline"
        )
    assert not os.path.exists(tmp_path / "out" / "counts.json")
    bare = _write(tmp_path / "in2" / "bare.jsonl", _jsonl([{"text": d["text"]} for d in DOCS]))
    deduplicate(bare, str(tmp_path / "out2"), DedupConfig(mode="exact"), backend="inline")
    assert json.loads((tmp_path / "out2" / "counts.json").read_text())["document"]["kept"] == 40
