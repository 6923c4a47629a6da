"""Shared objects: a large object shipped to each worker once, not once per task.

`ZephyrContext.upload_shared(name, obj)` writes the object to the context's
scratch folder; tasks carry only its path, and each worker process loads it
the first time a task asks `get_shared(name)`, then keeps it.
"""

from __future__ import annotations

import contextvars
import pickle
from typing import Any

_registry: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "zephyr_shared_registry", default=None
)
_cache: dict[str, Any] = {}
loads = 0  # how many times this process deserialized a shared object (tests read it)


def set_registry(registry: dict[str, str]) -> contextvars.Token:
    return _registry.set(registry)


def reset_registry(token: contextvars.Token) -> None:
    _registry.reset(token)


def get_shared(name: str) -> Any:
    """The object uploaded under `name` with ZephyrContext.upload_shared."""
    global loads
    registry = _registry.get()
    if registry is None or name not in registry:
        known = sorted(registry) if registry else []
        raise KeyError(
            f"no shared object {name!r}; upload it first with "
            f"ZephyrContext.upload_shared({name!r}, obj) (known: {known})"
        )
    path = registry[name]
    if path not in _cache:
        with open(path, "rb") as f:
            _cache[path] = pickle.load(f)
        loads += 1
    return _cache[path]


def forget(path: str) -> None:
    _cache.pop(path, None)
