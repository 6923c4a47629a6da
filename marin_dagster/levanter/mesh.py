"""The device mesh and shardings: data parallel over all devices.

One process: its local devices. Several (multi-host, `distributed.py`): every process's
devices, ordered by process, so each process holds a contiguous block of the batch's rows
(`process_rows`) and builds only that block (`global_batch`).

One mesh axis, "data". The batch is split along it. Parameters (and the
optimizer state that mirrors them) are either replicated ("data_parallel") or
split along their largest divisible non-layer dimension ("fsdp", ZeRO-3 style);
XLA inserts the all-gathers and reduce-scatters.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from marin_dagster.levanter.config import PARALLELISMS, Parallelism

DATA_AXIS = "data"


def make_mesh(num_devices: int | None = None) -> Mesh:
    if jax.process_count() > 1:
        devices = jax.devices()
        if num_devices is not None and num_devices != len(devices):
            raise ValueError(
                f"num_devices={num_devices}, but a multi-host training uses every device of its "
                f"{jax.process_count()} processes ({len(devices)}); leave num_devices unset"
            )
        return Mesh(np.array(devices), (DATA_AXIS,))
    devices = jax.local_devices()
    if num_devices is not None:
        if not 1 <= num_devices <= len(devices):
            raise ValueError(
                f"num_devices={num_devices}, but this process sees {len(devices)} device(s) "
                f"({devices[0].platform}); use 1..{len(devices)} or leave it unset for all"
            )
        devices = devices[:num_devices]
    return Mesh(np.array(devices), (DATA_AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS, None))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def process_rows(sharding: NamedSharding, num_rows: int) -> tuple[int, int]:
    """The rows [start, stop) of a batch of `num_rows` that this process's devices hold."""
    if jax.process_count() == 1:
        return 0, num_rows
    spans = {
        (index[0].start or 0, num_rows if index[0].stop is None else index[0].stop)
        for index in sharding.addressable_devices_indices_map((num_rows, 1)).values()
    }
    start, stop = min(a for a, _ in spans), max(b for _, b in spans)
    if sum(b - a for a, b in spans) != stop - start:
        raise ValueError(f"this process's rows of the batch are not contiguous: {sorted(spans)}")
    return start, stop


def global_batch(local_rows: np.ndarray, sharding: NamedSharding, num_rows: int) -> jax.Array:
    """The global batch from this process's rows (`process_rows`); one process: device_put."""
    if jax.process_count() == 1:
        return jax.device_put(local_rows, sharding)
    return jax.make_array_from_process_local_data(
        sharding, local_rows, (num_rows, *local_rows.shape[1:])
    )


def global_array(value: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """An array every process holds whole, placed with `sharding` (each host keeps its part)."""
    if jax.process_count() == 1:
        return jax.device_put(value, sharding)
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def _fsdp_spec(path: tuple[Any, ...], shape: tuple[int, ...], n: int) -> PartitionSpec:
    # Stacked layer weights keep their leading layer axis whole: lax.scan slices it.
    stacked = any(getattr(k, "key", None) == "layers" for k in path)
    first = 1 if stacked else 0
    best = None
    for dim in range(first, len(shape)):
        if shape[dim] % n == 0 and (best is None or shape[dim] > shape[best]):
            best = dim
    if best is None or n == 1:
        return PartitionSpec()
    spec: list[str | None] = [None] * len(shape)
    spec[best] = DATA_AXIS
    return PartitionSpec(*spec)


def state_shardings(abstract_state: Any, mesh: Mesh, parallelism: Parallelism) -> Any:
    """A NamedSharding for every leaf of the (abstract) train state."""
    if parallelism not in PARALLELISMS:
        raise ValueError(f"parallelism must be one of {PARALLELISMS}, got {parallelism!r}")
    n = mesh.devices.size

    def leaf(path: tuple[Any, ...], x: Any) -> NamedSharding:
        if parallelism == "data_parallel" or not getattr(x, "shape", ()):
            return replicated(mesh)
        return NamedSharding(mesh, _fsdp_spec(path, tuple(x.shape), n))

    return jax.tree_util.tree_map_with_path(leaf, abstract_state)
