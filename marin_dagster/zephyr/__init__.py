"""Zephyr: Marin's dataset-processing engine (lazy Datasets, fused stages, shuffles).

    from marin_dagster.zephyr import Dataset, ZephyrContext

    ds = (Dataset.from_files("raw/*.jsonl.gz").load_jsonl()
          .filter(lambda r: len(r["text"]) > 0)
          .write_parquet("clean/part-{shard:05d}-of-{total:05d}.parquet"))
    result = ZephyrContext(max_workers=4).execute(ds)
    result.results   # the written paths
    result.counters  # records_in, records_out, records_written, bytes_written, ...

No Dagster here: the engine runs in Ray workers and pods; resources/zephyr.py
exposes it to assets.
"""

from marin_dagster.zephyr import counters
from marin_dagster.zephyr.context import ShardFailedError, ZephyrContext, ZephyrExecutionResult
from marin_dagster.zephyr.counters import Counters, CounterStats
from marin_dagster.zephyr.dataset import Dataset, JoinType, ShardInfo
from marin_dagster.zephyr.keys import stable_hash
from marin_dagster.zephyr.plan import PhysicalPlan, compute_plan
from marin_dagster.zephyr.progress import ProgressEvent
from marin_dagster.zephyr.readers import InputError
from marin_dagster.zephyr.resources import TaskResources
from marin_dagster.zephyr.shared import get_shared
from marin_dagster.zephyr.writers import SchemaConflictError, format_shard_path

__all__ = [
    "CounterStats",
    "Counters",
    "Dataset",
    "InputError",
    "JoinType",
    "PhysicalPlan",
    "ProgressEvent",
    "SchemaConflictError",
    "ShardFailedError",
    "ShardInfo",
    "TaskResources",
    "ZephyrContext",
    "ZephyrExecutionResult",
    "compute_plan",
    "counters",
    "format_shard_path",
    "get_shared",
    "stable_hash",
]
