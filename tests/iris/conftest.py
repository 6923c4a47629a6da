"""A persistent Dagster instance (temp DAGSTER_HOME with dagster.yaml) and a scratch dir per test."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import dagster as dg
import pytest


@pytest.fixture
def iris_dir(tmp_path, monkeypatch) -> str:
    d = tmp_path / "records"
    d.mkdir()
    # Step subprocesses inherit it: that's where the test assets write what they saw.
    monkeypatch.setenv("IRIS_TEST_DIR", str(d))
    return str(d)


@pytest.fixture
def instance(tmp_path, monkeypatch) -> Iterator[dg.DagsterInstance]:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.from_config(str(home)) as inst:
        yield inst


def read_records(directory: str, name: str) -> list[dict]:
    path = os.path.join(directory, f"{name}.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def execution_config(tmp_path, **overrides) -> dict:
    config = {
        "launcher": "local",
        "inventory": {"gpus": ["0"]},
        "lease_dir": str(tmp_path / "leases"),
        "max_concurrent": 2,
        "termination_grace_seconds": 3.0,
        "sleep_seconds": 0.2,
    }
    config.update(overrides)
    return {"execution": {"config": config}}
