"""Caps per response of the HTTP SQL service (rows, bytes), `limit` validation, and a bounded server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from marin_dagster.ducky import AssetEntry, resolve_catalog
from marin_dagster.ducky.service import SqlService
from tests.ducky.conftest import jsonl_gz, write_output
from tests.ducky.test_service import serving

ENTRIES = [AssetEntry("raw/big", "sample_corpus", "aaaaaaaa")]
DOCS = 300
TEXT_CHARS = 10_000


def request(url: str, body: bytes, ctype: str = "application/json") -> tuple[int, bytes]:
    req = urllib.request.Request(f"{url}/query", data=body, headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def query(url: str, sql: str, **fields: Any) -> tuple[int, dict[str, Any], int]:
    code, raw = request(url, json.dumps({"sql": sql, **fields}).encode())
    return code, json.loads(raw), len(raw)


@pytest.fixture
def big(tmp_path) -> str:
    """300 documents of 10,000 characters: about 3 MB of rows as JSON."""
    prefix = str(tmp_path / "data")
    docs = [
        {"id": f"doc-{i:03d}", "text": f"{i:03d}" + "x" * (TEXT_CHARS - 3)} for i in range(DOCS)
    ]
    write_output(
        prefix,
        "raw/big",
        "aaaaaaaa",
        {"part-00000.jsonl.gz": jsonl_gz(docs[:150]), "part-00001.jsonl.gz": jsonl_gz(docs[150:])},
    )
    return prefix


@pytest.fixture
def capped(big) -> Iterator[tuple[str, SqlService]]:
    service = SqlService(
        big,
        lambda: resolve_catalog(big, ENTRIES),
        max_rows=200,
        max_bytes=256 << 10,
        timeout_s=60.0,
    )
    with serving(service) as url:
        yield url, service


def test_a_result_over_the_byte_cap_is_a_413_that_says_how_to_narrow_it(capped):
    url, _ = capped
    code, body, size = query(url, 'SELECT * FROM "raw/big"', limit=100)
    assert code == 413, body
    assert "over 256 KiB" in body["error"] and "left(text, 200)" in body["error"], body
    assert "aggregate" in body["error"] and (body["max_rows"], body["max_bytes"]) == (
        200,
        256 << 10,
    )
    assert size < 2000  # the error, not the rows

    # Narrowed, the same rows fit: shorter columns, or fewer rows.
    code, body, _ = query(
        url, 'SELECT id, left(text, 20) AS head FROM "raw/big" ORDER BY id', limit=100
    )
    assert code == 200 and body["row_count"] == 100 and body["truncated"] is True
    assert body["rows"][0] == ["doc-000", "000" + "x" * 17]
    code, body, size = query(url, 'SELECT id, text FROM "raw/big" ORDER BY id LIMIT 20')
    assert (
        code == 200
        and body["row_count"] == 20
        and [r[0] for r in body["rows"]] == [f"doc-{i:03d}" for i in range(20)]
    )
    assert (
        20 * TEXT_CHARS < size <= (256 << 10) + 1000
    )  # the rows, within the cap (plus the envelope)


def test_a_result_over_the_row_cap_is_a_413_unless_a_limit_asks_for_the_first_rows(capped):
    url, _ = capped
    code, body, _ = query(url, 'SELECT id FROM "raw/big"')
    assert code == 413, body
    assert (
        "more than 200 rows" in body["error"]
        and "LIMIT" in body["error"]
        and '"limit"' in body["error"]
    )
    code, body, _ = query(url, "SELECT id FROM \"raw/big\" WHERE id < 'doc-200'")
    assert code == 200 and body["row_count"] == 200 and body["truncated"] is False
    # The first rows in the query's order: the cap does not reorder an ORDER BY.
    code, body, _ = query(url, 'SELECT id FROM "raw/big" ORDER BY id DESC', limit=3)
    assert (
        code == 200
        and body["rows"] == [["doc-299"], ["doc-298"], ["doc-297"]]
        and body["truncated"]
    )
    code, body, _ = query(url, 'SELECT id FROM "raw/big" -- a trailing comment', limit=0)
    assert (
        code == 200
        and body["columns"] == ["id"]
        and body["rows"] == []
        and body["truncated"] is True
    )


@pytest.mark.parametrize("limit", ["10", "abc", -1, 2.5, True, [3], 201])
def test_a_bad_limit_is_a_400_that_says_what_limit_takes(capped, limit):
    url, service = capped
    executed = service.executed
    code, body, _ = query(url, 'SELECT id FROM "raw/big"', limit=limit)
    assert code == 400, body
    assert '"limit"' in body["error"] and "0 to 200" in body["error"], body
    assert service.executed == executed


@pytest.mark.parametrize("body", [b"[1, 2]", b'{"sql": 5}', b'{"limit": 3}', b"{not json"])
def test_a_malformed_json_request_is_a_400(capped, body):
    url, _ = capped
    code, raw = request(url, body)
    assert code == 400 and json.loads(raw)["error"], raw


def _peak_rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def test_a_huge_result_does_not_grow_the_server(big):
    """400 MB of rows (40,000 x 10 KB) against the default caps: 10,000 rows would be 100 MB, as
    JSON and as Python objects more than twice that; the server fetches about 16 MiB of them,
    answers 413, and its peak memory grows by far less."""
    service = SqlService(big, lambda: resolve_catalog(big, ENTRIES), timeout_s=120.0)
    assert (service.max_rows, service.max_bytes) == (10_000, 16 << 20)
    with serving(service) as url:
        code, body, _ = query(url, "SELECT 1 AS warm")
        assert code == 200
        try:
            with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM) to now
                f.write("5")
        except OSError as e:
            pytest.fail(f"cannot reset the peak memory counter here: {e}")
        before = _peak_rss_mib()
        code, body, size = query(url, "SELECT i, repeat('y', 10000) AS s FROM range(40000) t(i)")
        grown = _peak_rss_mib() - before
    assert code == 413 and "over 16 MiB" in body["error"], body
    assert grown < 150, f"the server's peak memory grew by {grown:.0f} MiB for a 413"


def test_the_cache_holds_at_most_cache_bytes(big):
    service = SqlService(big, lambda: resolve_catalog(big, ENTRIES), cache_bytes=50_000)
    with serving(service) as url:
        for _ in range(2):
            code, body, _ = query(url, 'SELECT id, text FROM "raw/big" ORDER BY id LIMIT 10')
            assert code == 200 and body["cached"] is False  # 100 KB: over the cache's bytes
        for cached in (False, True):
            code, body, _ = query(url, 'SELECT id FROM "raw/big" ORDER BY id LIMIT 10')
            assert code == 200 and body["cached"] is cached


def test_caps_must_be_positive_whole_numbers(big):
    for field, value in (("max_rows", 0), ("max_bytes", -1), ("max_rows", "10")):
        with pytest.raises(ValueError, match=field):
            SqlService(big, lambda: [], **{field: value})
