"""Shared objects (the guide's ctx.put / ctx.get_shared in a map) on local workers and Ray:
pickled once by the driver, loaded once per worker process, never inside a task's bytes."""

from __future__ import annotations

import collections
import os
import uuid

import numpy as np
import pytest

from marin_dagster.zephyr import Dataset, ZephyrContext, get_shared

PICKLED = collections.Counter()  # driver side: how many times each object was pickled


def _rebuild(tag: str, payload: object, folder: str) -> _Counted:
    # Runs where the object is unpickled: leave a file naming the process.
    open(os.path.join(folder, f"load-{os.getpid()}-{uuid.uuid4().hex}"), "w").close()
    return _Counted(tag, payload, folder)


class _Counted:
    """Counts its picklings (in the driver) and its unpicklings (one file per load)."""

    def __init__(self, tag: str, payload: object, folder: str):
        self.tag, self.payload, self.folder = tag, payload, folder

    def __reduce__(self):
        PICKLED[self.tag] += 1
        return _rebuild, (self.tag, self.payload, self.folder)


def test_guide_pattern_ships_a_100mb_array_once(any_ctx: ZephyrContext, tmp_path) -> None:
    ctx = any_ctx
    array = np.arange(100 * 2**20 // 8, dtype=np.int64)  # 100 MiB
    tag = uuid.uuid4().hex
    ctx.put("model", _Counted(tag, array, str(tmp_path)))
    ds = (
        Dataset.from_list(list(range(16)))
        .reshard(8)
        .map(lambda i: (os.getpid(), int(ctx.get_shared("model").payload[i * 1000])))
    )
    backend = ctx._get_backend()
    sent_before, tasks_before = backend.bytes_sent, backend.tasks_sent
    results = ctx.execute(ds).results
    assert [v for _, v in results] == [i * 1000 for i in range(16)]
    per_task = (backend.bytes_sent - sent_before) / (backend.tasks_sent - tasks_before)
    assert per_task < 64 * 1024, f"{per_task:.0f} bytes per task: the array travelled with it"
    assert PICKLED[tag] == 1, "pickled once by the driver, not once per shard"
    loads = [f.split("-")[1] for f in os.listdir(tmp_path)]
    task_pids = {pid for pid, _ in results}
    assert len(loads) == len(set(loads)), f"a worker process loaded it twice: {loads}"
    assert set(map(int, loads)) == task_pids  # loaded by the processes that ran tasks
    ctx.execute(ds)
    assert PICKLED[tag] == 1, "a second run reuses what the backend already holds"


def test_put_again_replaces_the_object(local_ctx: ZephyrContext) -> None:
    ctx = local_ctx
    ds = Dataset.from_list([1, 2, 3]).reshard(3).map(lambda x: x * get_shared("factor"))
    ctx.put("factor", 10)
    assert ctx.execute(ds).results == [10, 20, 30]
    ctx.put("factor", 100)  # workers drop the old one and load the new one
    assert ctx.execute(ds).results == [100, 200, 300]
    assert ctx.get_shared("factor") == 100  # the driver reads it too


def test_the_context_inside_a_task_only_reads(local_ctx: ZephyrContext) -> None:
    ctx = local_ctx
    with pytest.raises(Exception, match="put shared objects on the driver"):
        ctx.execute(Dataset.from_list([1]).map(lambda x: ctx.put("x", x)))
    with pytest.raises(Exception, match="no shared object 'missing'"):
        ctx.execute(Dataset.from_list([1]).map(lambda x: ctx.get_shared("missing")))


def test_an_object_that_cannot_travel_is_named() -> None:
    import threading

    with ZephyrContext(max_workers=1) as ctx:
        ctx.put("lock", threading.Lock())
        with pytest.raises(TypeError, match=r"ctx.put\('lock', ...\): the object cannot be sent"):
            ctx.execute(Dataset.from_list([1]))
