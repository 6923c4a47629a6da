"""`marin sql` over a prefix holding outputs like the demo's: a raw corpus, a trained tokenizer
and a real fuzzy dedup output (documents/, attributes/, signatures/, links/, counts.json)."""

from __future__ import annotations

import gzip
import json
import logging
import os
import random
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from marin_dagster import fs
from marin_dagster.dupekit import DedupConfig, deduplicate
from marin_dagster.execution.step import execute_step
from marin_dagster.tokenize import train_tokenizer
from tests.cli.sql_server import post_sql, sql_server
from tests.ducky.conftest import jsonl_gz, write_output

RAW, TOKENIZER, DEDUP = "raw/shakespeare", "tokenizers/shakespeare-bpe", "dedup/shakespeare"


def _corpus() -> list[dict[str, Any]]:
    """40 documents of random words; documents 30-39 copy 0-9 with one word changed."""
    rng = random.Random(7)
    words = [f"w{i}" for i in range(400)]
    docs = [
        {
            "id": f"doc-{i:02d}",
            "title": f"t{i % 4}",
            "edition": "modern",
            "text": " ".join(rng.choice(words) for _ in range(120)),
        }
        for i in range(30)
    ]
    for i in range(10):
        text = docs[i]["text"].split()
        text[5] = "changed"
        docs.append(
            {
                "id": f"doc-{30 + i:02d}",
                "title": docs[i]["title"],
                "edition": "folio",
                "text": " ".join(text),
            }
        )
    return docs


def _steps() -> dict[str, Any]:
    from marin_dagster.cli import _steps

    return {s.name: s for s in _steps()}


def _build(prefix: str) -> dict[str, Any]:
    steps = _steps()
    docs = _corpus()
    raw = write_output(
        prefix,
        RAW,
        steps[RAW].version,
        {
            "part-00000-of-00002.jsonl.gz": jsonl_gz(docs[0::2]),
            "part-00001-of-00002.jsonl.gz": jsonl_gz(docs[1::2]),
        },
    )
    execute_step(
        fs.join(prefix, f"{TOKENIZER}-{steps[TOKENIZER].version}"),
        steps[TOKENIZER].version,
        lambda out: (train_tokenizer((d["text"] for d in docs), out, vocab_size=300), {})[1],
    )
    counts: dict[str, Any] = {}

    def dedup(out: str) -> dict[str, Any]:
        result = deduplicate(f"{raw}/*.jsonl.gz", out, DedupConfig(mode="fuzzy"), max_workers=1)
        counts.update(result.counts)
        return {}

    dedup_path = fs.join(prefix, f"{DEDUP}-{steps[DEDUP].version}")
    execute_step(dedup_path, steps[DEDUP].version, dedup)
    return {"docs": docs, "counts": counts, "raw": raw, "dedup": dedup_path}


@pytest.fixture(scope="module")
def demo_outputs(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("sql-outputs")
    prefix = str(root / "data")
    built = _build(prefix)
    return {"prefix": prefix, "cwd": str(root), **built}


def marin_sql(capsys, monkeypatch, prefix: str, *args: str) -> tuple[int, str, str]:
    """`marin sql ...` through cli.main, in this process."""
    from marin_dagster.cli import main

    monkeypatch.setenv("MARIN_PREFIX", prefix)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    capsys.readouterr()
    code = main(["sql", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_demo_outputs_have_the_side_files_that_broke_the_views(demo_outputs):
    dedup = demo_outputs["dedup"]
    for rel in ("counts.json", ".status.json", ".manifest.json"):
        assert os.path.exists(os.path.join(dedup, rel)), rel
    for folder in ("documents", "attributes", "signatures", "links"):
        assert os.listdir(os.path.join(dedup, folder)), folder
    assert demo_outputs["counts"]["document"]["duplicates"] == 10


def test_sql_answers_once_the_demo_outputs_exist(demo_outputs, capsys, monkeypatch):
    prefix = demo_outputs["prefix"]
    code, out, err = marin_sql(capsys, monkeypatch, prefix, "SELECT 1 AS one", "--json")
    assert code == 0, err
    assert json.loads(out)["rows"] == [[1]]

    # The dedup view is its documents: the input's fields, one row per document kept.
    code, out, err = marin_sql(
        capsys, monkeypatch, prefix, f'SELECT * FROM "{DEDUP}" ORDER BY id', "--json"
    )
    assert code == 0, err
    result = json.loads(out)
    assert set(result["columns"]) == {"id", "title", "edition", "text"}
    kept = demo_outputs["counts"]["document"]["kept"]
    assert result["row_count"] == kept == 30
    assert [r[result["columns"].index("id")] for r in result["rows"]] == [
        f"doc-{i:02d}" for i in range(30)
    ]

    code, out, err = marin_sql(
        capsys, monkeypatch, prefix, f'SELECT count(*) AS n FROM "{RAW}"', "--json"
    )
    assert code == 0 and json.loads(out)["rows"] == [[40]], err

    # The tokenizer's output holds no data shards (tokenizer.json is one JSON document): no view.
    code, out, err = marin_sql(capsys, monkeypatch, prefix, f'SELECT * FROM "{TOKENIZER}"')
    assert code == 1
    assert (
        f'"{DEDUP}"' in err and f'"{RAW}"' in err and f'"{TOKENIZER}"' not in err.split("views:")[1]
    )


@pytest.fixture
def broken_raw(demo_outputs) -> Iterator[dict[str, Any]]:
    """The raw corpus with a shard that is not JSON lines (a torn copy, say)."""
    shard = os.path.join(demo_outputs["raw"], "part-00000-of-00002.jsonl.gz")
    with open(shard, "rb") as f:
        good = f.read()
    with open(shard, "wb") as f:
        f.write(gzip.compress(b"this is not JSON\n" * 3))
    try:
        yield demo_outputs
    finally:
        with open(shard, "wb") as f:
            f.write(good)


def test_one_view_that_cannot_be_built_does_not_stop_the_others(
    broken_raw, capsys, monkeypatch, caplog
):
    prefix = broken_raw["prefix"]
    with caplog.at_level(logging.WARNING, logger="marin_dagster"):
        code, out, err = marin_sql(
            capsys, monkeypatch, prefix, f'SELECT count(*) FROM "{DEDUP}"', "--json"
        )
    assert code == 0, err
    assert json.loads(out)["rows"] == [[30]]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(RAW in w and "part-00000-of-00002.jsonl.gz" in w for w in warnings), warnings

    code, out, err = marin_sql(capsys, monkeypatch, prefix, f'SELECT * FROM "{RAW}" LIMIT 1')
    assert code == 1
    line = next(x for x in err.splitlines() if x.startswith("marin sql: "))
    assert f'the view "{RAW}" is unavailable' in line, err
    assert "part-00000-of-00002.jsonl.gz" in line and f"rebuild {RAW} (materialize" in line, err
    assert f'unavailable (see the warnings above): "{RAW}"' in err


def test_sql_serve_starts_and_answers_with_one_broken_view(broken_raw, tmp_path):
    log = str(tmp_path / "serve.log")
    with sql_server(["--prefix", broken_raw["prefix"]], log, broken_raw["cwd"]) as url:
        code, body = post_sql(url, f'SELECT count(*) FROM "{DEDUP}"')
        assert code == 200 and body["rows"] == [[30]], body
        code, body = post_sql(url, f'SELECT * FROM "{RAW}"')
        assert code == 400 and f'the view "{RAW}" is unavailable' in body["error"], body
        with urllib.request.urlopen(f"{url}/tables", timeout=10) as response:
            tables = json.loads(response.read())
        assert DEDUP in [t["name"] for t in tables["tables"]]
        assert [u["name"] for u in tables["unavailable"]] == [RAW]
    with open(log) as f:
        assert RAW in f.read()


def test_sql_says_when_a_view_is_an_older_config_or_not_built(tmp_path, capsys, monkeypatch):
    prefix = str(tmp_path / "data")
    assert _steps()[RAW].version != "0badc0de"
    write_output(prefix, RAW, "0badc0de", {"a.jsonl.gz": jsonl_gz(_corpus()[:3])})
    code, out, err = marin_sql(capsys, monkeypatch, prefix, f'SELECT count(*) FROM "{RAW}"')
    assert code == 0 and "3" in out, err
    assert f'marin sql: note: "{RAW}" shows version 0badc0de' in err, err
    assert "not materialized yet" in err, err

    code, out, err = marin_sql(capsys, monkeypatch, prefix, f'SELECT * FROM "{DEDUP}"')
    assert code == 1
    assert f'there is no view "{DEDUP}" yet: {DEDUP} is not materialized yet' in err, err


def test_no_view_of_the_code_location_points_at_an_experiment_files_own(
    tmp_path, capsys, monkeypatch
):
    """A user who built their own experiment file and queried without -f read "views: none
    (materialize an asset first)" of what they had just materialized."""
    code, _, err = marin_sql(capsys, monkeypatch, str(tmp_path / "empty"), 'SELECT 1 FROM "x"')
    assert code == 1
    assert (
        "views: none of the code location's assets is built (an experiment file's: -f FILE)"
    ) in err, err
