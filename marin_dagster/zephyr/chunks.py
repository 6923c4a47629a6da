"""Chunk files: the scratch format between stages (shuffle runs, materialized shards).

An Arrow IPC file (zstd-compressed buffers) whose record batches each hold one
chunk: a pickled list of records. Records are arbitrary Python objects, so
they cannot all be Arrow columns; batching many records per pickle keeps the
per-record cost low, and the IPC file's footer gives random access to any run
of chunks (a shuffle partition inside a spill file) without reading the rest.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pyarrow as pa

CHUNK_RECORDS = 2048
CHUNK_BYTES = 4 << 20
_SCHEMA = pa.schema([("payload", pa.large_binary())])
_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")


def approx_size(obj: Any, depth: int = 0) -> int:
    """A fast, rough estimate of the memory an object holds (for spill budgets)."""
    if isinstance(obj, str | bytes):
        return 50 + len(obj)
    if isinstance(obj, dict):
        if depth > 4:
            return 64 * len(obj)
        return 232 + sum(
            approx_size(k, depth + 1) + approx_size(v, depth + 1) for k, v in obj.items()
        )
    if isinstance(obj, list | tuple):
        if depth > 4:
            return 64 * len(obj)
        return 56 + 8 * len(obj) + sum(approx_size(v, depth + 1) for v in obj)
    if isinstance(obj, pa.RecordBatch | pa.Table):
        return obj.nbytes
    return sys.getsizeof(obj)


def dumps(obj: Any) -> bytes:
    try:
        return pickle.dumps(obj, protocol=5)
    except (pickle.PicklingError, AttributeError, TypeError):
        # Lambdas or local classes inside records: cloudpickle carries them by value.
        return cloudpickle.dumps(obj, protocol=5)


class ChunkWriter:
    """Append records; they are grouped into chunks of CHUNK_RECORDS / CHUNK_BYTES."""

    def __init__(self, path: str, max_chunk_bytes: int = CHUNK_BYTES):
        self.path = path
        self.max_chunk_bytes = max_chunk_bytes
        self._sink = pa.OSFile(path, "wb")
        self._writer = pa.ipc.new_file(self._sink, _SCHEMA, options=_OPTIONS)
        self._chunk: list[Any] = []
        self._chunk_bytes = 0
        self.num_chunks = 0
        self.num_records = 0
        self.chunk_counts: list[int] = []

    def add(self, record: Any) -> None:
        self._chunk.append(record)
        # Sampling keeps the estimate cheap; records in one stream are similar.
        if len(self._chunk) % 32 == 1:
            self._chunk_bytes += 32 * approx_size(record)
        if len(self._chunk) >= CHUNK_RECORDS or self._chunk_bytes >= self.max_chunk_bytes:
            self.end_chunk()

    def extend(self, records: Any) -> None:
        for r in records:
            self.add(r)

    def end_chunk(self) -> int:
        """Close the current chunk (if any); returns the number of chunks so far."""
        if self._chunk:
            payload = dumps(self._chunk)
            self._writer.write_batch(
                pa.record_batch([pa.array([payload], pa.large_binary())], schema=_SCHEMA)
            )
            self.num_records += len(self._chunk)
            self.chunk_counts.append(len(self._chunk))
            self.num_chunks += 1
            self._chunk = []
            self._chunk_bytes = 0
        return self.num_chunks

    def close(self) -> None:
        self.end_chunk()
        self._writer.close()
        self._sink.close()

    def abort(self) -> None:
        try:
            self._writer.close()
        finally:
            self._sink.close()


def read_chunks(path: str, start: int = 0, stop: int | None = None) -> Iterator[list[Any]]:
    """The chunks [start, stop) of a chunk file, one list of records at a time."""
    # Plain reads, not a memory map: mapped pages would stay resident (and count
    # against the worker's memory) until the whole run is read.
    with pa.OSFile(path, "r") as source:
        reader = pa.ipc.open_file(source)
        stop = reader.num_record_batches if stop is None else stop
        for i in range(start, stop):
            batch = reader.get_batch(i)
            yield pickle.loads(batch.column(0)[0].as_py())


def read_records(path: str, start: int = 0, stop: int | None = None) -> Iterator[Any]:
    for chunk in read_chunks(path, start, stop):
        yield from chunk
