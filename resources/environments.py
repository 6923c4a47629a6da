"""Resource sets per environment: what `definitions.py` and experiment scripts bind."""

from __future__ import annotations

from typing import Any

from marin_dagster import fs
from resources.ducky import stats_duckdb
from resources.iris import IrisResource
from resources.levanter import LevanterResource
from resources.storage import StorageResource, default_prefix
from resources.zephyr import ZephyrResource


def local_resources(prefix: str | None = None) -> dict[str, Any]:
    """Laptop defaults: storage under ./data (or MARIN_PREFIX), local Zephyr workers."""
    # Resolved now, so step subprocesses started elsewhere write to the same place.
    root = fs.normalize(prefix or default_prefix())
    return {
        "storage": StorageResource(prefix=root),
        "duckdb": stats_duckdb(root),
        "zephyr": ZephyrResource(),
        "iris": IrisResource.from_env(),
        "levanter": LevanterResource(),
    }
