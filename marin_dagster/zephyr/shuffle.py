"""Shuffles (group_by, shuffle, deduplicate): hash-partition, spill sorted runs, k-way merge.

Map side: every record goes to partition `keys.partition_of(key, n)` (CRC-32
of the key's canonical bytes) and into that partition's buffer. When the
buffered records reach the memory budget (or the input ends) each
partition's buffer is sorted by key (combined, if a combiner is given) and
appended to one spill file as a run: a range of chunks in a chunk file
(chunks.py). Reduce side: partition p merges all its runs from all map
tasks with heapq.merge, so it holds one chunk per run, and hands each key's
records to the reducer as a lazy iterator.
"""

from __future__ import annotations

import heapq
import itertools
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from marin_dagster.zephyr.chunks import CHUNK_BYTES, ChunkWriter, approx_size, read_records
from marin_dagster.zephyr.keys import order_key, partition_of

Run = tuple[str, int, int]  # chunk file, first chunk, end chunk


@dataclass
class ScatterSpec:
    num_partitions: int
    key_fn: Callable[[Any], Any] | None = None  # None: a random shuffle
    sort_fn: Callable[[Any], Any] | None = None
    combiner_fn: Callable[[Any, Iterator[Any]], Any] | None = None
    seed: int = 0


@dataclass
class ScatterResult:
    runs: dict[int, list[Run]] = field(default_factory=dict)
    spills: int = 0
    records: int = 0


def results_of(out: Any) -> Iterator[Any]:
    """A reducer or combiner returns one result, or an iterator of results."""
    if isinstance(out, Iterator):
        yield from out
    else:
        yield out


def _entry_order(has_sort: bool) -> Callable[[tuple], Any]:
    if has_sort:
        return lambda e: (order_key(e[0]), e[1])
    return lambda e: order_key(e[0])


def scatter(
    stream: Iterator[Any], spec: ScatterSpec, out_dir: str, memory_budget: int, shard_idx: int
) -> ScatterResult:
    """Partition `stream` into sorted runs under `out_dir`, spilling at `memory_budget` bytes."""
    os.makedirs(out_dir, exist_ok=True)
    n = spec.num_partitions
    buffers: list[list[tuple]] = [[] for _ in range(n)]
    result = ScatterResult()
    est = 0
    rng = random.Random(f"{spec.seed}:{shard_idx}") if spec.key_fn is None else None
    key_fn, sort_fn = spec.key_fn, spec.sort_fn

    def spill() -> None:
        nonlocal est
        path = os.path.join(out_dir, f"spill-{result.spills:05d}.arrow")
        writer = ChunkWriter(path, chunk_bytes_for(memory_budget))
        try:
            for p in range(n):
                buf = buffers[p]
                if not buf:
                    continue
                buf.sort(key=_entry_order(sort_fn is not None))
                if spec.combiner_fn is not None:
                    buf = list(_combine(buf, spec))
                start = writer.end_chunk()
                writer.extend(buf)
                stop = writer.end_chunk()
                result.runs.setdefault(p, []).append((path, start, stop))
                buffers[p] = []
            writer.close()
        except BaseException:
            writer.abort()
            raise
        result.spills += 1
        est = 0
        # Arrow's allocator keeps freed compression buffers; hand them back so the
        # process stays near its budget.
        pa.default_memory_pool().release_unused()

    for i, rec in enumerate(stream):
        if key_fn is None:
            key = rng.getrandbits(63)
            p = key % n
        else:
            key = key_fn(rec)
            p = partition_of(key, n)
        buffers[p].append((key, sort_fn(rec) if sort_fn is not None else None, rec))
        if i % 16 == 0:
            # Sampled: the entry tuple, the key and the record.
            est += 16 * (72 + approx_size(rec) + approx_size(key))
            if est >= memory_budget:
                spill()
        result.records += 1
    if any(buffers):
        spill()
    return result


def _split_group(group: Iterator[tuple]) -> tuple[Any, Iterator[Any]]:
    """A key group's key and its records (lazily: a group may not fit in memory)."""
    first = next(group)

    def records() -> Iterator[Any]:
        yield first[2]
        for e in group:
            yield e[2]

    return first[0], records()


def _combine(buf: list[tuple], spec: ScatterSpec) -> Iterator[tuple]:
    assert spec.combiner_fn is not None and spec.key_fn is not None
    for _ok, group in itertools.groupby(buf, key=lambda e: order_key(e[0])):
        key, items = _split_group(group)
        out = [
            (key, spec.sort_fn(r) if spec.sort_fn else None, r)
            for r in results_of(spec.combiner_fn(key, items))
        ]
        if spec.sort_fn is not None:
            out.sort(key=lambda e: e[1])
        yield from out


MERGE_FANIN = 64


def chunk_bytes_for(memory_budget: int) -> int:
    """Chunk size such that a merge of MERGE_FANIN runs (one chunk each) fits the budget."""
    return max(16 << 10, min(CHUNK_BYTES, memory_budget // (2 * MERGE_FANIN)))


def _merge(runs: list[Run], has_sort: bool) -> Iterator[tuple]:
    iters = [read_records(path, start, stop) for path, start, stop in runs]
    if len(iters) == 1:
        return iters[0]
    return heapq.merge(*iters, key=_entry_order(has_sort))


def merge_runs(
    runs: list[Run],
    has_sort: bool,
    scratch: str | None = None,
    fanin: int = MERGE_FANIN,
    chunk_bytes: int = CHUNK_BYTES,
) -> Iterator[tuple]:
    """All entries of `runs` in (key, sort) order, holding one chunk per merged run.

    More than `fanin` runs (many map tasks, or a small budget) are first merged
    `fanin` at a time into longer runs under `scratch`, so memory and open files
    stay bounded however many runs there are.
    """
    level = 0
    while len(runs) > fanin and scratch is not None:
        os.makedirs(scratch, exist_ok=True)
        merged: list[Run] = []
        for g in range(0, len(runs), fanin):
            group = runs[g : g + fanin]
            if len(group) == 1:
                merged.append(group[0])
                continue
            path = os.path.join(scratch, f"merge-{level}-{g // fanin:05d}.arrow")
            writer = ChunkWriter(path, chunk_bytes)
            try:
                writer.extend(_merge(group, has_sort))
                writer.close()
            except BaseException:
                writer.abort()
                raise
            merged.append((path, 0, writer.num_chunks))
        runs = merged
        level += 1
    return _merge(runs, has_sort)


def reduce_groups(
    entries: Iterator[tuple], reducer: Callable[[Any, Iterator[Any]], Any]
) -> Iterator[Any]:
    for _ok, group in itertools.groupby(entries, key=lambda e: order_key(e[0])):
        key, items = _split_group(group)
        try:
            yield from results_of(reducer(key, items))
        except Exception as e:
            shown = repr(key)
            e.add_note(f"raised by the reducer of key {shown[:200]}{'...' * (len(shown) > 200)}")
            raise


def shuffled_records(entries: Iterator[tuple]) -> Iterator[Any]:
    for e in entries:
        yield e[2]
