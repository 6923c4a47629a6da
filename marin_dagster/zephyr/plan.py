"""Planning: a Dataset becomes a list of stages (Marin's zephyr.plan).

Consecutive record-wise operations fuse into one stage, run as one task per
shard with no intermediate files. Barriers end a stage: group_by/deduplicate
and shuffle (a hash-partitioned scatter), reshard (materialize, then split),
reduce (a value per shard, combined on the driver) and a write (the stage's
output is the written paths). A join's right side is planned first and
materialized, then merged into the left stage shard by shard.

Shard counts are known at plan time (files, reshard(n), num_output_shards),
so output paths, the {shard} check and skip_existing are all decided before
any task runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from marin_dagster import fs
from marin_dagster.zephyr.dataset import (
    RECORD_WISE_OPS,
    Dataset,
    GlobSource,
    GroupByOp,
    JoinOp,
    LoadFileOp,
    MapBatchesOp,
    ReduceOp,
    ReshardOp,
    ShuffleOp,
    TakeOp,
    WriteOp,
)
from marin_dagster.zephyr.readers import detect_format, parquet_row_group_splits
from marin_dagster.zephyr.resources import TaskResources
from marin_dagster.zephyr.writers import format_shard_path

# --- shard inputs (what one task reads) ----------------------------------------------


@dataclass
class ItemsInput:
    items: list[Any]


@dataclass
class FileInput:
    path: str
    load: LoadFileOp
    row_groups: list[int] | None = None
    size: int | None = None  # bytes it covers, from the listing: larger inputs start first


@dataclass
class MultiInput:
    """Several source inputs read one after another (reshard of a file list)."""

    inputs: list[Any]


@dataclass
class ChunkInput:
    """Records materialized by an earlier stage: chunk ranges, then a record window."""

    slices: list[tuple[str, int, int]]
    skip: int = 0
    limit: int | None = None


@dataclass
class ShuffleInput:
    runs: list[tuple[str, int, int]]
    op: GroupByOp | ShuffleOp


# --- sinks (what a stage does with its stream) --------------------------------------


@dataclass
class CollectSink:
    pass


@dataclass
class WriteSink:
    op: WriteOp
    paths: list[str] = field(default_factory=list)


@dataclass
class ScatterSink:
    op: GroupByOp | ShuffleOp
    num_partitions: int


@dataclass
class MaterializeSink:
    pass


@dataclass
class ReduceSink:
    op: ReduceOp


@dataclass
class LimitSink:
    """take(n): at most n records per shard, materialized (or returned, when final); the
    driver starts shards in order and no more once the finished ones before hold n."""

    n: int
    collect: bool = False


@dataclass
class JoinStep:
    """A JoinOp inside a stage; `right_stage` materializes the right side."""

    op: JoinOp
    right_stage: int
    right_input: ChunkInput | None = None

    def __repr__(self) -> str:
        return f"{self.op!r} with stage {self.right_stage}"


@dataclass
class Stage:
    index: int
    ops: list[Any]
    sink: Any
    num_shards: int
    source_inputs: list[Any] | None = None  # source stages: one input per shard
    upstream: int | None = None  # barrier stages: the stage whose outputs feed this one
    reshard: int | None = None  # after a MaterializeSink upstream: split into this many shards
    source_paths: list[str | None] = field(default_factory=list)
    is_source: bool = False
    source_desc: str = "source"
    limit: int | None = None  # after a LimitSink upstream: read at most this many records
    resources: TaskResources = field(default_factory=TaskResources)  # operations' hints

    @property
    def name(self) -> str:
        parts = [
            type(op).__name__.replace("Op", "").lower() if not isinstance(op, JoinStep) else "join"
            for op in self.ops
        ]
        sink = {
            CollectSink: "collect",
            WriteSink: "write",
            ScatterSink: "scatter",
            MaterializeSink: "materialize",
            ReduceSink: "reduce",
            LimitSink: "take",
        }[type(self.sink)]
        if isinstance(self.sink, WriteSink):
            sink = f"write_{self.sink.op.writer_type}"
        head = self.source_desc if self.is_source else f"from stage {self.upstream}"
        return (
            f"stage {self.index} [{head}: {' -> '.join([*map(repr, self.ops), sink])}]"
            if parts
            else f"stage {self.index} [{head}: {sink}]"
        )


@dataclass
class PhysicalPlan:
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def describe(self) -> str:
        lines = [f"{len(self.stages)} stage(s):"]
        for s in self.stages:
            lines.append(f"  {s.name}, {s.num_shards} shard(s)")
        return "\n".join(lines)


def _resolve_glob(source: GlobSource) -> dict[str, int | None]:
    """The files `source.pattern` matches, in order, with their sizes in bytes."""
    filesystem, fs_path = fs.url_to_fs(source.pattern)
    protocol = source.pattern.split("://", 1)[0] if "://" in source.pattern else None
    # detail=True: types and sizes come with the one listing call, no stat per file.
    matches = filesystem.glob(fs_path, detail=True)
    files = {
        f"{protocol}://{p}" if protocol and protocol != "file" else p: info.get("size")
        for p, info in matches.items()
        if info.get("type") != "directory" and not fs.is_temp_name(p)
    }
    if not files and not source.empty_glob_ok:
        raise FileNotFoundError(
            f"no files match {source.pattern!r}; check the pattern, or pass "
            "empty_glob_ok=True if an empty input is expected"
        )
    return dict(sorted(files.items()))


def _split_items(items: list[Any], n: int) -> list[list[Any]]:
    """n contiguous, balanced slices (order preserved)."""
    q, r = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        size = q + (1 if i < r else 0)
        out.append(items[start : start + size])
        start += size
    return out


class _Planner:
    def __init__(self) -> None:
        self.stages: list[Stage] = []

    def _add(self, stage: Stage) -> Stage:
        stage.index = len(self.stages)
        self.stages.append(stage)
        return stage

    def plan(self, ds: Dataset, final_sink: Any) -> Stage:
        ops = list(ds.operations)
        inputs: list[Any]
        paths: list[str | None]
        load_fused = False
        if isinstance(ds.source, GlobSource):
            files = _resolve_glob(ds.source)
            if ops and isinstance(ops[0], LoadFileOp):
                load = ops.pop(0)
                load_fused = True
                inputs, paths = [], []
                for f, size in files.items():
                    fmt = detect_format(f) if load.format == "auto" else load.format
                    if fmt == "parquet" and load.approx_shard_bytes:
                        splits = parquet_row_group_splits(f, load.approx_shard_bytes)
                        groups_in_file = sum(map(len, splits)) or 1
                        for groups in splits:
                            part = None if size is None else size * len(groups) // groups_in_file
                            inputs.append(FileInput(f, load, groups, part))
                            paths.append(f)
                    else:
                        inputs.append(FileInput(f, load, size=size))
                        paths.append(f)
            else:
                inputs, paths = [ItemsInput([f]) for f in files], list(files)
        else:
            items = list(ds.source)
            inputs = [ItemsInput(items)] if items else []
            paths = [None] * len(inputs)
        if ops and isinstance(ops[0], ReshardOp) and not load_fused:
            # Directly on the source: split the items (or the file list) without a barrier.
            n = ops.pop(0).num_shards
            if all(isinstance(i, ItemsInput) for i in inputs):
                flat = [x for i in inputs for x in i.items]
                inputs = [ItemsInput(part) for part in _split_items(flat, n)]
                paths = [None] * n
            else:
                # Files: distribute whole inputs; a shard may read several of them.
                groups = _split_items(inputs, n)
                inputs = [MultiInput(g) for g in groups]
                paths = [None] * n

        if isinstance(ds.source, GlobSource):
            desc = f"{ds.source.pattern}" + (f" {load!r}" if load_fused else "")
        else:
            desc = f"{len(ds.source)} items"
        stage = Stage(
            index=-1,
            ops=[],
            sink=None,
            num_shards=len(inputs),
            source_inputs=inputs,
            source_paths=paths,
            is_source=True,
            source_desc=desc,
        )
        for op in ops:
            hint = getattr(op, "resources", None)
            if hint is not None and isinstance(op, RECORD_WISE_OPS):
                stage.resources = stage.resources.union(hint)
            if isinstance(op, RECORD_WISE_OPS):
                if isinstance(op, JoinOp):
                    right = self.plan(op.right_dataset, MaterializeSink())
                    if right.num_shards != stage.num_shards:
                        raise ValueError(
                            f"sorted_merge_join needs both sides to have the same number of shards: "
                            f"left has {stage.num_shards}, right has {right.num_shards}; give both "
                            "group_by calls the same num_output_shards (or reshard one side)"
                        )
                    stage.ops.append(JoinStep(op, right.index))
                else:
                    stage.ops.append(op)
                continue
            if isinstance(op, WriteOp):
                stage.sink = WriteSink(op, self._output_paths(op, stage))
                prev = self._add(stage)
                stage = Stage(-1, [], None, prev.num_shards, upstream=prev.index)
            elif isinstance(op, GroupByOp | ShuffleOp):
                n = op.num_output_shards or max(stage.num_shards, 1)
                if stage.num_shards == 0:
                    n = op.num_output_shards or 0
                stage.sink = ScatterSink(op, n)
                prev = self._add(stage)
                stage = Stage(-1, [], None, n, upstream=prev.index)
                if isinstance(op, GroupByOp) and op.resources is not None:
                    stage.resources = op.resources  # the reducer runs in the next stage
            elif isinstance(op, TakeOp):
                stage.sink = LimitSink(op.n)
                prev = self._add(stage)
                stage = Stage(-1, [], None, 1, upstream=prev.index, limit=op.n)
            elif isinstance(op, ReshardOp):
                stage.sink = MaterializeSink()
                prev = self._add(stage)
                stage = Stage(
                    -1, [], None, op.num_shards, upstream=prev.index, reshard=op.num_shards
                )
            elif isinstance(op, ReduceOp):
                stage.sink = ReduceSink(op)
                prev = self._add(stage)
                stage = Stage(-1, [], None, 1, upstream=prev.index)
            else:
                raise TypeError(f"unknown operation {op!r}")
        if stage.upstream is not None and not stage.ops and isinstance(final_sink, CollectSink):
            prev = self.stages[stage.upstream]
            if isinstance(prev.sink, WriteSink | ReduceSink):
                # Nothing left to do: the driver already holds the paths or the value.
                return prev
            if isinstance(prev.sink, LimitSink):
                prev.sink.collect = True  # the tasks return their records; no extra stage
                return prev
        stage.sink = final_sink
        return self._add(stage)

    @staticmethod
    def _output_paths(op: WriteOp, stage: Stage) -> list[str]:
        out = []
        for i in range(stage.num_shards):
            src = stage.source_paths[i] if stage.is_source and i < len(stage.source_paths) else None
            basename = None
            if src:
                base = src.rsplit("/", 1)[-1]
                for ext in (".gz", ".zst", ".zstd", ".jsonl", ".json", ".parquet", ".csv", ".txt"):
                    if base.endswith(ext):
                        base = base[: -len(ext)]
                basename = base
            out.append(format_shard_path(op.output_pattern, i, stage.num_shards, basename))
        seen: dict[str, int] = {}
        for i, path in enumerate(out):
            if path in seen:
                raise ValueError(
                    f"output pattern {op.output_pattern!r} gives shards {seen[path]} and "
                    f"{i} the same file {path!r}; add {{shard}} to the pattern"
                )
            seen[path] = i
        return out


def compute_plan(ds: Dataset) -> PhysicalPlan:
    """Resolve sources and cut `ds` into stages. Raises on plan errors before any work."""
    planner = _Planner()
    planner.plan(ds, CollectSink())
    return PhysicalPlan(planner.stages)


def wants_batches(ops: list[Any], sink: Any) -> bool:
    """Whether a stage's reader should produce Arrow batches rather than records."""
    if ops:
        return isinstance(ops[0], MapBatchesOp)
    return isinstance(sink, WriteSink) and sink.op.writer_type == "parquet"
