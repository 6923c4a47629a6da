"""The order in which a stage's shards start: the largest first (files by bytes, shuffle
partitions by chunks), except where order matters."""

from __future__ import annotations

import json
import os

from marin_dagster.zephyr import Dataset, ZephyrContext

# Records per file, in file-name order; two files tie.
SIZES = {"a": 10, "b": 400, "c": 40, "d": 1200, "e": 1200, "f": 1}


def _files(folder) -> None:
    for name, n in SIZES.items():
        lines = [json.dumps({"file": name, "i": i}) for i in range(n)]
        (folder / f"{name}.jsonl").write_text("\n".join(lines) + "\n")


def _log_start(log: str):
    def start(records, info):
        with open(log, "a") as f:  # one worker: shards run one after another
            f.write(os.path.basename(info.source) + "\n")
        yield from records

    return start


def test_file_shards_start_largest_first_and_results_keep_file_order(tmp_path):
    _files(tmp_path)
    log = str(tmp_path / "started.log")
    ds = Dataset.from_files(str(tmp_path / "*.jsonl")).load_jsonl().map_shard(_log_start(log))
    with ZephyrContext(max_workers=1) as ctx:
        result = ctx.execute(ds)
    started = open(log).read().split()
    # d and e tie: shard order between them.
    assert started == ["d.jsonl", "e.jsonl", "b.jsonl", "c.jsonl", "a.jsonl", "f.jsonl"]
    assert [r["file"] for r in result.results] == [n for n, k in SIZES.items() for _ in range(k)]


def test_take_still_reads_files_in_order(tmp_path):
    _files(tmp_path)
    log = str(tmp_path / "started.log")
    ds = Dataset.from_files(str(tmp_path / "*.jsonl")).load_jsonl().map_shard(_log_start(log))
    with ZephyrContext(max_workers=1) as ctx:
        result = ctx.execute(ds.take(3))
    assert result.results == [{"file": "a", "i": i} for i in range(3)]
    assert open(log).read().split() == ["a.jsonl"]  # the first file holds all three


def test_a_hot_keys_partition_starts_first(tmp_path):
    from marin_dagster.zephyr.keys import partition_of

    parts = 4
    keys = ["hot", *(f"k{i}" for i in range(40))]
    hot = partition_of("hot", parts)
    # Most records share one key; its partition holds many chunks, the others one.
    records = ["hot"] * 30_000 + [k for k in keys[1:] for _ in range(5)]
    log = str(tmp_path / "started.log")

    def start(groups, info):
        with open(log, "a") as f:
            f.write(f"{info.index}\n")
        yield from groups

    ds = (
        Dataset.from_list(records)
        .group_by(lambda r: r, lambda k, rs: (k, sum(1 for _ in rs)), num_output_shards=parts)
        .map_shard(start)
    )
    with ZephyrContext(max_workers=1) as ctx:
        result = ctx.execute(ds)
    started = [int(x) for x in open(log).read().split()]
    assert hot != 0 and started[0] == hot  # not shard order
    assert sorted(started) == list(range(parts))
    assert dict(result.results) == {"hot": 30_000, **{k: 5 for k in keys[1:]}}
