"""Storage that does not answer: the catalog says so for every view after asking once.

Each view used to ask again, and each question cost gcsfs's whole retry schedule (about 35 s):
`marin sql` took 3 minutes to say the storage was down, and the HTTP service's first query
got no answer within 2 minutes. This test waits out that schedule once (about 35 s).
"""

from __future__ import annotations

import logging

import gcsfs

from marin_dagster.ducky import AssetEntry, Unavailable, resolve_views
from tests.conftest import free_port


def test_storage_that_does_not_answer_is_asked_once(monkeypatch, caplog):
    # A port nothing listens on: the connection is refused at once, as with a stopped emulator.
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{free_port()}")
    gcsfs.GCSFileSystem.clear_instance_cache()  # one made for the tests' live emulator
    entries = [AssetEntry(f"raw/part{i}", "dataset", "abcd1234") for i in range(3)]
    try:
        with caplog.at_level(logging.WARNING, logger="marin_dagster.ducky.catalog"):
            views = resolve_views("gs://down-bucket/marin", entries)
    finally:
        gcsfs.GCSFileSystem.clear_instance_cache()
    assert [type(v) for v in views] == [Unavailable] * 3
    assert all(v.reason.startswith("cannot reach the storage (") for v in views)
    assert len({v.reason for v in views}) == 1
    asked = [r for r in caplog.records if r.getMessage().startswith("ducky: no view ")]
    assert [r.getMessage().split("'")[1] for r in asked] == ["raw/part0"]
    assert "not asked for the other 2 view(s): cannot reach the storage" in caplog.text
