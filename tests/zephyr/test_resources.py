"""Task resources: dicts, "cpu:2,memory:4g" strings and ResourceConfig; enforced by local
workers (cores pinned, memory watched) and passed to Ray as Ray resources."""

from __future__ import annotations

import itertools
import os
import time

import numpy as np
import pytest

from marin_dagster.iris import GpuConfig, ResourceConfig
from marin_dagster.zephyr import Dataset, ShardFailedError, ZephyrContext
from marin_dagster.zephyr.resources import TaskResources


def test_three_ways_to_write_a_request() -> None:
    want = TaskResources(cpus=2, memory=4 * 2**30)
    assert TaskResources.parse({"num_cpus": 2, "memory": "4g"}) == want
    assert TaskResources.parse({"cpu": 2, "ram": 4 * 2**30}) == want
    assert TaskResources.parse("cpu:2,memory:4g") == want
    assert TaskResources.parse(" cpu=2 , mem:4GiB ") == want
    assert TaskResources.parse(ResourceConfig(cpu=2, ram="4g")) == want
    assert TaskResources.parse("cpu:2 ram=4g") == want  # Iris's own string
    gpu = TaskResources.parse(ResourceConfig(cpu=8, ram="64g", device=GpuConfig("h100", 8)))
    assert gpu.ray_options() == {"num_cpus": 8, "memory": 64 * 2**30, "num_gpus": 8}
    tpu = TaskResources.parse("tpu:v5e-8")
    assert tpu.ray_options()["resources"] == {"TPU": 8}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"cores": 2}, "unknown resource 'cores'"),
        ("cpu:two", "neither a resource hint"),
        ("memory:lots", "neither a resource hint"),
        ({"memory": 0}, "memory must be positive"),
        (3, "expected a dict, a string"),
    ],
)
def test_bad_requests_name_the_problem(value, message) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        ZephyrContext(stage_resources={"map": value})
    with pytest.raises((ValueError, TypeError), match=message):
        Dataset.from_list([1]).map(str, resources=value)


def _cores(_x: int) -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))


def test_local_tasks_run_on_the_cores_they_ask_for(local_ctx: ZephyrContext) -> None:
    ds = Dataset.from_list(list(range(4))).reshard(4)
    one = local_ctx.execute(ds.map(_cores, resources="cpu:1")).results
    assert all(len(c) == 1 for c in one), one
    every = tuple(sorted(os.sched_getaffinity(0)))
    # Unpinned again afterwards; stage_resources overrides the operation's hint.
    assert local_ctx.execute(ds.map(_cores)).results == [every] * 4
    with ZephyrContext(max_workers=2, stage_resources={0: ResourceConfig(cpu=1)}) as ctx:
        assert all(len(c) == 1 for c in ctx.execute(ds.map(_cores, resources="cpu:2")).results)


def _allocate(mb: int) -> int:
    block = np.ones(mb * 2**20, dtype=np.uint8)  # touched, so resident
    return int(block[::4096].sum() > 0)


def test_a_worker_over_its_memory_limit_fails_the_task_clearly(tmp_path) -> None:
    ds = Dataset.from_list([600]).map(_allocate, resources="cpu:1,memory:250m")
    with ZephyrContext(max_workers=1, max_shard_failures=2) as ctx:
        backend = ctx._get_backend()
        with pytest.raises(ShardFailedError) as err:
            ctx.execute(ds)
    message = str(err.value)
    assert "stage 0" in message and "memory limit of 250m" in message, message
    assert "2 attempts" in message and "stage_resources" in message, message
    assert backend.workers_started == 2  # each attempt had a fresh worker


def test_a_task_over_memory_once_is_retried_on_a_fresh_worker(tmp_path) -> None:
    marker = tmp_path / "first-attempt"

    def grow_once(x: int) -> int:
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            _allocate(600)
        return os.getpid()

    ds = Dataset.from_list([1]).map(grow_once)
    with ZephyrContext(max_workers=1, stage_resources={"map": "memory:250m"}) as ctx:
        [pid] = ctx.execute(ds).results
        small = ctx.execute(Dataset.from_list([5]).map(_allocate, resources="memory:250m"))
    assert pid != int(marker.read_text()), "the retry ran in a new worker"
    assert small.results == [1]  # under the limit: untouched


def test_ray_gets_the_request_as_ray_resources(ray_ctx: ZephyrContext) -> None:
    import ray

    def assigned(_x):
        return ray.get_runtime_context().get_assigned_resources()

    ds = Dataset.from_list([1]).map(assigned, resources="cpu:2,memory:100m")
    assert ray_ctx.execute(ds).results == [{"CPU": 2.0, "memory": 100.0 * 2**20}]
    ds = Dataset.from_list([1]).map(assigned, resources=ResourceConfig(cpu=1, ram="64m"))
    assert ray_ctx.execute(ds).results == [{"CPU": 1.0, "memory": 64.0 * 2**20}]

    def span(_x):
        start = time.monotonic()
        time.sleep(0.3)
        return start, time.monotonic()

    # Two CPUs in the test cluster: tasks asking for both never overlap.
    ds = Dataset.from_list(list(range(3))).reshard(3).map(span)
    with ZephyrContext(max_workers=2, backend="ray", stage_resources={"map": "cpu:2"}) as ctx:
        spans = sorted(ctx.execute(ds).results)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans
