"""The HTTP SQL service: rows as JSON, row limit, timeout, cache, and read-only in depth."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from marin_dagster.ducky import AssetEntry, resolve_catalog
from marin_dagster.ducky.service import SqlService
from tests.ducky.conftest import jsonl_gz, write_output

ENTRIES = [AssetEntry("raw/corpus", "sample_corpus", "aaaaaaaa")]


@contextlib.contextmanager
def serving(service: SqlService) -> Iterator[str]:
    server = service.make_server("127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def post(
    url: str, sql: str, limit: int | None = None, as_json: bool = True
) -> tuple[int, dict[str, Any]]:
    if as_json:
        body, ctype = json.dumps({"sql": sql, "limit": limit}).encode(), "application/json"
    else:
        body, ctype = sql.encode(), "text/plain"
    request = urllib.request.Request(f"{url}/query", data=body, headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def tree_state(root: str) -> dict[str, str]:
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.fixture
def served(tmp_path, corpus_records) -> Iterator[tuple[str, SqlService, str]]:
    prefix = str(tmp_path / "data")
    write_output(
        prefix,
        "raw/corpus",
        "aaaaaaaa",
        {
            "part-00000.jsonl.gz": jsonl_gz(corpus_records[:20]),
            "part-00001.jsonl.gz": jsonl_gz(corpus_records[20:]),
        },
    )
    service = SqlService(
        prefix, lambda: resolve_catalog(prefix, ENTRIES), max_rows=10, timeout_s=1.0
    )
    with serving(service) as url:
        yield url, service, prefix


def test_query_returns_rows_as_json_with_limit_and_cache(served, corpus_records):
    url, service, _ = served
    code, body = post(url, 'SELECT id, length(text) AS n FROM "raw/corpus" ORDER BY id LIMIT 3')
    assert code == 200
    expected = sorted(corpus_records, key=lambda r: r["id"])[:3]
    assert body["columns"] == ["id", "n"]
    assert body["rows"] == [[r["id"], len(r["text"])] for r in expected]
    assert (body["truncated"], body["cached"]) == (False, False)

    # A result over the row cap is refused and says how to narrow it; a limit asks for the first rows.
    code, body = post(url, 'SELECT id FROM "raw/corpus"', as_json=False)
    assert code == 413 and "more than 10 rows" in body["error"] and "LIMIT" in body["error"], body
    code, body = post(url, 'SELECT id FROM "raw/corpus" LIMIT 10', as_json=False)
    assert code == 200 and body["row_count"] == 10 and body["truncated"] is False
    code, body = post(url, 'SELECT id FROM "raw/corpus"', limit=4)
    assert code == 200 and body["row_count"] == 4 and body["truncated"] is True

    # The same SQL text is answered from the cache without reaching DuckDB.
    executed = service.executed
    code, body = post(url, 'SELECT id FROM "raw/corpus"', limit=4)
    assert body["cached"] is True and body["row_count"] == 4
    assert service.executed == executed

    with urllib.request.urlopen(f"{url}/tables", timeout=10) as response:
        tables = json.loads(response.read())["tables"]
    assert [(t["name"], t["version"], t["format"], t["files"]) for t in tables] == [
        ("raw/corpus", "aaaaaaaa", "jsonl", 2)
    ]


def test_a_query_past_the_timeout_is_stopped(served):
    url, service, _ = served
    code, body = post(url, "SELECT count(*) FROM range(100000000000) a")
    assert code == 408, body
    assert "timeout" in body["error"]
    # The connection still serves after the interrupt.
    code, body = post(url, 'SELECT count(*) FROM "raw/corpus"')
    assert code == 200 and body["rows"] == [[40]]


FORBIDDEN = [
    "COPY (SELECT 1) TO '{prefix}/copied.csv'",
    "COPY \"raw/corpus\" TO '{outside}/copied.parquet' (FORMAT parquet)",
    "ATTACH '{prefix}/attached.duckdb' AS a",
    "INSTALL httpfs",
    "LOAD httpfs",
    "CREATE TABLE t AS SELECT 1",
    'CREATE OR REPLACE VIEW "raw/corpus" AS SELECT 1 AS x',
    'DROP VIEW "raw/corpus"',
    'INSERT INTO "raw/corpus" VALUES (1)',
    "SET enable_external_access = true",
    "RESET lock_configuration",
    "PRAGMA enable_profiling",
    "CALL pragma_version()",
    "EXPLAIN ANALYZE COPY (SELECT 1) TO '{prefix}/explained.csv'",
    "EXPORT DATABASE '{prefix}/exported'",
    "CHECKPOINT",
    'SELECT 1; DROP VIEW "raw/corpus"',
    "USE memory",
    "DETACH memory",
    # SELECTs that would read files outside the prefix
    "SELECT * FROM read_csv('{outside}/secret.csv')",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM read_json('{prefix}/../secret.jsonl')",
    "SELECT * FROM glob('/etc/*')",
    "SELECT * FROM '{outside}/secret.csv'",
    "SELECT * FROM query('DROP VIEW \"raw/corpus\"')",
]


SECRET = 8_675_309_271_828


def test_every_forbidden_statement_is_refused_and_nothing_changes(served, tmp_path):
    url, service, prefix = served
    outside = tmp_path / "outside"
    outside.mkdir()
    # The secret must be a value no path or message could hold by chance
    # (pytest's tmp folders are numbered: pytest-42 once failed CI).
    (outside / "secret.csv").write_text(f"secret\n{SECRET}\n")
    (tmp_path / "secret.jsonl").write_text(f'{{"secret": {SECRET}}}\n')
    before_prefix, before_outside = tree_state(prefix), tree_state(str(outside))
    _, before = post(url, 'SELECT id, text FROM "raw/corpus" ORDER BY id', limit=10)

    for template in FORBIDDEN:
        sql = template.format(prefix=prefix, outside=outside)
        code, body = post(url, sql)
        assert code in (400, 403), (sql, code, body)
        assert "error" in body and "secret" not in json.dumps(body.get("rows", [])), sql
        assert str(SECRET) not in body["error"], (sql, body)
        # Statements that parse are refused for what they are, not by accident.
        if not template.startswith("SELECT * FROM query("):
            assert code == 403, (sql, body)

    assert tree_state(prefix) == before_prefix
    assert tree_state(str(outside)) == before_outside
    assert not os.path.exists(os.path.join(prefix, "exported"))
    code, after = post(url, 'SELECT id, text FROM "raw/corpus" ORDER BY id', limit=10)
    assert code == 200 and after["rows"] == before["rows"]
    code, body = post(url, "SELECT current_setting('enable_external_access') AS v")
    assert body["rows"] == [[False]]


def test_reads_inside_the_prefix_are_allowed(served):
    url, _, prefix = served
    code, body = post(
        url, f"SELECT count(*) FROM read_json('{prefix}/raw/corpus-aaaaaaaa/*.jsonl.gz')"
    )
    assert code == 200 and body["rows"] == [[40]]


def test_a_slow_query_does_not_hold_the_other_requests(tmp_path, corpus_records):
    """Every request waited on one lock: a query running to its timeout held /tables and
    every other query (a `SELECT 42` took 27 s)."""
    from marin_dagster.ducky import resolve_views

    prefix = str(tmp_path / "data")
    write_output(prefix, "raw/corpus", "aaaaaaaa", {"a.jsonl.gz": jsonl_gz(corpus_records)})
    service = SqlService(prefix, lambda: resolve_views(prefix, ENTRIES), timeout_s=8.0)
    with serving(service) as url:
        slow: list[tuple[int, dict[str, Any]]] = []
        thread = threading.Thread(
            target=lambda: slow.append(post(url, "SELECT count(*) FROM range(100000000000) a"))
        )
        thread.start()
        while service.running == 0 and not slow:
            threading.Event().wait(0.05)
        code, body = post(url, 'SELECT count(*) FROM "raw/corpus"')
        with urllib.request.urlopen(f"{url}/tables", timeout=60) as response:
            tables = json.loads(response.read())
        answered_while_running = thread.is_alive()
        thread.join(60)
    assert code == 200 and body["rows"] == [[40]]
    assert [t["name"] for t in tables["tables"]] == ["raw/corpus"]
    assert answered_while_running  # both came back while the slow one still ran
    assert slow[0][0] == 408  # which then met its timeout


def test_a_view_built_since_the_last_look_is_seen_at_once(tmp_path, corpus_records):
    """The catalog is read every refresh_s (30 s): a query of an asset materialized in the
    meantime said "not materialized yet" until then."""
    from marin_dagster.ducky import resolve_views
    from marin_dagster.ducky.service import QueryFailed

    prefix = str(tmp_path / "data")
    entries = [AssetEntry("raw/late", "k", "bbbbbbbb")]
    service = SqlService(prefix, lambda: resolve_views(prefix, entries))
    with pytest.raises(QueryFailed, match="not materialized yet"):
        service.query('SELECT count(*) FROM "raw/late"')
    write_output(prefix, "raw/late", "bbbbbbbb", {"a.jsonl.gz": jsonl_gz(corpus_records)})
    assert service.query('SELECT count(*) FROM "raw/late"')["rows"] == [[40]]
