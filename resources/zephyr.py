"""ZephyrResource: runs Zephyr pipelines from assets, with progress in the Dagster run log.

    @dg.asset
    def clean(zephyr: ZephyrResource) -> dg.MaterializeResult:
        result = zephyr.execute(ds, context=context)
        return dg.MaterializeResult(metadata=zephyr_metadata(result))

Every field here changes how a pipeline runs, never what it writes, so none
of them belongs in an asset's version.
"""

from __future__ import annotations

import logging
from typing import Any

import dagster as dg

from marin_dagster.zephyr import Dataset, ProgressEvent, ZephyrContext, ZephyrExecutionResult
from marin_dagster.zephyr.context import DEFAULT_MEMORY_BUDGET

_log = logging.getLogger(__name__)


def zephyr_metadata(result: ZephyrExecutionResult, prefix: str = "zephyr/") -> dict[str, Any]:
    """Counters as asset metadata (ints as ints, means as floats)."""
    out: dict[str, Any] = {}
    for name, value in result.counters.as_dict().items():
        out[f"{prefix}{name}"] = int(value) if float(value).is_integer() else float(value)
    return out


class ZephyrResource(dg.ConfigurableResource):
    """How Zephyr pipelines run: worker count, backend, shuffle memory budget."""

    max_workers: int = 2
    backend: str = "local"
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    max_shard_failures: int = 3
    log_every_shards: int = 0
    """Log a progress line every N finished shards (0: at 0%, 25%, 50%, 75% and 100%)."""

    def context(self, progress: Any = None, *, log: Any = None) -> ZephyrContext:
        """A ZephyrContext with this resource's settings; with `log` (e.g. a step's
        `context.log`), stage progress goes there while the pipeline runs."""
        if progress is None and log is not None:
            progress = self._progress_logger(log)
        return ZephyrContext(
            max_workers=self.max_workers,
            backend=self.backend,
            memory_budget=self.memory_budget,
            max_shard_failures=self.max_shard_failures,
            progress=progress,
            progress_bar=False,
        )

    def _progress_logger(self, log: Any) -> Any:
        every = self.log_every_shards
        last: dict[int, int] = {}

        def on_progress(event: ProgressEvent) -> None:
            total = max(event.total, 1)
            if every:
                due = event.completed % every == 0 or event.done
            else:
                due = event.completed * 4 // total != last.get(event.stage_index, -1)
            if due:
                last[event.stage_index] = event.completed * 4 // total
                log.info(f"zephyr {event.stage_index + 1}/{event.num_stages} {event}")

        return on_progress

    def execute(
        self,
        dataset: Dataset,
        context: dg.AssetExecutionContext | dg.OpExecutionContext | None = None,
        dry_run: bool = False,
    ) -> ZephyrExecutionResult:
        """Run `dataset`; with a Dagster context, progress goes to its run log."""
        log = context.log if context is not None else _log
        with self.context(log=log) as ctx:
            result = ctx.execute(dataset, dry_run=dry_run)
        log.info(f"zephyr done: {result.counters.as_dict()}")
        return result
