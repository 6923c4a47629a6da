"""What the SQL service says about requests it cannot run: a view name left unquoted, and an
HTTP body that is not {"sql": ..., "limit": ...}."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from marin_dagster.ducky import AssetEntry, resolve_catalog
from marin_dagster.ducky.service import QueryFailed, SqlService
from tests.ducky.conftest import jsonl_gz, write_output
from tests.ducky.test_service import serving
from tests.ducky.test_service_caps import query, request

ENTRIES = [
    AssetEntry("raw/notes", "sample_corpus", "aaaaaaaa"),
    AssetEntry("raw/notes-extra", "sample_corpus", "bbbbbbbb"),
    AssetEntry("dedup/notes", "sample_corpus", "cccccccc"),
]


@pytest.fixture
def service(tmp_path, corpus_records) -> SqlService:
    prefix = str(tmp_path / "data")
    for entry in ENTRIES:
        write_output(
            prefix, entry.name, entry.version, {"part-00000.jsonl.gz": jsonl_gz(corpus_records)}
        )
    return SqlService(prefix, lambda: resolve_catalog(prefix, ENTRIES), max_rows=50)


@pytest.fixture
def url(service) -> Iterator[str]:
    with serving(service) as url:
        yield url


HINT = 'view names holding "/" must be in double quotes: write '


def test_an_unquoted_view_name_gets_a_hint_to_quote_it(service):
    with pytest.raises(QueryFailed) as e:
        service.query("select * from raw/notes")
    assert "Parser Error" in str(e.value)
    assert str(e.value).endswith(HINT + '"raw/notes" for raw/notes'), str(e.value)

    with pytest.raises(QueryFailed) as e:
        service.query('select * from "raw/notes" join raw/notes-extra using (id)')
    assert str(e.value).endswith(HINT + '"raw/notes-extra" for raw/notes-extra'), str(e.value)

    # Other syntax errors are left as DuckDB words them.
    with pytest.raises(QueryFailed) as e:
        service.query('selec * from "raw/notes"')
    assert "Parser Error" in str(e.value) and HINT not in str(e.value)
    assert service.query('select count(*) from "raw/notes"')["rows"] == [[40]]


def test_an_error_names_the_line_of_the_query_as_written(service):
    """The service runs the query inside `SELECT * FROM (...)`; DuckDB's line numbers are
    told in the user's lines, the caret still under the column it names."""
    with pytest.raises(QueryFailed) as e:
        service.query('select nocol from "raw/notes"')
    assert 'Binder Error: Referenced column "nocol"' in str(e.value)
    assert "\nLINE 1: select nocol from" in str(e.value), str(e.value)
    lines = "select\n" + "id,\n" * 7 + 'nocol from "raw/notes"'  # nocol on line 9
    with pytest.raises(QueryFailed) as e:
        service.query(lines)
    shown, caret = str(e.value).splitlines()[-2:]
    assert shown == 'LINE 9:  nocol from "raw/notes"', str(e.value)
    assert shown[caret.index("^") :].startswith("nocol")


def test_a_view_not_found_is_answered_with_the_views_meant(service):
    """DuckDB's own "Did you mean" offers its catalog tables ("pg_namespace") for a view
    named without its folder; the service offers views."""
    with pytest.raises(QueryFailed) as e:
        service.query("select * from notes")
    # every view of that name, not the last one listed
    assert 'there is no view "notes"; did you mean "raw/notes" or "dedup/notes"?' in str(e.value), (
        str(e.value)
    )
    assert "pg_" not in str(e.value) and "\nLINE 1: select * from notes" in str(e.value)
    with pytest.raises(QueryFailed) as e:
        service.query('select * from "raw/nots"')
    assert 'did you mean "raw/notes"' in str(e.value), str(e.value)
    with pytest.raises(QueryFailed) as e:
        service.query("select * from quarterly_sales")
    assert 'the views: "raw/notes", "raw/notes-extra"' in str(e.value), str(e.value)


def test_the_hint_reaches_http_clients(url):
    code, body, _ = query(url, "select count(*) from raw/notes")
    assert code == 400 and HINT + '"raw/notes" for raw/notes' in body["error"], body


SHAPE = (
    'the body must be a JSON object with "sql" (a string: one SELECT) and optionally '
    '"limit" (a whole number of rows), e.g. {"sql": "SELECT 1", "limit": 10}; '
)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"query": "SELECT 1"}', 'unknown key(s) "query"'),
        (b'{"sql": "SELECT 1", "limt": 5}', 'unknown key(s) "limt"'),
        (b"[]", "got an array"),
        (b'"SELECT 1"', "got a string"),
        (b"{}", '"sql" is missing'),
        (b'{"sql": ["SELECT 1"]}', '"sql" is an array'),
        (b'{"sql": null}', '"sql" is null'),
        (b"{sql: SELECT 1}", "it is not JSON (Expecting property name"),
    ],
)
def test_a_body_of_the_wrong_shape_is_a_400_saying_what_to_send(url, body, why):
    code, raw = request(url, body)
    assert code == 400, raw
    error = raw.decode()
    assert SHAPE + why in error.replace('\\"', '"'), error
    assert "list indices" not in error and "('sql')" not in error


def test_a_good_body_still_runs(url):
    code, body, _ = query(url, 'SELECT count(*) AS n FROM "raw/notes"', limit=1)
    assert code == 200 and body["rows"] == [[40]]


@pytest.mark.parametrize("ctype", ["application/x-www-form-urlencoded", "text/plain", ""])
def test_a_json_body_is_read_as_json_whatever_its_content_type(url, ctype):
    # `curl -d '{"sql": ...}'`, the README's request, sends a form content type; the body was
    # then run as SQL and failed with DuckDB's parser error on the "{".
    code, raw = request(
        url, b' {"sql": "SELECT count(*) AS n FROM \\"raw/notes\\"", "limit": 1}', ctype
    )
    assert code == 200, raw
    assert json.loads(raw)["rows"] == [[40]]
    code, raw = request(url, b'{"query": "SELECT 1"}', ctype)
    assert code == 400 and 'unknown key(s) \\"query\\"' in raw.decode(), raw


def test_a_plain_sql_body_still_runs_as_sql(url):
    code, raw = request(url, b'SELECT count(*) AS n FROM "raw/notes"', "text/plain")
    assert code == 200 and json.loads(raw)["rows"] == [[40]], raw


@pytest.mark.parametrize("body", [b'{"sql": ""}', b'{"sql": "  "}'])
def test_an_empty_sql_is_a_400_not_a_refusal(url, body):
    """It was a 403 "refused", as if it had tried to write."""
    code, raw = request(url, body)
    assert code == 400 and "the SQL is empty" in raw.decode(), raw
