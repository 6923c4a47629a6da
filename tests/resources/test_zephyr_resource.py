"""ZephyrResource runs a pipeline from a real Dagster asset: progress in the run log,
counters in the materialization's metadata."""

import json
import sys

import dagster as dg
import pydantic
import pytest

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


@dg.asset
def _noop(zephyr: ZephyrResource) -> None:
    pass


def _launch(backend: str, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    """A run that sets the resource's backend in its run config, as the launchpad does."""
    return dg.materialize(
        [_noop],
        resources={"zephyr": ZephyrResource.configure_at_launch()},
        run_config={"resources": {"zephyr": {"config": {"backend": backend}}}},
        instance=instance,
        raise_on_error=False,
    )


def test_a_backend_named_wrong_is_refused_before_the_run_starts() -> None:
    with dg.instance_for_test() as instance:
        with pytest.raises(dg.DagsterInvalidConfigError) as e:
            _launch("rey", instance)
    message = str(e.value)
    assert "zephyr:config:backend" in message and "got rey" in message, message
    assert all(name in message for name in ("local", "ray", "inline")), message
    with pytest.raises(pydantic.ValidationError, match="'local', 'ray' or 'inline'"):
        ZephyrResource(backend="rey")


def test_ray_missing_is_said_when_the_resource_is_built(monkeypatch) -> None:
    """Ray is installed here: `sys.modules["ray"] = None` makes every import of it fail, as
    on a machine without it."""
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(pydantic.ValidationError, match=r"pip install 'marin-dagster\[ray\]'"):
        ZephyrResource(backend="ray")
    with dg.instance_for_test() as instance:
        result = _launch("ray", instance)
    assert not result.success
    assert "pip install 'marin-dagster[ray]'" in str(result.all_events), result.all_events
    # the local backends do not need it
    assert ZephyrResource(backend="local").backend == "local"


def test_zero_workers_is_refused_not_run_as_one(capsys) -> None:
    """max_workers: 0 was accepted, run with one worker, and reported as 0."""
    with pytest.raises(pydantic.ValidationError, match="greater than or equal to 1"):
        ZephyrResource(max_workers=0)
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [_noop],
            resources={"zephyr": ZephyrResource.configure_at_launch()},
            run_config={"resources": {"zephyr": {"config": {"max_workers": 0}}}},
            instance=instance,
            raise_on_error=False,
        )
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "RESOURCE_INIT_FAILURE")
    assert "max_workers" in str(failure.event_specific_data.error)
