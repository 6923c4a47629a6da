"""Where tasks run: in the driver (inline), in local worker processes, or on Ray."""

from __future__ import annotations

import importlib.util
from typing import Any

from marin_dagster.zephyr.backends.base import Backend, WorkerLost

BACKENDS = ("local", "ray", "inline")
RAY_MISSING = "backend='ray' needs Ray: pip install 'marin-dagster[ray]'"


def ray_installed() -> bool:
    """Whether Ray can be imported here, without importing it (a second or more)."""
    try:
        return importlib.util.find_spec("ray") is not None
    except ValueError:  # sys.modules["ray"] is None: every import of it fails
        return False


def make_backend(name: str, max_workers: int, **options: Any) -> Backend:
    if name == "local":
        from marin_dagster.zephyr.backends.local import LocalBackend

        return LocalBackend(max_workers, **options)
    if name == "ray":
        from marin_dagster.zephyr.backends.ray_backend import RayBackend

        return RayBackend(max_workers, **options)
    if name == "inline":
        from marin_dagster.zephyr.backends.inline import InlineBackend

        return InlineBackend()
    raise ValueError(f"unknown Zephyr backend {name!r}; choose one of {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "RAY_MISSING", "Backend", "WorkerLost", "make_backend", "ray_installed"]
