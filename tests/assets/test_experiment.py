"""Experiment.materialize: what a script run binds."""

from __future__ import annotations

import json

import dagster as dg

from assets import Experiment, dataset
from resources.zephyr import ZephyrResource


def test_materialize_overrides_only_the_resources_given(tmp_path, monkeypatch) -> None:
    # A user choosing another Zephyr backend passes that resource alone; storage and the
    # rest stay the local ones (the prefix from MARIN_PREFIX).
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "data"))
    src = tmp_path / "notes.jsonl"
    src.write_text(json.dumps({"id": "a", "text": "a note"}) + "\n")
    raw = dataset("raw/override-notes", str(src))
    with dg.instance_for_test() as instance:
        result = Experiment("override", leaves=[raw]).materialize(
            resources={"zephyr": ZephyrResource(backend="inline", max_workers=1)},
            instance=instance,
        )
    assert result.success
    meta = result.asset_materializations_for_node(raw.op.name)[0].metadata
    assert meta["zephyr/backend"].value == "inline"
    assert list((tmp_path / "data" / "raw").glob("override-notes-*/.status.json"))
