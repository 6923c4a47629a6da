"""A code location for the kill -9 tests: `dagster asset materialize -m tests.iris.orphan_location`.

`orphan/held` is a versioned step (status file, lease) running a Zephyr pipeline on local
worker processes whose tasks wait for a release file, so a test can kill the run while the
step and its Zephyr workers are busy, then release a later run. Paths come from the
environment the CLI is started with: IRIS_TEST_DIR (records, release file), MARIN_PREFIX
(outputs). `orphan/quick` is a step that finishes at once, to start a run cheaply.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

import dagster as dg

from marin_dagster.execution.asset import StepContext, versioned_asset
from marin_dagster.execution.version import StepConfig
from marin_dagster.iris.executor import iris_executor
from marin_dagster.zephyr import Dataset, ZephyrContext
from resources.storage import StorageResource

RELEASE = "release"


class HeldConfig(StepConfig):
    shards: int = 2


def _record(name: str, **extra: Any) -> None:
    with open(os.path.join(os.environ["IRIS_TEST_DIR"], f"{name}.jsonl"), "a") as f:
        f.write(
            json.dumps({"t": time.time(), "pid": os.getpid(), "pgid": os.getpgrp(), **extra}) + "\n"
        )


def _hold(item: int) -> dict[str, int]:
    _record("zephyr_task", item=item)
    release = os.path.join(os.environ["IRIS_TEST_DIR"], RELEASE)
    # Bounded, so that a worker the fix failed to kill still ends on its own.
    deadline = time.monotonic() + 90
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.1)
    return {"item": item, "worker": os.getpid()}


def _run_held(
    config: HeldConfig, inputs: Mapping[str, str], output_path: str, step: StepContext
) -> dict[str, Any]:
    _record("step")
    ds = (
        Dataset.from_list(list(range(config.shards)))
        .reshard(config.shards)
        .map(_hold)
        .write_jsonl(os.path.join(output_path, "part-{shard:05d}.jsonl"))
    )
    result = ZephyrContext(max_workers=config.shards, backend="local", progress_bar=False).execute(
        ds
    )
    return {"files": len(result.results)}


def _run_quick(
    config: StepConfig, inputs: Mapping[str, str], output_path: str, step: StepContext
) -> dict[str, Any]:
    return {}


held = versioned_asset(name="orphan/held", kind="orphan_held", config=HeldConfig(), run=_run_held)
quick = versioned_asset(
    name="orphan/quick", kind="orphan_quick", config=StepConfig(), run=_run_quick
)

defs = dg.Definitions(
    assets=[held, quick],
    resources={"storage": StorageResource(prefix=os.environ.get("MARIN_PREFIX", "./data"))},
    executor=iris_executor.configured({"sleep_seconds": 0.2, "max_concurrent": 2}, name="iris"),
)
