"""Ray: the distributed backend for pipelines that outgrow one machine.

Tasks are plain Ray tasks (one per shard) running the same worker code as the
local backend. Ray's own retries are off: the driver retries, so both
backends count failures the same way. Task resources become Ray task options
(num_cpus, memory in bytes, num_gpus, custom resources such as TPU). Shared
objects go to Ray's object store once (`ray.put`); each task gets their refs
as an argument and a worker process fetches an object the first time a task
asks for it. Scratch files live under the context's scratch folder, which must
be visible to every node (one machine, or a shared mount). Without an `address`, the
cluster `RAY_ADDRESS` names is joined; with neither, a local one is started.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import uuid
from typing import Any

import cloudpickle

from marin_dagster.zephyr import shared
from marin_dagster.zephyr.backends import RAY_MISSING
from marin_dagster.zephyr.backends.base import (
    WorkerLost,
    dumps_task,
    loads_result,
    run_task_bytes,
)
from marin_dagster.zephyr.resources import TaskResources
from marin_dagster.zephyr.runtime import Task, TaskResult

logger = logging.getLogger(__name__)


def _ray_run(payload: bytes, refs: dict[str, Any]) -> bytes:
    # Nested in a dict, the refs are not fetched by Ray before the call: only the
    # objects a task asks for are fetched, once per worker process (shared.py caches).
    shared.ray_refs.update(refs)
    return run_task_bytes(payload)


# How long the cluster's address may take to accept a connection before joining it fails.
CONNECT_TIMEOUT_S = 10.0


def _check_reachable(address: str, given: str) -> None:
    """Fail in seconds, naming the address, where nothing listens there: ray.init() retried
    in silence for minutes (a typo in RAY_ADDRESS, a cluster that was stopped)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if host.startswith("[") and host.endswith("]"):  # an IPv6 address, "[::1]:6379"
        host = host[1:-1]
    if not host or not port.isdigit():  # "auto", "local": Ray's own ways to find it
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise ConnectionError(
            f"no Ray cluster answers at {address} (from {given}) within "
            f"{CONNECT_TIMEOUT_S:.0f} s: {e}. Start it (`ray start --head`), correct the "
            "address, or unset it to start a local cluster for the run"
        ) from None


class RayBackend:
    def __init__(self, max_workers: int, address: str | None = None):
        try:
            import ray
        except ImportError:
            raise ImportError(RAY_MISSING) from None
        self._ray = ray
        if not ray.is_initialized():
            # RAY_ADDRESS is how Ray's own tools name a running cluster; ray.init() reads it
            # too, and then refuses num_cpus, so joining it takes an address-only init.
            given = "address" if address else "RAY_ADDRESS"
            address = address or os.environ.get("RAY_ADDRESS") or None
            if address:
                _check_reachable(address, given)
                ray.init(address=address)
            else:
                ray.init(num_cpus=max(1, max_workers), include_dashboard=False, log_to_driver=False)
        self.capacity = max(1, max_workers)
        self._remote = ray.remote(max_retries=0)(_ray_run)
        self._refs: dict[Any, Any] = {}
        self._shared: dict[str, Any] = {}  # handle key -> ObjectRef, kept alive here
        self.tasks_sent = 0
        self.bytes_sent = 0

    def share(self, obj: Any, folder: str) -> Any:
        # ray.put pickles with Ray's own cloudpickle: tell it of the modules that travel by
        # value (execute() registered them with dumps_task's cloudpickle), so an object whose
        # class an experiment file loaded by path defines loads in a Ray worker too.
        import ray.cloudpickle

        known = ray.cloudpickle.list_registry_pickle_by_value()
        for name in cloudpickle.list_registry_pickle_by_value() - known:
            if name in sys.modules:
                ray.cloudpickle.register_pickle_by_value(sys.modules[name])
        key = uuid.uuid4().hex
        self._shared[key] = self._ray.put(obj)
        return shared.RayShared(key)

    def submit(self, key: Any, task: Task, resources: TaskResources | None = None) -> None:
        options = (resources or TaskResources()).ray_options()
        refs = {
            h.key: self._shared[h.key]
            for h in task.shared.values()
            if isinstance(h, shared.RayShared) and h.key in self._shared
        }
        payload = dumps_task(task)
        self.tasks_sent += 1
        self.bytes_sent += len(payload)
        ref = self._remote.options(**options).remote(payload, refs)
        self._refs[ref] = key

    def poll(self, timeout: float) -> list[tuple[Any, TaskResult | WorkerLost]]:
        if not self._refs:
            return []
        ray = self._ray
        ready, _ = ray.wait(list(self._refs), num_returns=1, timeout=timeout)
        rest = [r for r in self._refs if r not in ready]
        if ready and rest:
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready = ready + more
        out: list[tuple[Any, TaskResult | WorkerLost]] = []
        for ref in ready:
            key = self._refs.pop(ref)
            try:
                out.append((key, loads_result(ray.get(ref))))
            except ray.exceptions.RayError as e:
                logger.warning("Ray task for %s was lost: %s", key, e)
                out.append((key, WorkerLost(f"{type(e).__name__}: {e}")))
        return out

    def shutdown(self) -> None:
        for ref in list(self._refs):
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - best effort on the way out
                logger.debug("could not cancel %s", ref)
        self._refs = {}
        self._shared = {}
