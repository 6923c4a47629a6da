"""The local launcher end to end: real step subprocesses against a persistent instance."""

from __future__ import annotations

import dagster as dg
import pytest

from marin_dagster.iris import ResourceConfig
from marin_dagster.iris.inventory import DeviceLeases, LocalInventory
from tests.iris import jobs
from tests.iris.conftest import execution_config, read_records


def test_gpu_steps_take_turns_on_one_device_while_cpu_runs_alongside(instance, iris_dir, tmp_path):
    result = dg.execute_job(
        dg.reconstructable(jobs.local_gpu_job),
        instance=instance,
        run_config=execution_config(tmp_path),
    )
    assert result.success, [e.message for e in result.all_events if e.is_failure]

    a_start, a_end = read_records(iris_dir, "gpu_a.start"), read_records(iris_dir, "gpu_a.end")
    b_start, b_end = read_records(iris_dir, "gpu_b.start"), read_records(iris_dir, "gpu_b.end")
    assert len(a_start) == len(b_start) == len(a_end) == len(b_end) == 1
    # One device: one GPU step strictly after the other.
    first, second = sorted([(a_start[0]["t"], a_end[0]["t"]), (b_start[0]["t"], b_end[0]["t"])])
    assert second[0] >= first[1], (first, second)
    for start in (a_start[0], b_start[0]):
        assert start["env"]["CUDA_VISIBLE_DEVICES"] == "0"
        assert start["env"]["MARIN_IRIS_ASSIGNED_DEVICES"] == "gpu:0"
        assert start["env"]["MARIN_IRIS_REQUESTED"] == "gpu:1"
        assert start["env"]["MARIN_IRIS_LAUNCHER"] == "local"

    # The CPU step overlapped a GPU step and saw no GPU.
    c_start, c_end = (
        read_records(iris_dir, "cpu_side.start")[0],
        read_records(iris_dir, "cpu_side.end")[0],
    )
    assert c_start["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert c_start["t"] < first[1] and c_end["t"] > first[0]
    pids = {c_start["pid"], a_start[0]["pid"], b_start[0]["pid"]}
    assert len(pids) == 3  # three separate step processes

    # Asked / given / where, in asset metadata and in the run log.
    for key, assigned in (("gpu_a", "gpu:0"), ("gpu_b", "gpu:0"), ("cpu_side", "none")):
        event = instance.get_latest_materialization_event(dg.AssetKey(key))
        metadata = event.asset_materialization.metadata
        assert metadata["iris/assigned"].value == assigned
        assert metadata["iris/launcher"].value == "local"
        assert metadata["iris/host"].value
    starting = [e for e in result.all_events if e.event_type_value == "STEP_WORKER_STARTING"]
    by_step = {e.step_key: e.event_specific_data.metadata for e in starting}
    assert by_step["gpu_a"]["iris/requested"].value == "gpu:1"
    assert by_step["gpu_a"]["iris/assigned"].value == "gpu:0"
    assert by_step["cpu_side"]["iris/assigned"].value == "none"
    # The run released its lease when it finished (this process ran the executor).
    leases = DeviceLeases(LocalInventory.from_config(gpus=["0"]), str(tmp_path / "leases"))
    assert leases.acquire("after", ResourceConfig.parse("gpu:1")) is not None
    leases.release_all()
    waits = [
        e
        for e in result.all_events
        if e.event_type_value == "ENGINE_EVENT" and "waits for" in (e.message or "")
    ]
    assert len(waits) == 1  # the second GPU step waited for the device once


def _most_at_once(records: list[dict]) -> int:
    running = most = 0
    for r in sorted(records, key=lambda r: (r["t"], r["event"] == "start")):
        running += 1 if r["event"] == "start" else -1
        most = max(most, running)
    return most


@pytest.mark.parametrize("max_concurrent", [1, 2])
def test_cpu_steps_honor_max_concurrent(instance, iris_dir, tmp_path, max_concurrent):
    result = dg.execute_job(
        dg.reconstructable(jobs.slots_job),
        instance=instance,
        run_config=execution_config(tmp_path, max_concurrent=max_concurrent),
    )
    assert result.success
    records = read_records(iris_dir, "slots")
    assert len(records) == 6
    assert _most_at_once(records) == max_concurrent
