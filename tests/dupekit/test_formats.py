"""Parquet and CSV inputs, as `dataset(...)` fetches them: the same dedup as their JSON lines,
each file's kept documents written back in its own format."""

from __future__ import annotations

import json
import os
import random

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from marin_dagster.dupekit import DedupConfig, deduplicate
from tests.dupekit.corpus import read_jsonl_gz

WORDS = [f"w{i}" for i in range(400)]


def _docs() -> list[dict]:
    rng = random.Random(7)
    docs = [{"id": f"d{i:02d}", "text": " ".join(rng.choices(WORDS, k=150))} for i in range(16)]
    near = docs[3]["text"].split()
    near[40], near[90] = "changed", "words"
    docs.append({"id": "n03", "text": " ".join(near)})  # a near duplicate of d03
    docs.append({"id": "x05", "text": docs[5]["text"]})  # an exact one of d05
    docs.append({"id": "p01", "text": docs[1]["text"] + "\n\nA paragraph of its own."})
    return docs


def _write(folder, fmt: str, docs: list[dict]) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    paths = []
    for k in range(2):
        part, path = docs[k::2], os.path.join(folder, f"part-{k}.{fmt}")
        if fmt == "jsonl":
            with open(path, "w") as f:
                f.writelines(json.dumps(d) + "\n" for d in part)
        elif fmt == "parquet":
            pq.write_table(pa.Table.from_pylist(part), path)
        else:
            pacsv.write_csv(pa.Table.from_pylist(part), path)
        paths.append(path)
    return paths


def _read(path: str) -> list[dict]:
    if path.endswith(".parquet"):
        return pq.read_table(path).to_pylist()
    if path.endswith(".csv"):
        return pacsv.read_csv(path).to_pylist()
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("mode", ["exact", "fuzzy", "paragraph"])
def test_parquet_and_csv_dedup_as_their_json_lines_do(tmp_path, mode):
    docs = _docs()
    results = {}
    for fmt in ("jsonl", "parquet", "csv"):
        out = str(tmp_path / f"out-{fmt}")
        result = deduplicate(
            _write(tmp_path / fmt, fmt, docs), out, DedupConfig(mode=mode), backend="inline"
        )
        assert [os.path.relpath(p, out) for p in result.documents] == [
            f"documents/part-0.{fmt}",
            f"documents/part-1.{fmt}",
        ]
        assert [os.path.relpath(p, out) for p in result.attributes] == [
            "attributes/part-0.jsonl.gz",
            "attributes/part-1.jsonl.gz",
        ]
        kept = [d for p in result.documents for d in _read(p)]
        attributes = [a for p in result.attributes for a in read_jsonl_gz(p)]
        results[fmt] = (kept, attributes)
    assert results["parquet"] == results["jsonl"]
    assert results["csv"] == results["jsonl"]
    kept_ids = {d["id"] for d in results["jsonl"][0]}
    if mode == "exact":
        assert "x05" not in kept_ids and "n03" in kept_ids
    elif mode == "fuzzy":
        assert not {"x05", "n03"} & kept_ids
    else:
        (p01,) = [d for d in results["jsonl"][0] if d["id"] == "p01"]
        assert p01["text"].strip() == "A paragraph of its own."


def test_a_file_of_another_format_is_refused_naming_the_formats(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("just text\n")
    with pytest.raises(ValueError, match=r"notes.txt: dedup reads JSON lines .* Parquet and CSV"):
        deduplicate(str(path), str(tmp_path / "out"), DedupConfig(mode="exact"), backend="inline")


def test_inputs_of_one_name_in_two_formats_keep_their_own_attributes(tmp_path):
    """a.jsonl, a.csv and a.jsonl.gz each wrote attributes/a.jsonl.gz, the last one over the
    others: 5 of 6 records lost their attributes, and the run succeeded."""
    import gzip

    folder = tmp_path / "in"
    folder.mkdir()
    docs = _docs()
    with open(folder / "a.jsonl", "w") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs[:2])
    pacsv.write_csv(pa.Table.from_pylist(docs[2:5]), folder / "a.csv")
    with gzip.open(folder / "a.jsonl.gz", "wt") as f:
        f.write(json.dumps(docs[5]) + "\n")
    with open(folder / "b.jsonl", "w") as f:
        f.write(json.dumps(docs[6]) + "\n")
    out = str(tmp_path / "out")
    files = sorted(str(p) for p in folder.iterdir())
    result = deduplicate(files, out, DedupConfig(mode="exact"), backend="inline")
    lines = {os.path.relpath(p, out): len(read_jsonl_gz(p)) for p in result.attributes}
    assert lines == {
        "attributes/a.csv.jsonl.gz": 3,
        "attributes/a.jsonl.jsonl.gz": 2,
        "attributes/a.jsonl.gz.jsonl.gz": 1,
        "attributes/b.jsonl.gz": 1,  # a name of its own keeps Marin's layout
    }


def test_a_csv_is_written_back_with_its_values_unchanged(tmp_path):
    """Arrow's type inference rewrote the kept rows: 007 became 7, NA an empty field, true
    True, 1.50 1.5 and a date a timestamp; the docs promise the fields unchanged."""
    body = (
        "id,text,flag,price,note,day,code\n"
        "1,first text,true,1.50,NA,2020-01-01,007\n"
        "2,second text,false,2.00,,2021-02-03,01234\n"
        "3,first text,true,1.50,NA,2020-01-01,007\n"
    )
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "c.csv").write_text(body)
    result = deduplicate(
        str(tmp_path / "in" / "c.csv"),
        str(tmp_path / "out"),
        DedupConfig(mode="exact"),
        backend="inline",
    )
    [documents] = result.documents
    with open(documents) as f:
        assert f.read() == "".join(body.splitlines(keepends=True)[:3])
    attributes = [a for p in result.attributes for a in read_jsonl_gz(p)]
    assert [(a["id"], a["duplicate"]) for a in attributes] == [
        ("1", False),
        ("2", False),
        ("3", True),
    ]


@pytest.mark.parametrize("suffix", [".bz2", ".xz"])
def test_an_input_compressed_as_bz2_or_xz_is_written_back_so(tmp_path, suffix):
    """Read, but not written: dedup failed at its last stage, after all its work, with
    "writing bz2 is not supported"."""
    import bz2
    import lzma

    compress = bz2.compress if suffix == ".bz2" else lzma.compress
    docs = _docs()
    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / f"x.jsonl{suffix}"
    path.write_bytes(compress("".join(json.dumps(d) + "\n" for d in docs).encode()))
    result = deduplicate(
        str(path), str(tmp_path / "out"), DedupConfig(mode="exact"), backend="inline"
    )
    [documents] = result.documents
    assert documents.endswith(f"documents/x.jsonl{suffix}")
    decompress = bz2.decompress if suffix == ".bz2" else lzma.decompress
    with open(documents, "rb") as f:
        kept = [json.loads(line) for line in decompress(f.read()).splitlines()]
    assert [d["id"] for d in kept] == [d["id"] for d in docs if d["id"] != "x05"]


def test_a_parquet_file_is_written_back_with_its_own_schema(tmp_path):
    """The kept rows were written with inferred types: int32 became int64, float32 double,
    timestamp[ms] timestamp[us], a dictionary column string, and the metadata was lost."""
    import datetime

    schema = pa.schema(
        [
            ("id", pa.int32()),
            ("text", pa.string()),
            ("score", pa.float32()),
            ("at", pa.timestamp("ms")),
            ("lang", pa.dictionary(pa.int8(), pa.string())),
        ],
        metadata={b"origin": b"crawl-7"},
    )
    day = datetime.datetime(2020, 1, 1)
    rows = [
        {"id": i, "text": t, "score": 0.5, "at": day, "lang": "en"}
        for i, t in enumerate(["one text", "two text", "one text"])
    ]
    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / "p.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    result = deduplicate(str(path), str(tmp_path / "out"), DedupConfig(mode="exact"))
    [documents] = result.documents
    kept = pq.read_table(documents)
    assert kept.schema.equals(schema, check_metadata=True), kept.schema
    assert kept.column("id").to_pylist() == [0, 1]

    # A record without an id gets a generated (string) one, which an integer id column
    # cannot hold: that file's ids become strings, the other columns keep their types (it
    # failed before, "field 'id' of record 1 is str").
    rows[1]["id"] = None
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    result = deduplicate(str(path), str(tmp_path / "out2"), DedupConfig(mode="exact"))
    kept = pq.read_table(result.documents[0])
    assert kept.column("id").to_pylist() == ["0", "p.parquet#1"]
    assert kept.schema.field("score").type == pa.float32()


def test_a_tsv_file_is_read_and_written_back_with_tabs(tmp_path):
    """A .tsv was read as comma-separated ("Expected 1 columns, got 2"), though the SQL
    views list it as CSV."""
    from marin_dagster.zephyr import Dataset, ZephyrContext

    body = "id\ttext\n1\tone, with a comma\n2\ttwo\n3\tone, with a comma\n"
    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / "t.tsv"
    path.write_text(body)
    with ZephyrContext(max_workers=1, backend="inline") as ctx:
        rows = ctx.execute(Dataset.from_files(str(path)).load_file()).results
    assert [r["text"] for r in rows] == ["one, with a comma", "two", "one, with a comma"]
    result = deduplicate(str(path), str(tmp_path / "out"), DedupConfig(mode="exact"))
    [documents] = result.documents
    with open(documents, newline="") as f:
        assert f.read().replace("\r\n", "\n") == "".join(body.splitlines(keepends=True)[:3])
