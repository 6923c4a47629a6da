"""The device mesh and shardings: data parallel over all local devices.

One mesh axis, "data". The batch is split along it. Parameters (and the
optimizer state that mirrors them) are either replicated ("data_parallel") or
split along their largest divisible non-layer dimension ("fsdp", ZeRO-3 style);
XLA inserts the all-gathers and reduce-scatters.
"""

from __future__ import annotations

from typing import Any, Literal

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

Parallelism = Literal["data_parallel", "fsdp"]
PARALLELISMS = ("data_parallel", "fsdp")
DATA_AXIS = "data"


def make_mesh(num_devices: int | None = None) -> Mesh:
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
