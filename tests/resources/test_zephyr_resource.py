"""ZephyrResource runs a pipeline from a real Dagster asset: progress in the run log,
counters in the materialization's metadata."""

import json

import dagster as dg

from marin_dagster.zephyr import Dataset, counters
from resources.zephyr import ZephyrResource, zephyr_metadata


def _keep_long(r: dict) -> bool:
    counters.increment("seen")
    return len(r["text"]) > 6


def test_resource_from_asset(tmp_path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": "x" * i}) + "\n" for i in range(10)))
    out = tmp_path / "out"

    @dg.asset
    def long_lines(
        context: dg.AssetExecutionContext, zephyr: ZephyrResource
    ) -> dg.MaterializeResult:
        ds = (
            Dataset.from_files(str(src))
            .load_jsonl()
            .reshard(2)
            .filter(_keep_long)
            .write_jsonl(str(out / "part-{shard:05d}.jsonl"))
        )
        result = zephyr.execute(ds, context=context)
        return dg.MaterializeResult(metadata=zephyr_metadata(result))

    instance = dg.DagsterInstance.ephemeral()
    res = dg.materialize(
        [long_lines], resources={"zephyr": ZephyrResource(max_workers=2)}, instance=instance
    )
    assert res.success
    meta = res.asset_materializations_for_node("long_lines")[0].metadata
    assert meta["zephyr/records_in"].value == 10
    assert meta["zephyr/records_written"].value == 3
    assert meta["zephyr/seen"].value == 10 and meta["zephyr/seen/max"].value == 5
    assert meta["zephyr/bytes_written"].value > 0
    lines = [e.user_message for e in instance.all_logs(res.run_id)]
    assert any("zephyr 1/2" in m and "load_jsonl" in m and "1/1 shards" in m for m in lines), lines
    assert any("zephyr 2/2" in m and "2/2 shards" in m for m in lines), lines
    assert sorted(p.name for p in out.iterdir()) == ["part-00000.jsonl", "part-00001.jsonl"]
