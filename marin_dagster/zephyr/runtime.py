"""Running one task: one shard of one stage, inside a worker (or the driver, inline).

A task builds its stream lazily (reader -> fused operations -> sink), so a
record flows through every operation of the stage before the next is read.
Whatever happens, the task returns a TaskResult: errors are captured with
the shard, the input file and the record position.
"""

from __future__ import annotations

import itertools
import os
import pickle
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from marin_dagster import fs
from marin_dagster.zephyr import counters, shared
from marin_dagster.zephyr.chunks import ChunkWriter, read_chunks
from marin_dagster.zephyr.dataset import (
    FilterOp,
    FlatMapOp,
    GroupByOp,
    JoinType,
    LoadFileOp,
    MapBatchesOp,
    MapOp,
    MapShardOp,
    SelectOp,
    ShardInfo,
    TakePerShardOp,
    WindowOp,
)
from marin_dagster.zephyr.keys import order_key
from marin_dagster.zephyr.plan import (
    ChunkInput,
    CollectSink,
    FileInput,
    ItemsInput,
    JoinStep,
    LimitSink,
    MaterializeSink,
    MultiInput,
    ReduceSink,
    ScatterSink,
    ShuffleInput,
    WriteSink,
    wants_batches,
)
from marin_dagster.zephyr.prefetch import prefetch
from marin_dagster.zephyr.readers import Cursor, iter_file_batches, iter_file_records
from marin_dagster.zephyr.shuffle import (
    ScatterSpec,
    chunk_bytes_for,
    merge_runs,
    reduce_groups,
    scatter,
    shuffled_records,
)
from marin_dagster.zephyr.writers import done_path, write_shard

# User errors: retrying cannot fix them, so the run fails at once.
FATAL_ERRORS = (ValueError, TypeError, KeyError)


@dataclass
class Task:
    stage_index: int
    stage_name: str
    shard_idx: int
    total_shards: int
    source_path: str | None
    input: Any
    ops: list[Any]
    sink: Any
    output_path: str | None  # WriteSink: this shard's file
    scratch: str  # a folder for this attempt's scratch files
    memory_budget: int
    shared: dict[str, Any]  # name -> handle (shared.py)
    count_records_in: bool
    attempt: int = 0
    cpu_set: tuple[int, ...] | None = None  # local workers: the cores this task runs on


@dataclass
class TaskResult:
    ok: bool
    value: Any = None
    builtin: dict[str, int] = field(default_factory=dict)
    user: dict[str, float] = field(default_factory=dict)
    error: BaseException | None = None
    error_text: str = ""
    fatal: bool = False
    traceback: str = ""
    pid: int = 0


class _Counted:
    """Counts records (or batch rows) passing through an iterator."""

    def __init__(self, it: Iterator[Any], batches: bool):
        self.it = it
        self.batches = batches
        self.n = 0

    def __iter__(self) -> Iterator[Any]:
        if self.batches:
            for b in self.it:
                self.n += b.num_rows
                yield b
        else:
            for x in self.it:
                self.n += 1
                yield x


def _tracked(items: Iterable[Any], cursor: Cursor) -> Iterator[Any]:
    for i, x in enumerate(items):
        cursor.position = i
        yield x


def _tracked_ahead(items: Iterable[Any], cursor: Cursor) -> Iterator[Any]:
    """As `_tracked`, the position set before each item is made, so that an error making it
    (a reducer's) names it too: dearer per item, for groups, not records."""
    it = iter(items)
    for i in itertools.count():
        cursor.position = i
        try:
            x = next(it)
        except StopIteration:
            return
        yield x


def _records(stream: Iterator[Any], batches: bool) -> Iterator[Any]:
    if not batches:
        return stream
    return itertools.chain.from_iterable(b.to_pylist() for b in stream)


def _with_path(stream: Iterator[Any], path: str, column: str, batches: bool) -> Iterator[Any]:
    if batches:
        for b in stream:
            yield b.append_column(column, pa.array([path] * b.num_rows, pa.string()))
    else:
        for r in stream:
            r[column] = path
            yield r


def _read_file(inp: FileInput, batches: bool, cursor: Cursor) -> Iterator[Any]:
    load = inp.load
    cursor.start(inp.path)
    if batches:
        stream = iter_file_batches(inp.path, load.format, load.columns, inp.row_groups)
    elif load.batch_mode:
        stream = iter_file_batches(inp.path, load.format, load.columns, inp.row_groups)
    else:
        stream = iter_file_records(inp.path, load.format, load.columns, inp.row_groups, cursor)
    if load.include_file_paths:
        stream = _with_path(stream, inp.path, load.file_path_column, batches or load.batch_mode)
    return stream


def _read_chunks(inp: ChunkInput) -> Iterator[Any]:
    skip, limit = inp.skip, inp.limit
    for path, start, stop in inp.slices:
        for chunk in read_chunks(path, start, stop):
            if skip:
                if skip >= len(chunk):
                    skip -= len(chunk)
                    continue
                chunk, skip = chunk[skip:], 0
            if limit is not None:
                if limit <= 0:
                    return
                chunk = chunk[:limit]
                limit -= len(chunk)
            yield from chunk


def _source(
    inp: Any,
    batches: bool,
    cursor: Cursor,
    scratch: str | None = None,
    memory_budget: int = 1 << 30,
) -> tuple[Iterator[Any], bool]:
    """The stage's input stream, and whether it is Arrow batches."""
    if isinstance(inp, FileInput):
        return _read_file(inp, batches, cursor), batches
    if isinstance(inp, ItemsInput):
        return _tracked(inp.items, cursor), False
    if isinstance(inp, MultiInput):
        streams = [_source(i, False, cursor)[0] for i in inp.inputs]
        return itertools.chain.from_iterable(streams), False
    # A reshard's or a shuffle's records are counted too: an error on one named "its start".
    if isinstance(inp, ChunkInput):
        return _tracked(_read_chunks(inp), cursor), False
    if isinstance(inp, ShuffleInput):
        if isinstance(inp.op, GroupByOp):
            entries = merge_runs(
                inp.runs,
                inp.op.sort_fn is not None,
                scratch,
                chunk_bytes=chunk_bytes_for(memory_budget),
            )
            return _tracked_ahead(reduce_groups(entries, inp.op.reducer_fn), cursor), False
        entries = merge_runs(inp.runs, False, scratch, chunk_bytes=chunk_bytes_for(memory_budget))
        return _tracked(shuffled_records(entries), cursor), False
    raise TypeError(f"unknown task input {type(inp).__name__}")


def _window(stream: Iterator[Any], op: WindowOp) -> Iterator[list[Any]]:
    window: list[Any] = []
    state = op.initial_state
    for item in stream:
        keep, new_state = op.folder_fn(state, item)
        if not keep and window:
            yield window
            window = []
            keep, new_state = op.folder_fn(op.initial_state, item)
        window.append(item)
        state = new_state
    if window:
        yield window


def _select(stream: Iterator[Any], columns: tuple[str, ...]) -> Iterator[dict]:
    for rec in stream:
        try:
            yield {c: rec[c] for c in columns}
        except KeyError as e:
            raise KeyError(
                f"select{columns}: the record has no field {e}; its fields are {sorted(rec)}"
            ) from None
        except TypeError:
            raise TypeError(
                f"select{columns} needs dict records, got {type(rec).__name__}"
            ) from None


def _map_batches(stream: Iterator[Any], batches: bool, op: MapBatchesOp) -> Iterator[Any]:
    if not batches:

        def rebatch(records: Iterator[Any]) -> Iterator[pa.RecordBatch]:
            while chunk := list(itertools.islice(records, op.batch_size)):
                yield pa.RecordBatch.from_pylist(chunk)

        stream = rebatch(stream)
    for batch in stream:
        out = op.fn(batch)
        if isinstance(out, pa.Table):
            yield from out.to_batches()
        elif isinstance(out, pa.RecordBatch):
            yield out
        elif isinstance(out, list):
            yield pa.RecordBatch.from_pylist(out)
        else:
            raise TypeError(
                f"map_batches function returned {type(out).__name__}; return a "
                "pyarrow RecordBatch or Table"
            )


def _load_paths(stream: Iterator[Any], op: LoadFileOp, cursor: Cursor) -> Iterator[Any]:
    for path in stream:
        if not isinstance(path, str):
            raise TypeError(f"{op!r} expects file paths, got {type(path).__name__} {path!r:.80}")
        yield from _read_file(FileInput(path, op), op.batch_mode, cursor)


def _key_groups(items: Iterator[Any], key_fn: Any, side: str) -> Iterator[tuple[Any, Any]]:
    """(order key, records) per run of equal keys, checking the keys only go up: a side
    that is not sorted would silently lose matches."""
    prev = None
    for k, group in itertools.groupby(items, key=lambda r: order_key(key_fn(r))):
        if prev is not None and k < prev:
            raise ValueError(
                f"sorted_merge_join: the {side} side is not sorted by its key (a key of "
                f"order {k} came after {prev}); sort both sides by the join key, e.g. with "
                "group_by on that key and the same num_output_shards"
            )
        prev = k
        yield k, group


def _join(left: Iterator[Any], step: JoinStep) -> Iterator[Any]:
    op = step.op
    combine = op.combiner_fn
    keep_left = op.join_type in (JoinType.LEFT, JoinType.OUTER)
    keep_right = op.join_type in (JoinType.RIGHT, JoinType.OUTER)
    right = _read_chunks(step.right_input) if step.right_input is not None else iter(())
    lgroups = _key_groups(left, op.left_key_fn, "left")
    rgroups = _key_groups(right, op.right_key_fn, "right")
    rnext = next(rgroups, None)
    for lk, lgroup in lgroups:
        while rnext is not None and rnext[0] < lk:
            if keep_right:
                for ritem in rnext[1]:
                    yield combine(None, ritem)
            rnext = next(rgroups, None)
        if rnext is not None and rnext[0] == lk:
            ritems = list(rnext[1])
            rnext = next(rgroups, None)
            for litem in lgroup:
                for ritem in ritems:
                    yield combine(litem, ritem)
        elif keep_left:
            for litem in lgroup:
                yield combine(litem, None)
    while rnext is not None:
        if keep_right:
            for ritem in rnext[1]:
                yield combine(None, ritem)
        rnext = next(rgroups, None)


def build_stream(task: Task, cursor: Cursor) -> tuple[Iterator[Any], bool, _Counted | None]:
    """The task's lazy stream, whether it is Arrow batches, and its records_in counter."""
    batches = wants_batches(task.ops, task.sink) and isinstance(task.input, FileInput)
    stream, batches = _source(
        task.input, batches, cursor, os.path.join(task.scratch, "merge"), task.memory_budget
    )
    if batches:
        stream = prefetch(stream)
    counted = None
    if task.count_records_in:
        counted = _Counted(stream, batches)
        stream = iter(counted)
    info = ShardInfo(task.shard_idx, task.total_shards, task.source_path)
    for op in task.ops:
        if isinstance(op, MapBatchesOp):
            stream, batches = _map_batches(stream, batches, op), True
            continue
        stream = _records(stream, batches)
        batches = False
        if isinstance(op, MapOp):
            stream = map(op.fn, stream)
        elif isinstance(op, FilterOp):
            stream = filter(op.predicate, stream)
        elif isinstance(op, FlatMapOp):
            stream = itertools.chain.from_iterable(map(op.fn, stream))
        elif isinstance(op, MapShardOp):
            stream = iter(op.fn(stream, info))
        elif isinstance(op, SelectOp):
            stream = _select(stream, op.columns)
        elif isinstance(op, TakePerShardOp):
            stream = itertools.islice(stream, op.n)
        elif isinstance(op, WindowOp):
            stream = _window(stream, op)
        elif isinstance(op, LoadFileOp):
            stream = _load_paths(stream, op, cursor)
        elif isinstance(op, JoinStep):
            stream = _join(stream, op)
        else:
            raise TypeError(f"unknown operation {op!r}")
    return stream, batches, counted


def _run_sink(task: Task, stream: Iterator[Any], batches: bool, builtin: dict[str, int]) -> Any:
    sink = task.sink
    out = _Counted(stream, batches)
    if isinstance(sink, WriteSink):
        # Batches: the stage's operations run a batch ahead of the writer, in a thread.
        result = write_shard(
            sink.op, task.output_path, prefetch(iter(out)) if batches else iter(out), batches
        )
        builtin["records_written"] = result.records
        builtin["bytes_written"] = result.bytes
        value: Any = result.path
    elif isinstance(sink, CollectSink):
        value = list(_records(iter(out), batches))
    elif isinstance(sink, ScatterSink):
        op = sink.op
        spec = ScatterSpec(
            sink.num_partitions,
            op.key_fn if isinstance(op, GroupByOp) else None,
            getattr(op, "sort_fn", None),
            getattr(op, "combiner_fn", None),
            getattr(op, "seed", 0),
        )
        res = scatter(
            _records(iter(out), batches),
            spec,
            os.path.join(task.scratch, "scatter"),
            task.memory_budget,
            task.shard_idx,
        )
        builtin["spills"] = res.spills
        value = res.runs
    elif isinstance(sink, MaterializeSink):
        value = _materialize(_records(iter(out), batches), task.scratch)
    elif isinstance(sink, ReduceSink):
        value = sink.op.local_reducer(_records(iter(out), batches))
    elif isinstance(sink, LimitSink):
        # islice stops pulling at n: the reader and the operations upstream stop too.
        records = itertools.islice(_records(iter(out), batches), sink.n)
        if sink.collect:
            value = list(records)
        else:
            value = _materialize(records, task.scratch)
    else:
        raise TypeError(f"unknown sink {sink!r}")
    builtin["stage_records_out"] = out.n
    return value


def _materialize(records: Iterator[Any], scratch: str) -> tuple[str, list[int]]:
    os.makedirs(scratch, exist_ok=True)
    path = os.path.join(scratch, "materialized.arrow")
    writer = ChunkWriter(path)
    try:
        for rec in records:
            writer.add(rec)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    return path, writer.chunk_counts


def _picklable(e: BaseException) -> BaseException | None:
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return None


def run_task(task: Task) -> TaskResult:
    """Run one shard; never raises (errors come back in the result)."""
    user, ctoken = counters.start_task()
    stoken = shared.set_registry(task.shared)
    cursor = Cursor(task.source_path, -1)
    builtin: dict[str, int] = {}
    try:
        if (
            isinstance(task.sink, WriteSink)
            and task.sink.op.skip_existing
            and fs.exists(done_path(task.sink.op, task.output_path))
        ):
            return TaskResult(
                True, task.output_path, {"partitions_skipped": 1}, dict(user), pid=os.getpid()
            )
        stream, batches, counted = build_stream(task, cursor)
        value = _run_sink(task, stream, batches, builtin)
        if counted is not None:
            builtin["records_in"] = counted.n
        return TaskResult(True, value, builtin, dict(user), pid=os.getpid())
    except Exception as e:
        where = cursor.describe()
        text = (
            f"{task.stage_name}, shard {task.shard_idx} of {task.total_shards} "
            f"(attempt {task.attempt + 1}) failed at {where}: {type(e).__name__}: {e}"
        )
        return TaskResult(
            False,
            error=_picklable(e),
            error_text=text,
            fatal=isinstance(e, FATAL_ERRORS),
            traceback=traceback.format_exc(),
            pid=os.getpid(),
        )
    finally:
        shared.reset_registry(stoken)
        counters.end_task(ctoken)
