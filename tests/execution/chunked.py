"""A test factory on the same `versioned_asset` helper as the real ones.

`chunked` writes `num_chunks` deterministic files, pausing halfway through each write
when asked (`delay_s`), and
records each entry into its compute and each chunk it writes in a counter
file, so tests can count work instead of timing it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import dagster as dg

from marin_dagster import fs
from marin_dagster.execution.asset import StepContext, versioned_asset
from marin_dagster.execution.version import StepConfig, unversioned


class ChunkedConfig(StepConfig):
    num_chunks: int = 4
    seed: int = 0
    chunk_bytes: int = 4096
    delay_s: float = unversioned(0.0)
    counter: str = unversioned("")


def chunk_bytes(seed: int, index: int, size: int, upstream: bytes = b"") -> bytes:
    out = b""
    block = hashlib.sha256(upstream + f"{seed}:{index}".encode()).digest()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block
    return out[:size]


def record(counter: str, event: str) -> None:
    if counter:
        with open(counter, "a") as f:
            f.write(f"{event} {os.getpid()}\n")


def _run(
    config: ChunkedConfig, inputs: Mapping[str, str], output_path: str, step: StepContext
) -> dict[str, Any]:
    record(config.counter, "enter")
    upstream = b""
    if "source" in inputs:
        upstream = fs.read_bytes(fs.join(inputs["source"], "chunk-00000.bin"))
    written = 0
    for i in range(config.num_chunks):
        target = fs.join(output_path, f"chunk-{i:05d}.bin")
        if fs.exists(target):
            continue
        data = chunk_bytes(config.seed, i, config.chunk_bytes, upstream)
        with fs.atomic_write(target) as f:
            f.write(data[: len(data) // 2])
            f.flush()
            time.sleep(config.delay_s)  # a kill now lands inside the write
            f.write(data[len(data) // 2 :])
        record(config.counter, f"chunk{i}")
        written += 1
    return {"chunks_written": written, "note": dg.MetadataValue.md(f"**{written}** chunks")}


def chunked(
    name: str, upstream: dg.AssetsDefinition | None = None, **config: Any
) -> dg.AssetsDefinition:
    return versioned_asset(
        name=name,
        kind="chunked",
        config=ChunkedConfig(**config),
        run=_run,
        upstream={"source": upstream} if upstream is not None else None,
        description="test chunks",
    )


def main() -> None:
    """Materialize one chunked asset in this process; used by the subprocess tests."""
    from resources.storage import StorageResource

    parser = argparse.ArgumentParser()
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--counter", required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--num-chunks", type=int, default=4)
    parser.add_argument("--stale-after", type=float, default=90.0)
    parser.add_argument("--heartbeat", type=float, default=30.0)
    args = parser.parse_args()
    asset = chunked(
        "test/chunks", num_chunks=args.num_chunks, delay_s=args.delay, counter=args.counter
    )
    storage = StorageResource(
        prefix=args.prefix,
        stale_after_s=args.stale_after,
        heartbeat_s=args.heartbeat,
        lease_wait_s=120,
    )
    result = dg.materialize(
        [asset], instance=dg.DagsterInstance.get(), resources={"storage": storage}
    )
    mat = result.asset_materializations_for_node(asset.op.name)[0]
    sys.stdout.write(
        json.dumps(
            {
                "skipped": mat.metadata["skipped"].value,
                "data_version": mat.tags["dagster/data_version"],
            }
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
