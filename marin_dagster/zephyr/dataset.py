"""The lazy Dataset: a source plus a list of logical operations (Marin's zephyr.dataset).

Nothing here runs user code or touches files: a Dataset is a description that
`ZephyrContext.execute` plans (plan.py) and runs (runtime.py, backends/).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from marin_dagster.zephyr.resources import TaskResources

DEFAULT_FILE_PATH_COLUMN = "file_path"


@dataclass(frozen=True)
class GlobSource:
    """Files matching `pattern`, expanded (sorted) at plan time."""

    pattern: str
    empty_glob_ok: bool = False


@dataclass(frozen=True)
class ShardInfo:
    """What a `map_shard` function knows about the shard it is processing.

    `shard_idx`/`total_shards` are Marin's names; `index`/`count` are aliases.
    `source_path` is the input file when the shard reads one file (else None).
    """

    shard_idx: int
    total_shards: int
    source_path: str | None = None

    @property
    def index(self) -> int:
        return self.shard_idx

    @property
    def count(self) -> int:
        return self.total_shards

    @property
    def source(self) -> str | None:
        return self.source_path


def _fn_name(fn: Any) -> str:
    while hasattr(fn, "func"):
        fn = fn.func
    return getattr(fn, "__qualname__", getattr(fn, "__name__", type(fn).__name__))


# --- logical operations -------------------------------------------------------------
# Record-wise operations (fused into one stage by the planner).


@dataclass
class MapOp:
    fn: Callable
    resources: TaskResources | None = None

    def __repr__(self) -> str:
        return f"map({_fn_name(self.fn)})"


@dataclass
class MapBatchesOp:
    """fn(pyarrow.RecordBatch) -> RecordBatch | Table; records are batched as needed."""

    fn: Callable
    batch_size: int = 8192
    resources: TaskResources | None = None

    def __repr__(self) -> str:
        return f"map_batches({_fn_name(self.fn)})"


@dataclass
class FilterOp:
    predicate: Callable
    resources: TaskResources | None = None

    def __repr__(self) -> str:
        return f"filter({_fn_name(self.predicate)})"


@dataclass
class FlatMapOp:
    fn: Callable
    resources: TaskResources | None = None

    def __repr__(self) -> str:
        return f"flat_map({_fn_name(self.fn)})"


@dataclass
class MapShardOp:
    """fn(items: Iterator, info: ShardInfo) -> Iterable over the whole shard."""

    fn: Callable
    resources: TaskResources | None = None

    def __repr__(self) -> str:
        return f"map_shard({_fn_name(self.fn)})"


@dataclass
class SelectOp:
    columns: tuple[str, ...]

    def __repr__(self) -> str:
        return f"select{self.columns}"


@dataclass
class TakePerShardOp:
    n: int

    def __repr__(self) -> str:
        return f"take_per_shard({self.n})"


@dataclass
class TakeOp:
    """The first n records of the whole dataset (shard order), as one shard."""

    n: int

    def __repr__(self) -> str:
        return f"take({self.n})"


@dataclass
class WindowOp:
    """folder_fn(state, item) -> (should_continue, new_state); False closes the window
    and starts a new one with the item that closed it."""

    folder_fn: Callable
    initial_state: object

    def __repr__(self) -> str:
        return "window"


@dataclass
class LoadFileOp:
    format: Literal["auto", "jsonl", "parquet", "csv"] = "auto"
    columns: list[str] | None = None
    approx_shard_bytes: int | None = None
    include_file_paths: bool = False
    file_path_column: str = DEFAULT_FILE_PATH_COLUMN
    batch_mode: bool = False

    def __repr__(self) -> str:
        cols = f", columns={self.columns}" if self.columns else ""
        return f"load_{self.format}({cols.lstrip(', ')})"


# Stage barriers and terminal operations.


@dataclass
class WriteOp:
    output_pattern: str | Callable[[int, int], str]
    writer_type: Literal["jsonl", "parquet", "csv", "levanter_cache"]
    schema: object | None = None
    skip_existing: bool = False
    dtype: str | None = None  # levanter_cache: the token id dtype

    def __repr__(self) -> str:
        return f"write_{self.writer_type}({self.output_pattern!r})"


@dataclass
class ReshardOp:
    num_shards: int

    def __repr__(self) -> str:
        return f"reshard({self.num_shards})"


@dataclass
class ShuffleOp:
    seed: int
    num_output_shards: int | None = None

    def __repr__(self) -> str:
        return f"shuffle(seed={self.seed})"


@dataclass
class GroupByOp:
    key_fn: Callable
    reducer_fn: Callable
    num_output_shards: int | None = None
    sort_fn: Callable | None = None
    combiner_fn: Callable | None = None
    resources: TaskResources | None = None

    def __repr__(self) -> str:
        return f"group_by(key={_fn_name(self.key_fn)}, reducer={_fn_name(self.reducer_fn)})"


@dataclass
class ReduceOp:
    local_reducer: Callable
    global_reducer: Callable

    def __repr__(self) -> str:
        return f"reduce({_fn_name(self.local_reducer)}, {_fn_name(self.global_reducer)})"


class JoinType(StrEnum):
    INNER = "inner"
    LEFT = "left"
    RIGHT = "right"
    OUTER = "outer"


@dataclass
class JoinOp:
    """Streaming merge join of co-partitioned, key-sorted datasets (shard i with shard i)."""

    left_key_fn: Callable
    right_key_fn: Callable
    right_dataset: Dataset
    combiner_fn: Callable
    join_type: JoinType

    def __repr__(self) -> str:
        return f"sorted_merge_join(how={self.join_type.value})"


RECORD_WISE_OPS = (
    MapOp,
    MapBatchesOp,
    FilterOp,
    FlatMapOp,
    MapShardOp,
    SelectOp,
    TakePerShardOp,
    WindowOp,
    LoadFileOp,
    JoinOp,
)

LogicalOp = (
    MapOp
    | MapBatchesOp
    | FilterOp
    | FlatMapOp
    | MapShardOp
    | SelectOp
    | TakePerShardOp
    | WindowOp
    | LoadFileOp
    | WriteOp
    | ReshardOp
    | TakeOp
    | ShuffleOp
    | GroupByOp
    | ReduceOp
    | JoinOp
)


def _keep_first(key: Any, items: Iterator[Any]) -> Any:
    return next(items)


def _count_items(items: Iterable[Any]) -> int:
    return sum(1 for _ in items)


@dataclass
class _StreamingDedup:
    """Drop repeats within a shard before the shuffle, so fewer records cross it."""

    key: Callable

    def __call__(self, items: Iterator[Any], _info: ShardInfo) -> Iterator[Any]:
        seen: set = set()
        for item in items:
            k = self.key(item)
            if k not in seen:
                seen.add(k)
                yield item


def _default_join_combiner(left: Any, right: Any) -> Any:
    """Merge two dict records; an unmatched record (None on the other side) comes out as is."""
    if left is None:
        return right
    if right is None:
        return left
    if not isinstance(left, dict) or not isinstance(right, dict):
        raise TypeError(
            "the default sorted_merge_join combiner merges dict records, got "
            f"{type(left).__name__} and {type(right).__name__}; pass combiner=f(left, right)"
        )
    return {**left, **right}


@dataclass
class Dataset:
    """A lazy pipeline: `source` plus `operations`, run by `ZephyrContext.execute`.

    >>> ds = Dataset.from_list([1, 2, 3, 4]).filter(lambda x: x % 2 == 0).map(lambda x: x * 10)
    >>> ZephyrContext(backend="inline").execute(ds).results
    [20, 40]
    """

    source: Any
    operations: list[Any] = field(default_factory=list)

    def _derive(self, *ops: Any) -> Dataset:
        return Dataset(self.source, [*self.operations, *ops])

    # --- constructors ---------------------------------------------------------------

    @staticmethod
    def from_list(items: list[Any]) -> Dataset:
        """One shard holding `items` in order (use `reshard(n)` to spread them)."""
        return Dataset(list(items))

    @staticmethod
    def from_iterable(iterable: Iterable[Any]) -> Dataset:
        return Dataset(list(iterable))

    @staticmethod
    def from_files(pattern: str, empty_glob_ok: bool = False) -> Dataset:
        """One shard per file matching `pattern` (fsspec glob, sorted); items are paths.

        No match raises FileNotFoundError naming the pattern unless `empty_glob_ok`.
        """
        return Dataset(GlobSource(pattern, empty_glob_ok))

    from_glob = from_files

    # --- loaders --------------------------------------------------------------------

    def load_file(
        self,
        columns: list[str] | None = None,
        approx_shard_bytes: int | None = None,
        include_file_paths: bool = False,
        file_path_column: str = DEFAULT_FILE_PATH_COLUMN,
    ) -> Dataset:
        """Read each path as records, the format chosen by its extension."""
        return self._derive(
            LoadFileOp("auto", columns, approx_shard_bytes, include_file_paths, file_path_column)
        )

    def load_jsonl(
        self, include_file_paths: bool = False, file_path_column: str = DEFAULT_FILE_PATH_COLUMN
    ) -> Dataset:
        """Read JSON lines (plain, .gz, .zst, .bz2 or .xz) as dicts."""
        return self._derive(LoadFileOp("jsonl", None, None, include_file_paths, file_path_column))

    def load_parquet(
        self,
        columns: list[str] | None = None,
        approx_shard_bytes: int | None = None,
        include_file_paths: bool = False,
        file_path_column: str = DEFAULT_FILE_PATH_COLUMN,
        *,
        batch_mode: bool = False,
    ) -> Dataset:
        """Read Parquet rows as dicts (or RecordBatches with batch_mode=True).

        approx_shard_bytes splits each file into shards of about that many bytes,
        aligned on row groups (a row group is never split).
        """
        return self._derive(
            LoadFileOp(
                "parquet",
                columns,
                approx_shard_bytes,
                include_file_paths,
                file_path_column,
                batch_mode,
            )
        )

    def load_csv(
        self,
        columns: list[str] | None = None,
        include_file_paths: bool = False,
        file_path_column: str = DEFAULT_FILE_PATH_COLUMN,
    ) -> Dataset:
        """Read CSV (header row, types inferred by pyarrow) as dicts."""
        return self._derive(LoadFileOp("csv", columns, None, include_file_paths, file_path_column))

    # --- record-wise transforms -----------------------------------------------------

    # `resources=` on an operation: what one task of its stage needs (a dict, a string
    # like "cpu:2,memory:4g" or a ResourceConfig; see resources.py). Fused operations
    # share a task, which gets the largest of their requests.

    def map(self, fn: Callable[[Any], Any], resources: Any = None) -> Dataset:
        return self._derive(MapOp(fn, _hint(resources, "map")))

    def map_batches(
        self, fn: Callable[[Any], Any], batch_size: int = 8192, resources: Any = None
    ) -> Dataset:
        """Apply fn to pyarrow RecordBatches (vectorized work); fn returns a batch or table."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        return self._derive(MapBatchesOp(fn, batch_size, _hint(resources, "map_batches")))

    def filter(self, predicate: Callable[[Any], bool], resources: Any = None) -> Dataset:
        return self._derive(FilterOp(predicate, _hint(resources, "filter")))

    def flat_map(self, fn: Callable[[Any], Iterable[Any]], resources: Any = None) -> Dataset:
        return self._derive(FlatMapOp(fn, _hint(resources, "flat_map")))

    def map_shard(
        self, fn: Callable[[Iterator[Any], ShardInfo], Iterable[Any]], resources: Any = None
    ) -> Dataset:
        """fn(items, ShardInfo) sees the whole shard as one iterator (stateful work)."""
        return self._derive(MapShardOp(fn, _hint(resources, "map_shard")))

    def select(self, *columns: str) -> Dataset:
        if not columns:
            raise ValueError("select needs at least one column name")
        return self._derive(SelectOp(tuple(columns)))

    def take_per_shard(self, n: int) -> Dataset:
        if n < 0:
            raise ValueError(f"take_per_shard needs n >= 0, got {n}")
        return self._derive(TakePerShardOp(n))

    def take(self, n: int) -> Dataset:
        """The first n records of the whole dataset (shard 0's first, then shard 1's, ...),
        as one shard. Reading stops once n are found: each shard stops after n records and
        shards are started in order, no more once the shards before them hold n."""
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"take needs an integer n >= 0, got {n!r}")
        return self._derive(TakeOp(n))

    limit = take

    def window(self, size: int) -> Dataset:
        """Consecutive lists of at most `size` items per shard: [1..5].window(2) -> [[1,2],[3,4],[5]]."""
        if size <= 0:
            raise ValueError(f"window size must be positive, got {size}")

        return self._derive(WindowOp(_CountFolder(size), 0))

    def window_by(
        self, folder_fn: Callable[[Any, Any], tuple[bool, Any]], initial_state: object = None
    ) -> Dataset:
        return self._derive(WindowOp(folder_fn, initial_state))

    # --- barriers -------------------------------------------------------------------

    def reshard(self, num_shards: int | None) -> Dataset:
        """Spread the records over `num_shards` shards, keeping their order."""
        if num_shards is None:
            return self
        if num_shards <= 0:
            raise ValueError(f"num_shards must be positive, got {num_shards}")
        return self._derive(ReshardOp(num_shards))

    def shuffle(self, seed: int | None = None, num_output_shards: int | None = None) -> Dataset:
        """A random permutation across shards, deterministic for a given seed."""
        if seed is None:
            seed = random.SystemRandom().randrange(2**63)
        return self._derive(ShuffleOp(seed, num_output_shards))

    def group_by(
        self,
        key: Callable[[Any], Any],
        reducer: Callable[[Any, Iterator[Any]], Any],
        sort_by: Callable[[Any], Any] | None = None,
        num_output_shards: int | None = None,
        combiner: Callable[[Any, Iterator[Any]], Any] | None = None,
        resources: Any = None,
    ) -> Dataset:
        """Group records by key(record); reducer(key, items) returns one result or an iterator.

        Records are hash-partitioned over num_output_shards (default: the current
        shard count); within a shard, groups come out in key order, so two group_bys
        with the same key and shard count can be merge-joined. sort_by orders records
        inside a group. combiner(key, items) pre-aggregates before the shuffle and must
        yield records the reducer accepts. resources= is what one reducer task needs.
        """
        if num_output_shards is not None and num_output_shards <= 0:
            raise ValueError(f"num_output_shards must be positive, got {num_output_shards}")
        return self._derive(
            GroupByOp(
                key, reducer, num_output_shards, sort_by, combiner, _hint(resources, "group_by")
            )
        )

    def deduplicate(
        self, key: Callable[[Any], Any], num_output_shards: int | None = None
    ) -> Dataset:
        """Keep one record per key."""
        return self.map_shard(_StreamingDedup(key)).group_by(
            key=key, reducer=_keep_first, num_output_shards=num_output_shards
        )

    def reduce(
        self,
        local_reducer: Callable[[Iterator[Any]], Any],
        global_reducer: Callable[[Iterator[Any]], Any] | None = None,
    ) -> Dataset:
        """local_reducer per shard, then global_reducer over the shard results: one value."""
        return self._derive(ReduceOp(local_reducer, global_reducer or local_reducer))

    def count(self) -> Dataset:
        return self.reduce(_count_items, sum)

    def sorted_merge_join(
        self,
        right: Dataset,
        left_key: Callable[[Any], Any],
        right_key: Callable[[Any], Any],
        combiner: Callable[[Any, Any], Any] | None = None,
        how: str = "inner",
    ) -> Dataset:
        """Merge-join shard i of self with shard i of right; both sorted by key per shard
        (as group_by with the same key and num_output_shards leaves them).

        how: "inner" (matched pairs), "left" (every left record), "right" (every right
        record) or "outer" (both). Records with equal keys pair up every way.
        combiner(left, right) builds the output; an unmatched record is passed with None on
        the missing side. The default merges dicts ({**left, **right}) and passes an
        unmatched record through unchanged.
        """
        try:
            join_type = JoinType(how)
        except ValueError:
            raise ValueError(
                "sorted_merge_join supports how='inner', 'left', 'right' or 'outer', "
                f"got how={how!r}"
            ) from None
        return self._derive(
            JoinOp(left_key, right_key, right, combiner or _default_join_combiner, join_type)
        )

    # --- writers --------------------------------------------------------------------

    def write_jsonl(
        self, output_pattern: str | Callable[[int, int], str], skip_existing: bool = False
    ) -> Dataset:
        """One JSONL file per shard (.gz/.zst compress); results are the paths."""
        return self._derive(WriteOp(output_pattern, "jsonl", skip_existing=skip_existing))

    def write_parquet(
        self,
        output_pattern: str | Callable[[int, int], str],
        schema: object | None = None,
        skip_existing: bool = False,
    ) -> Dataset:
        """One zstd Parquet file per shard; the schema is inferred (and widened) unless given."""
        return self._derive(
            WriteOp(output_pattern, "parquet", schema=schema, skip_existing=skip_existing)
        )

    def write_csv(
        self, output_pattern: str | Callable[[int, int], str], skip_existing: bool = False
    ) -> Dataset:
        return self._derive(WriteOp(output_pattern, "csv", skip_existing=skip_existing))

    def write_levanter_cache(
        self,
        output_pattern: str | Callable[[int, int], str],
        dtype: Any = "uint16",
        skip_existing: bool = False,
    ) -> Dataset:
        """One token-cache shard folder per shard (marin_dagster/tokenize/cache.py's format).

        Records are documents: a 1-D sequence of token ids, or a dict with `input_ids`
        and optionally `num_bytes` (the source text's UTF-8 size, for bytes per token).
        Each folder gets `input_ids.npy` (`dtype`: "uint16" or "uint32"), `offsets.npy` and,
        last, `.success` with the shard's counts and its task's user counters (so a later
        run that skips the shard can still report what it counted). `skip_existing` skips
        a shard whose `.success` exists. Results are the folders; `finalize_cache` in
        marin_dagster/tokenize/cache.py writes the ledgers that make them a readable cache.
        """
        import numpy as np

        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = repr(dtype)
        if name not in ("uint16", "uint32"):
            raise ValueError(
                f"write_levanter_cache: dtype must be 'uint16' or 'uint32', got {dtype!r}"
            )
        return self._derive(
            WriteOp(output_pattern, "levanter_cache", skip_existing=skip_existing, dtype=name)
        )

    def __repr__(self) -> str:
        src = self.source
        head = (
            f"from_files({src.pattern!r})"
            if isinstance(src, GlobSource)
            else f"from_list(<{len(src)} items>)"
        )
        return " -> ".join([head, *(repr(op) for op in self.operations)])


def _hint(resources: Any, op: str) -> TaskResources | None:
    if resources is None:
        return None
    return TaskResources.parse(resources, f"{op}(resources={resources!r})")


@dataclass
class _CountFolder:
    size: int

    def __call__(self, count: int, _item: Any) -> tuple[bool, int]:
        return count < self.size, count + 1
