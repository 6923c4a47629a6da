"""ZephyrContext: plans a Dataset and drives its stages on a backend (the driver side).

Stages run in order; each stage's shards run as tasks on the backend, at
most `max_workers` at a time. A task that raises is retried up to
`max_shard_failures` attempts unless the error is a user error (ValueError,
TypeError, KeyError), which fails the run at once. A task whose worker died
is rerun in a new worker. Each attempt writes its scratch files under its
own folder and output files atomically, and only the attempt that succeeds
is used, so retries never duplicate output.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from marin_dagster import fs
from marin_dagster.zephyr import scratch, shared
from marin_dagster.zephyr.backends import Backend, WorkerLost, make_backend
from marin_dagster.zephyr.backends.base import pickle_file_modules_by_value
from marin_dagster.zephyr.counters import Counters
from marin_dagster.zephyr.dataset import Dataset
from marin_dagster.zephyr.plan import (
    ChunkInput,
    CollectSink,
    FileInput,
    ItemsInput,
    JoinStep,
    LimitSink,
    MaterializeSink,
    MultiInput,
    PhysicalPlan,
    ReduceSink,
    ScatterSink,
    ShuffleInput,
    Stage,
    WriteSink,
    compute_plan,
)
from marin_dagster.zephyr.progress import ProgressEvent, StageProgress
from marin_dagster.zephyr.resources import TaskResources, machine_memory
from marin_dagster.zephyr.runtime import Task
from marin_dagster.zephyr.writers import done_path

logger = logging.getLogger(__name__)

DEFAULT_MEMORY_BUDGET = 512 << 20


class ShardFailedError(RuntimeError):
    """A shard failed for good: a user error, or too many failed attempts."""

    def __init__(self, message: str, stage: int, shard: int, attempts: int):
        super().__init__(message)
        self.stage = stage
        self.shard = shard
        self.attempts = attempts


@dataclass
class ZephyrExecutionResult:
    """What execute() returns: the final stage's items (paths for writes) and counters."""

    results: list[Any]
    counters: Counters = field(default_factory=Counters)
    plan: str = ""
    backend: str = ""  # the backend it ran on: "local", "ray" or "inline"

    def __iter__(self) -> Iterator[Any]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)


def _split_materialized(values: list[tuple[str, list[int]]], n: int) -> list[ChunkInput]:
    """Cut the concatenation of materialized shards into n contiguous, balanced inputs."""
    chunks: list[tuple[str, int, int, int]] = []  # path, chunk index, first record, count
    offset = 0
    for path, counts in values:
        for ci, c in enumerate(counts):
            chunks.append((path, ci, offset, c))
            offset += c
    total = offset
    bounds = [round(j * total / n) for j in range(n + 1)]
    out = []
    for j in range(n):
        lo, hi = bounds[j], bounds[j + 1]
        slices: list[tuple[str, int, int]] = []
        skip = 0
        for path, ci, first, c in chunks:
            if first + c <= lo or first >= hi:
                continue
            if not slices:
                skip = lo - first
            if slices and slices[-1][0] == path and slices[-1][2] == ci:
                slices[-1] = (path, slices[-1][1], ci + 1)
            else:
                slices.append((path, ci, ci + 1))
        out.append(ChunkInput(slices, skip, hi - lo))
    return out


class TaskContext:
    """What a ZephyrContext becomes inside a task: a reader of the shared objects."""

    def get_shared(self, name: str) -> Any:
        return shared.get_shared(name)

    def put(self, name: str, obj: Any) -> None:
        raise RuntimeError(
            "ctx.put() was called inside a Zephyr task; put shared objects on the driver, "
            "before execute()"
        )

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "ctx.execute() was called inside a Zephyr task; run pipelines from the driver"
        )


class ZephyrContext:
    """Runs Datasets.

    max_workers: concurrent tasks (default: the CPU count).
    backend: "local" (worker processes, the default), "ray", or "inline" (in this process).
    memory_budget: bytes of records one task buffers in a shuffle before spilling a run.
    stage_resources: per-stage task resources, keyed by stage index or by a substring of
        the stage name; each a dict ({"num_cpus": 2, "memory": "4g"}), a string
        ("cpu:2,memory:4g") or a ResourceConfig. They override the operations' own
        `resources=` hints. Ray passes them to Ray tasks (num_cpus, memory, num_gpus);
        locally, max_workers // cpus such tasks run at once, each pinned to that many
        cores, and a worker over its task's memory is killed and the task retried.
    max_shard_failures: attempts per shard before the run fails (user errors: one).
    progress: called with a ProgressEvent at each stage start and finished shard.

    Shared objects: `ctx.put("model", obj)` on the driver, then `ctx.get_shared("model")`
    inside any function the pipeline runs (or `marin_dagster.zephyr.get_shared`).
    """

    def __init__(
        self,
        max_workers: int | None = None,
        backend: str = "local",
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        stage_resources: dict[int | str, Any] | None = None,
        max_shard_failures: int = 3,
        max_worker_losses: int = 5,
        scratch_dir: str | None = None,
        progress: Callable[[ProgressEvent], Any] | None = None,
        progress_bar: bool | None = None,
        **backend_options: Any,
    ):
        if memory_budget <= 0:
            raise ValueError(f"memory_budget must be positive, got {memory_budget}")
        if max_shard_failures < 1:
            raise ValueError(f"max_shard_failures must be at least 1, got {max_shard_failures}")
        self.max_workers = max_workers or os.cpu_count() or 1
        self.backend_name = backend
        self.memory_budget = memory_budget
        self.stage_resources = dict(stage_resources or {})
        # Parsed now, so a mistyped request fails here, naming its key, not mid-run.
        self._stage_resources = {
            k: TaskResources.parse(v, f"stage_resources[{k!r}]")
            for k, v in self.stage_resources.items()
        }
        self.max_shard_failures = max_shard_failures
        self.max_worker_losses = max_worker_losses
        self.progress = progress
        self.progress_bar = progress_bar
        self._backend_options = backend_options
        self._backend: Backend | None = None
        # Folders of contexts whose process was killed: nothing else would ever remove them.
        removed = scratch.remove_abandoned(scratch_dir)
        if removed:
            logger.info("removed %d abandoned Zephyr scratch folder(s): %s", len(removed), removed)
        self._scratch_root, self._scratch_lock = scratch.claim(scratch_dir)
        self._shared_objects: dict[str, Any] = {}
        self._shared: dict[str, Any] = {}  # name -> the current backend's handle
        # Every execute's counters added up: what an engine that runs several pipelines on
        # one context (dedup's rounds) did in all, for its caller's metadata.
        self.total_counters = Counters()
        self._finalizer = weakref.finalize(
            self, ZephyrContext._cleanup, self._scratch_root, self._scratch_lock, [None]
        )
        if backend not in ("local", "ray", "inline"):
            raise ValueError(
                f"unknown Zephyr backend {backend!r}; choose 'local', 'ray' or 'inline'"
            )

    # --- lifecycle ------------------------------------------------------------------

    @staticmethod
    def _cleanup(root: str, lock: int, backend_box: list[Any]) -> None:
        if backend_box[0] is not None:
            with contextlib.suppress(Exception):
                backend_box[0].shutdown()
        scratch.release(root, lock)

    def _get_backend(self) -> Backend:
        if self._backend is None:
            options = dict(self._backend_options)
            if self.backend_name == "local":
                options.setdefault("tmpdir", os.path.join(self._scratch_root, "tmp"))
            self._backend = make_backend(self.backend_name, self.max_workers, **options)
            self._finalizer.detach()
            self._finalizer = weakref.finalize(
                self,
                ZephyrContext._cleanup,
                self._scratch_root,
                self._scratch_lock,
                [self._backend],
            )
        return self._backend

    def _discard_backend(self) -> None:
        if self._backend is not None:
            with contextlib.suppress(Exception):
                self._backend.shutdown()
            self._backend = None
        self._shared = {}  # handles belong to the backend (Ray refs die with it)

    def shutdown(self) -> None:
        """Stop the workers and remove scratch and shared objects."""
        for handle in self._shared.values():
            shared.forget(handle.key)
        self._discard_backend()
        self._shared_objects = {}
        # Released here, once: the finalizer would close the lock's descriptor a second time,
        # by then perhaps another file's.
        self._finalizer.detach()
        scratch.release(self._scratch_root, self._scratch_lock)
        self._scratch_lock = None

    def __enter__(self) -> ZephyrContext:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # --- shared objects -------------------------------------------------------------

    def put(self, name: str, obj: Any) -> None:
        """Make `obj` available to every task as get_shared(name), shipped once per worker.

        Inside a task, read it with `ctx.get_shared(name)` (a function may capture the
        context) or `marin_dagster.zephyr.get_shared(name)`. The object is handed to the
        backend once, at the next execute(): pickled once to a file for local workers,
        one ray.put for Ray; each worker process loads it once, when a task first asks.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"put() needs a non-empty string name, got {name!r}")
        self._shared_objects[name] = obj
        old = self._shared.pop(name, None)
        if old is not None:
            shared.forget(old.key)

    upload_shared = put

    def get_shared(self, name: str) -> Any:
        """The object put under `name` (in the driver, or inside a task)."""
        if name not in self._shared_objects:
            raise KeyError(
                f"no shared object {name!r}; put it first with ctx.put({name!r}, obj) "
                f"(known: {sorted(self._shared_objects)})"
            )
        return self._shared_objects[name]

    def __reduce__(self) -> tuple[Any, tuple]:
        # A function that captured the context (the guide's `ctx.get_shared("model")` in a
        # map) travels to workers with it: send a small view that reads the task's shared
        # objects, never the driver's workers, sockets and locks (or the objects).
        return (TaskContext, ())

    def _shared_handles(self, backend: Backend) -> dict[str, Any]:
        for name, obj in self._shared_objects.items():
            if name not in self._shared:
                try:
                    handle = backend.share(obj, os.path.join(self._scratch_root, "shared"))
                except Exception as e:
                    raise TypeError(
                        f"ctx.put({name!r}, ...): the object cannot be sent to the "
                        f"{self.backend_name} workers ({type(e).__name__}: {e}); put an object "
                        "that pickles, or build it inside the task"
                    ) from e
                self._shared[name] = handle
        return dict(self._shared)

    # --- execution ------------------------------------------------------------------

    def execute(self, dataset: Dataset, dry_run: bool = False) -> ZephyrExecutionResult:
        """Run `dataset`; with dry_run, only plan it (the plan is logged and returned)."""
        if not isinstance(dataset, Dataset):
            raise TypeError(f"execute() takes a Dataset, got {type(dataset).__name__}")
        plan = compute_plan(dataset)
        description = plan.describe()
        counters = Counters()
        counters.builtin["stages"] = len(plan.stages)
        if dry_run:
            logger.info("Zephyr plan (dry run):\n%s", description)
            return ZephyrExecutionResult([], counters, description, self.backend_name)
        logger.debug("Zephyr plan:\n%s", description)
        pickle_file_modules_by_value()  # before anything is pickled for the workers
        exec_dir = tempfile.mkdtemp(prefix="exec-", dir=self._scratch_root)
        try:
            results = self._run_plan(plan, exec_dir, counters)
        except BaseException:
            # Workers may still run tasks of this run; never let them answer the next one.
            self._discard_backend()
            raise
        finally:
            shutil.rmtree(exec_dir, ignore_errors=True)
            self.total_counters.merge(counters)
        return ZephyrExecutionResult(results, counters, description, self.backend_name)

    def _fully_skipped(self, stage: Stage, cache: dict[int, bool]) -> bool:
        if stage.index not in cache:
            sink = stage.sink
            cache[stage.index] = (
                isinstance(sink, WriteSink)
                and sink.op.skip_existing
                and stage.num_shards > 0
                and all(fs.exists(done_path(sink.op, p)) for p in sink.paths)
            )
        return cache[stage.index]

    def _needed(self, plan: PhysicalPlan) -> tuple[set[int], dict[int, bool]]:
        needed: set[int] = set()
        skipped: dict[int, bool] = {}
        todo = [plan.final.index]
        while todo:
            i = todo.pop()
            if i in needed:
                continue
            stage = plan.stages[i]
            if self._fully_skipped(stage, skipped):
                continue
            needed.add(i)
            if stage.upstream is not None:
                todo.append(stage.upstream)
            todo.extend(op.right_stage for op in stage.ops if isinstance(op, JoinStep))
        return needed, skipped

    def _run_plan(self, plan: PhysicalPlan, exec_dir: str, counters: Counters) -> list[Any]:
        needed, skipped = self._needed(plan)
        outputs: dict[int, list[Any]] = {}
        for stage in plan.stages:
            if stage.index not in needed:
                if skipped.get(stage.index):
                    outputs[stage.index] = list(stage.sink.paths)
                    counters.builtin["partitions_skipped"] += stage.num_shards
                    logger.info(
                        "%s: all %d outputs exist; skipped with its upstream",
                        stage.name,
                        stage.num_shards,
                    )
                continue
            values = self._run_stage(plan, stage, outputs, exec_dir, counters)
            if isinstance(stage.sink, ReduceSink):
                values = [stage.sink.op.global_reducer(iter(values))]
            outputs[stage.index] = values
        final = plan.final
        values = outputs[final.index]
        if isinstance(final.sink, LimitSink):
            # Shards that were never started hold None; the rest, in order, then the first n.
            out = [x for shard in values if shard is not None for x in shard][: final.sink.n]
            counters.builtin["records_out"] = len(out)
            return out
        if isinstance(final.sink, CollectSink):
            return [x for shard in values for x in shard]
        return list(values)

    def _inputs(self, plan: PhysicalPlan, stage: Stage, outputs: dict[int, list[Any]]) -> list[Any]:
        if stage.is_source:
            return list(stage.source_inputs or [])
        assert stage.upstream is not None
        prev = plan.stages[stage.upstream]
        values = outputs[prev.index]
        if isinstance(prev.sink, ScatterSink):
            return [
                ShuffleInput([run for v in values for run in v.get(p, [])], prev.sink.op)
                for p in range(stage.num_shards)
            ]
        if isinstance(prev.sink, LimitSink):
            slices = [
                (path, 0, len(counts)) for v in values if v is not None for path, counts in [v]
            ]
            return [ChunkInput(slices, 0, stage.limit)]
        if isinstance(prev.sink, MaterializeSink):
            if stage.reshard is not None:
                return _split_materialized(values, stage.reshard)
            return [ChunkInput([(path, 0, len(counts))]) for path, counts in values]
        # A write's paths or a reduce's value become items of the next stage.
        if isinstance(prev.sink, ReduceSink):
            return [ItemsInput(list(values))]
        return [ItemsInput([v]) for v in values]

    def _resources(self, stage: Stage) -> TaskResources:
        """The operations' hints, overridden field by field by matching stage_resources."""
        res = stage.resources
        for k, v in self._stage_resources.items():
            if (isinstance(k, int) and k == stage.index) or (
                isinstance(k, str) and k in stage.name
            ):
                res = res.override(v)
        return res

    def _capacity(self, backend: Backend, res: TaskResources) -> int:
        """Tasks of this stage that run at once: the workers' CPUs (and, locally, the
        machine's memory) divided by one task's request."""
        capacity = max(1, backend.capacity // res.cpu_slots)
        if self.backend_name == "local" and res.memory:
            total = machine_memory()
            if total:
                capacity = max(1, min(capacity, total // res.memory))
        return capacity

    def _run_stage(
        self,
        plan: PhysicalPlan,
        stage: Stage,
        outputs: dict[int, list[Any]],
        exec_dir: str,
        counters: Counters,
    ) -> list[Any]:
        inputs = self._inputs(plan, stage, outputs)
        total = len(inputs)
        values: list[Any] = [None] * total
        is_final = stage.index == plan.final.index
        progress = StageProgress(
            stage.index, len(plan.stages), stage.name, total, self.progress, self.progress_bar
        )
        backend = self._get_backend()
        handles = self._shared_handles(backend)
        tasks: dict[int, Task] = {}
        pending: collections.deque[int] = collections.deque()
        write = stage.sink if isinstance(stage.sink, WriteSink) else None
        if write is not None:
            _remove_abandoned_temps(write.paths)
        for i, inp in enumerate(inputs):
            if (
                write is not None
                and write.op.skip_existing
                and fs.exists(done_path(write.op, write.paths[i]))
            ):
                values[i] = write.paths[i]
                counters.builtin["partitions_skipped"] += 1
                progress.shard_done()
                continue
            ops = []
            for op in stage.ops:
                if isinstance(op, JoinStep):
                    right = outputs[op.right_stage][i]
                    op = copy.copy(op)
                    op.right_input = ChunkInput([(right[0], 0, len(right[1]))])
                ops.append(op)
            tasks[i] = Task(
                stage.index,
                stage.name,
                i,
                total,
                stage.source_paths[i] if stage.is_source and stage.source_paths else None,
                inp,
                ops,
                stage.sink,
                write.paths[i] if write else None,
                "",
                self.memory_budget,
                handles,
                stage.is_source,
            )
            pending.append(i)
        resources = self._resources(stage)
        capacity = self._capacity(backend, resources)
        limit = stage.sink if isinstance(stage.sink, LimitSink) else None
        if limit is None:
            pending = _largest_first(pending, inputs)
        counts: dict[int, int] = {}  # take(n): records each finished shard holds
        not_read = 0
        failures = collections.Counter[int]()
        losses = collections.Counter[int]()
        in_flight = 0
        try:
            while pending or in_flight:
                while pending and in_flight < capacity:
                    i = pending.popleft()
                    if limit is not None and _held_before(counts, i) >= limit.n:
                        # take(n): finished shards before this one already hold n records,
                        # so none of its records can be among the first n: never read it.
                        not_read += 1
                        progress.shard_done()
                        continue
                    task = tasks[i]
                    task.attempt = failures[i] + losses[i]
                    task.scratch = os.path.join(
                        exec_dir, f"stage-{stage.index}", f"shard-{i:05d}-attempt-{task.attempt}"
                    )
                    backend.submit((stage.index, i), task, resources)
                    in_flight += 1
                done = backend.poll(0.5)
                # All at once: an error raised at the first of several answers left the
                # others counted as running, and the wait below spun on them for ever.
                in_flight -= len(done)
                for (_s, i), outcome in done:
                    if isinstance(outcome, WorkerLost) and not outcome.over_memory:
                        losses[i] += 1
                        if losses[i] > self.max_worker_losses:
                            raise ShardFailedError(
                                f"{stage.name}, shard {i}: its worker died {losses[i]} times "
                                f"(last: {outcome.reason}); {outcome.advice()}",
                                stage.index,
                                i,
                                failures[i] + losses[i],
                            )
                        progress.retried()
                        pending.append(i)
                        continue
                    if isinstance(outcome, WorkerLost):
                        # Killed over its memory limit: a failed attempt, retried on a new worker.
                        failures[i] += 1
                        if failures[i] >= self.max_shard_failures:
                            raise ShardFailedError(
                                f"{outcome.reason} ({failures[i]} attempts, max_shard_failures="
                                f"{self.max_shard_failures}). Give the stage more memory "
                                f"(now {resources}): stage_resources={{{stage.index}: "
                                "'memory:...'}, or resources= on the operation; or make one "
                                "task hold less (more shards, a smaller memory_budget)",
                                stage.index,
                                i,
                                failures[i],
                            )
                        progress.retried()
                        pending.append(i)
                        continue
                    if outcome.ok:
                        values[i] = outcome.value
                        if limit is not None:
                            v = outcome.value
                            counts[i] = len(v) if limit.collect else sum(v[1])
                        builtin = dict(outcome.builtin)
                        out_n = builtin.pop("stage_records_out", 0)
                        if is_final:
                            builtin["records_out"] = out_n
                        counters.add_task(builtin, outcome.user)
                        counters.builtin["shards"] += 1
                        progress.shard_done()
                        continue
                    failures[i] += 1
                    if outcome.fatal or failures[i] >= self.max_shard_failures:
                        why = (
                            "a user error; fix the function or the data"
                            if outcome.fatal
                            else f"failed {failures[i]} times (max_shard_failures="
                            f"{self.max_shard_failures})"
                        )
                        raise ShardFailedError(
                            f"{outcome.error_text}\n({why})\n{outcome.traceback}",
                            stage.index,
                            i,
                            failures[i],
                        ) from outcome.error
                    logger.warning(
                        "%s; retrying (%d of %d attempts used)",
                        outcome.error_text,
                        failures[i],
                        self.max_shard_failures,
                    )
                    progress.retried()
                    pending.append(i)
        except ShardFailedError:
            # Let the other shards' tasks end before the error is raised: one still running
            # would write its output after the run was reported failed (and its output put
            # back as it was), and a rerun would find a shard the failed run never reported.
            while in_flight:
                in_flight -= len(backend.poll(0.5))
            raise
        finally:
            progress.close()
        if not_read:
            logger.info(
                "%s: %d of %d shard(s) were not needed, not read", stage.name, not_read, total
            )
        if write is not None and losses:
            _remove_abandoned_temps([write.paths[i] for i in losses])
        return values


def _input_size(inp: Any) -> int | None:
    """How much an input holds, in the unit its kind knows: bytes for files, chunks
    (up to CHUNK_RECORDS records each) for a shuffle partition's runs."""
    if isinstance(inp, FileInput):
        return inp.size
    if isinstance(inp, MultiInput):
        sizes = [_input_size(i) for i in inp.inputs]
        return None if None in sizes else sum(sizes)  # type: ignore[arg-type]
    if isinstance(inp, ShuffleInput):
        return sum(stop - start for _path, start, stop in inp.runs)
    return None


def _largest_first(pending: collections.deque[int], inputs: list[Any]) -> collections.deque[int]:
    """The stage's shards, the largest first (ties in shard order): a large file or a
    hot key's partition started last would leave the other workers idle while it runs
    alone. Kept in shard order when any size is unknown, and for take(n), which reads
    in order."""
    sizes = {i: _input_size(inputs[i]) for i in pending}
    if not sizes or None in sizes.values():
        return pending
    return collections.deque(sorted(pending, key=lambda i: -sizes[i]))  # type: ignore[operator]


def _held_before(counts: dict[int, int], shard: int) -> int:
    """Records the finished shards before `shard` hold (a lower bound: the unfinished hold
    zero or more)."""
    return sum(c for i, c in counts.items() if i < shard)


def _remove_abandoned_temps(paths: list[str]) -> None:
    """Remove the temporary files killed writers left beside these targets: a lost worker's
    (for its task's target), or a killed run's (for the whole stage, when its rerun starts).

    A driver killed mid-write (kill -9; Iris kills the step's whole process group) leaves
    `<target>.tmp-<hex>` files, a shard's worth each, that no manifest or reader counts and
    nothing else removes; its rerun, writing the same targets, clears them first. Only exact
    temporary names of this stage's targets, listed once per folder: a folder holds
    thousands of shards, and other files in it are not this stage's to judge.
    """
    by_folder: dict[str, set[str]] = collections.defaultdict(set)
    for path in paths:
        local = fs.local_path(path)
        if local is not None:  # object stores never show a partial upload
            folder, name = os.path.split(local)
            by_folder[folder].add(name)
    for folder, names in by_folder.items():
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        for entry in entries:
            if fs.atomic_temp_target(entry) in names:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(folder, entry))
