"""ZephyrResource: runs Zephyr pipelines from assets, with progress in the Dagster run log.

    @dg.asset
    def clean(context: dg.AssetExecutionContext, zephyr: ZephyrResource) -> dg.MaterializeResult:
        result = zephyr.execute(ds, context=context)
        return dg.MaterializeResult(metadata=zephyr.metadata(result))

Engines that run several pipelines (dedup, the token-cache build) take the resource's
`context(log=context.log)` instead: each of their executes logs its progress there, and
`metadata(ctx)` adds them up.

Every field here changes how a pipeline runs, never what it writes, so none
of them belongs in an asset's version.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal

import dagster as dg
import pydantic

from marin_dagster.zephyr import (
    Counters,
    Dataset,
    ProgressEvent,
    ZephyrContext,
    ZephyrExecutionResult,
)
from marin_dagster.zephyr.backends import RAY_MISSING, ray_installed
from marin_dagster.zephyr.context import DEFAULT_MEMORY_BUDGET
from marin_dagster.zephyr.dataset import WriteOp

_log = logging.getLogger(__name__)

_WRITER_COUNTERS = ("zephyr/records_written", "zephyr/bytes_written")


def zephyr_metadata(
    result: ZephyrExecutionResult | Counters, prefix: str = "zephyr/", builtin_only: bool = False
) -> dict[str, Any]:
    """Counters as asset metadata (ints as ints, means as floats); `builtin_only` leaves out
    the user counters (an engine's own counters are its metadata's business)."""
    counters = result.counters if isinstance(result, ZephyrExecutionResult) else result
    values = dict(counters.builtin) if builtin_only else counters.as_dict()
    out: dict[str, Any] = {}
    for name, value in values.items():
        out[f"{prefix}{name}"] = int(value) if float(value).is_integer() else float(value)
    return out


class ZephyrResource(dg.ConfigurableResource):
    """How Zephyr pipelines run: worker count, backend, shuffle memory budget."""

    # Bounded: 0 workers was accepted, run with 1, and reported as 0 in the metadata.
    max_workers: int = pydantic.Field(2, ge=1)
    backend: Literal["local", "ray", "inline"] = "local"
    memory_budget: int = pydantic.Field(DEFAULT_MEMORY_BUDGET, ge=1)
    max_shard_failures: int = pydantic.Field(3, ge=1)
    log_every_shards: int = pydantic.Field(0, ge=0)
    """Log a progress line every N finished shards (0: at 0%, 25%, 50%, 75% and 100%)."""

    @pydantic.field_validator("backend")
    @classmethod
    def _ray_is_installed(cls, backend: str) -> str:
        # Said where the resource is built (the code location's load, the run's start), not
        # when the first Ray step of a long run gets that far.
        if backend == "ray" and not ray_installed():
            raise ValueError(RAY_MISSING)
        return backend

    def context(
        self, progress: Any = None, *, log: Any = None, output_path: str | None = None
    ) -> ZephyrContext:
        """A ZephyrContext with this resource's settings; with `log` (e.g. a step's
        `context.log`), stage progress goes there while the pipeline runs. A memory://
        `output_path` runs inline: no worker process can see this process's memory."""
        backend = self.backend
        if output_path is not None and output_path.startswith("memory://"):
            backend = "inline"
        if progress is None and log is not None:
            progress = self._progress_logger(log, backend)
        return ZephyrContext(
            max_workers=self.max_workers,
            backend=backend,
            memory_budget=self.memory_budget,
            max_shard_failures=self.max_shard_failures,
            progress=progress,
            progress_bar=False,
        )

    def _progress_logger(self, log: Any, backend: str) -> Any:
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
                log.info(f"zephyr {event.stage_index + 1}/{event.num_stages} {event} ({backend})")

        return on_progress

    def execute(
        self,
        dataset: Dataset,
        context: dg.AssetExecutionContext | dg.OpExecutionContext | None = None,
        dry_run: bool = False,
        shared: Mapping[str, Any] | None = None,
        output_path: str | None = None,
    ) -> ZephyrExecutionResult:
        """Run `dataset`; with a Dagster context, progress goes to its run log. `shared`:
        objects the pipeline's functions read with `get_shared(name)` (ctx.put).
        `output_path`: where the pipeline's functions write, when no writer of its own says
        so (a memory:// output runs inline)."""
        log = context.log if context is not None else _log
        if output_path is None:
            # The pipeline's own writers say where it writes.
            output_path = next(
                (
                    op.output_pattern
                    for op in dataset.operations
                    if isinstance(op, WriteOp) and isinstance(op.output_pattern, str)
                ),
                None,
            )
        with self.context(log=log, output_path=output_path) as ctx:
            for name, obj in (shared or {}).items():
                ctx.put(name, obj)
            result = ctx.execute(dataset, dry_run=dry_run)
        log.info(f"zephyr done ({result.backend}): {result.counters.as_dict()}")
        return result

    def metadata(
        self, ran: ZephyrExecutionResult | ZephyrContext, writes: bool = True
    ) -> dict[str, Any]:
        """What an asset reports of its Zephyr work: the backend and worker count it ran
        on and the built-in counters (of one result, or of every execute on a context).

        `writes=False` for a pipeline whose tasks write their own files (no Zephyr writer):
        its writer counters are zero, and "records_written: 0" beside the step's own count
        of what it wrote reads as a step that wrote nothing."""
        if isinstance(ran, ZephyrContext):
            counters, backend = ran.total_counters, ran.backend_name
        else:
            counters, backend = ran.counters, ran.backend
        meta = zephyr_metadata(counters, builtin_only=True)
        if not writes:
            meta = {k: v for k, v in meta.items() if k not in _WRITER_COUNTERS}
        return {"zephyr/backend": backend, "zephyr/max_workers": self.max_workers, **meta}
