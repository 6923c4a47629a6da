"""What `marin sql` says about an asset whose current version has no output to show: an older
config's output is shown with a note, and a query of an asset not built yet says where it stands."""

from __future__ import annotations

import json
import urllib.request

import pytest

from marin_dagster import fs
from marin_dagster.ducky import AssetEntry, NoView, resolve_views
from marin_dagster.ducky.service import QueryFailed, SqlService
from marin_dagster.execution.status import StatusRecord, StepStatus, write_status
from tests.ducky.conftest import jsonl_gz, write_output
from tests.ducky.test_service import serving


@pytest.fixture
def prefix(tmp_path, corpus_records) -> str:
    prefix = str(tmp_path / "data")
    # raw/corpus was built at aaaaaaaa; the experiment now defines bbbbbbbb, being written.
    write_output(prefix, "raw/corpus", "aaaaaaaa", {"a.jsonl.gz": jsonl_gz(corpus_records)})
    write_status(
        fs.join(prefix, "raw/corpus-bbbbbbbb"), StatusRecord(StepStatus.RUNNING, "bbbbbbbb")
    )
    write_output(prefix, "raw/other", "dddddddd", {"a.jsonl.gz": jsonl_gz(corpus_records[:5])})
    write_output(prefix, "tokenizers/bpe", "eeeeeeee", {"tokenizer.json": b"{}"})
    return prefix


ENTRIES = [
    AssetEntry("raw/corpus", "k", "bbbbbbbb"),
    AssetEntry("raw/other", "k", "dddddddd"),
    AssetEntry("dedup/never", "k", "cccccccc"),
    AssetEntry("tokenizers/bpe", "k", "eeeeeeee"),
]


def test_a_view_of_an_older_config_says_so_in_its_answer(prefix) -> None:
    service = SqlService(prefix, lambda: resolve_views(prefix, ENTRIES))
    result = service.query('SELECT count(*) FROM "raw/corpus"')
    assert result["rows"] == [[40]]
    [note] = result["notes"]
    assert "aaaaaaaa" in note and "older config" in note, note
    assert "bbbbbbbb" in note and "RUNNING" in note, note
    # A query that reads only current views has no note, even when it names the other in a
    # string.
    other = service.query("SELECT count(*) FROM \"raw/other\" WHERE 'raw/corpus' <> ''")
    assert other["rows"] == [[5]] and other["notes"] == []
    both = service.query(
        'SELECT count(*) FROM "raw/other" WHERE id IN (SELECT id FROM "raw/corpus")'
    )
    assert both["notes"] == [note]
    [table] = [t for t in service.tables() if t["name"] == "raw/corpus"]
    assert table["current"] is False and table["note"] == note


def test_an_asset_with_no_output_yet_says_where_it_stands(prefix) -> None:
    views = resolve_views(prefix, ENTRIES)
    assert isinstance(views[2], NoView) and "not materialized yet" in views[2].reason
    service = SqlService(prefix, lambda: resolve_views(prefix, ENTRIES))
    with pytest.raises(QueryFailed) as info:
        service.query('SELECT count(*) FROM "dedup/never"')
    message = str(info.value)
    assert 'there is no view "dedup/never" yet' in message, message
    assert fs.join(prefix, "dedup/never-cccccccc") in message and "materialize it" in message
    with serving(service) as url:
        with urllib.request.urlopen(f"{url}/tables", timeout=10) as response:
            tables = json.loads(response.read())
    assert [n["name"] for n in tables["not_built"]] == ["dedup/never"]
    assert tables["unavailable"] == []


def test_a_built_output_with_no_table_is_not_called_unbuilt(prefix) -> None:
    """A built tokenizer has no table: /tables listed it under `not_built`, and a query of it
    said "no view yet", as if a run would make one."""
    views = resolve_views(prefix, ENTRIES)
    assert isinstance(views[3], NoView) and views[3].built and "no table" in views[3].reason
    service = SqlService(prefix, lambda: resolve_views(prefix, ENTRIES))
    with pytest.raises(QueryFailed) as info:
        service.query('SELECT * FROM "tokenizers/bpe"')
    message = str(info.value)
    assert 'there is no view "tokenizers/bpe":' in message and "yet" not in message, message
    with serving(service) as url:
        with urllib.request.urlopen(f"{url}/tables", timeout=10) as response:
            tables = json.loads(response.read())
    assert [n["name"] for n in tables["not_built"]] == ["dedup/never"]
    assert [n["name"] for n in tables["no_table"]] == ["tokenizers/bpe"]
    assert "no table to query" in tables["no_table"][0]["reason"]


def test_a_stopped_run_is_not_a_failure_to_fix(tmp_path) -> None:
    """A run stopped with Ctrl-C leaves FAILED: its view's reason said "fix what failed",
    where nothing failed and a new run resumes."""
    from marin_dagster.execution.status import RUN_STOPPED

    prefix = str(tmp_path / "data")
    entries = [AssetEntry("raw/stopped", "k", "eeeeeeee"), AssetEntry("raw/broke", "k", "ffffffff")]
    errors = [f"KeyboardInterrupt: {RUN_STOPPED}", "ValueError: bad"]
    for entry, error in zip(entries, errors, strict=True):
        write_status(
            fs.join(prefix, f"{entry.name}-{entry.version}"),
            StatusRecord(StepStatus.FAILED, entry.version, error=error),
        )
    stopped, broke = resolve_views(prefix, entries)
    assert stopped.reason.endswith("its run stopped: materialize it again"), stopped.reason
    assert broke.reason.endswith("fix what failed and materialize it again"), broke.reason


def test_a_killed_rebuild_shows_the_output_it_was_replacing(tmp_path, corpus_records) -> None:
    """A forced rebuild sets the old output aside in `.previous/` until it succeeds; killed, it
    leaves it there. The view said "being written" and showed nothing, where the last good
    output was still on disk."""
    from marin_dagster.execution import previous

    prefix = str(tmp_path / "data")
    path = write_output(prefix, "dedup/big", "aaaaaaaa", {"a.jsonl.gz": jsonl_gz(corpus_records)})
    previous.set_aside(path)  # as a forced rebuild starts ...
    write_status(path, StatusRecord(StepStatus.RUNNING, "aaaaaaaa"))
    fs.write_bytes(fs.join(path, "a.jsonl.gz"), b"half a file")  # ... and is killed mid-way
    service = SqlService(
        prefix, lambda: resolve_views(prefix, [AssetEntry("dedup/big", "k", "aaaaaaaa")])
    )
    result = service.query('SELECT count(*) FROM "dedup/big"')
    assert result["rows"] == [[len(corpus_records)]]
    [note] = result["notes"]
    assert "from before the rebuild" in note and "being written" in note, note
