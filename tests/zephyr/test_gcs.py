"""A gs:// round trip through a real GCS server (the gcp-storage-emulator package)."""

from __future__ import annotations

import gzip
import json

import pyarrow.parquet as pq

from marin_dagster import fs
from marin_dagster.zephyr import Dataset, ZephyrContext


def test_gcs_round_trip(gcs_prefix: str) -> None:
    for s in range(2):
        rows = "".join(json.dumps({"s": s, "text": f"Line {i} OF text"}) + "\n" for i in range(20))
        fs.write_bytes(f"{gcs_prefix}/in/part-{s}.jsonl.gz", gzip.compress(rows.encode()))
    # A fresh context: its workers start after the emulator's address is in the environment.
    with ZephyrContext(max_workers=2) as ctx:
        ds = (
            Dataset.from_files(f"{gcs_prefix}/in/*.jsonl.gz")
            .load_jsonl()
            .map(lambda r: {**r, "text": r["text"].lower()})
            .write_parquet(f"{gcs_prefix}/out/{{basename}}-{{shard}}.parquet")
        )
        result = ctx.execute(ds)
        assert result.results == [
            f"{gcs_prefix}/out/part-0-0.parquet",
            f"{gcs_prefix}/out/part-1-1.parquet",
        ]
        filesystem, path = fs.url_to_fs(result.results[1])
        with filesystem.open(path, "rb") as f:
            assert pq.read_table(f).column("text").to_pylist()[:2] == [
                "line 0 of text",
                "line 1 of text",
            ]
        back = ctx.execute(
            Dataset.from_files(f"{gcs_prefix}/out/*.parquet")
            .load_parquet()
            .filter(lambda r: r["s"] == 1)
            .count()
        )
        assert back.results == [20]
        assert result.counters["bytes_written"] == sum(
            filesystem.info(fs.url_to_fs(p)[1])["size"] for p in result.results
        )
