"""Real step outputs (status, manifest, data files) written through execute_step."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from marin_dagster import fs
from marin_dagster.execution.step import execute_step
from marin_dagster.tokenize import TokenCacheShardWriter, finalize_split, write_cache_stats


def write_output(prefix: str, name: str, version: str, files: Mapping[str, bytes]) -> str:
    """`{prefix}/{name}-{version}` holding `files`, finished with SUCCESS like a real step."""
    path = fs.join(prefix, f"{name}-{version}")

    def run(out: str) -> dict[str, Any]:
        for rel, data in files.items():
            fs.write_bytes(fs.join(out, rel), data)
        return {"files": len(files)}

    execute_step(path, version, run)
    return path


def jsonl_gz(records: Sequence[Mapping[str, Any]]) -> bytes:
    return gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode(), mtime=0)


def write_token_cache(
    prefix: str, name: str, version: str, splits: Mapping[str, Sequence[Sequence[Sequence[int]]]]
) -> str:
    """A token cache in the documented layout, built with the tokenize package's writer."""
    path = fs.join(prefix, f"{name}-{version}")

    def run(out: str) -> dict[str, Any]:
        ledgers = {}
        for split, shards in splits.items():
            names = []
            for index, docs in enumerate(shards):
                shard = f"part-{index:05d}"
                with TokenCacheShardWriter(fs.join(out, split, shard), np.uint16) as writer:
                    for doc in docs:
                        writer.add(np.asarray(doc, np.uint16), num_bytes=len(doc))
                    writer.finish()
                names.append(shard)
            ledgers[split] = finalize_split(fs.join(out, split), names, np.uint16, eos_id=0)
        write_cache_stats(out, ledgers)
        return {}

    execute_step(path, version, run)
    return path


@pytest.fixture
def corpus_records() -> list[dict[str, Any]]:
    words = ["to", "be", "or", "not", "that", "is", "the", "question"]
    return [
        {"id": f"doc-{i}", "text": " ".join(words[: 1 + i % 8]) * (1 + i), "title": f"t{i % 3}"}
        for i in range(40)
    ]


@pytest.fixture
def make_outputs() -> Callable[..., Any]:
    return write_output
