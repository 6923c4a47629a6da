"""Shared objects: a large object shipped to each worker once, not once per task.

`ZephyrContext.put(name, obj)` keeps the object on the driver. The first run
after it hands the object to the backend once, which turns it into a small
handle: a file pickled once under the context's scratch folder (local
workers), one `ray.put` (Ray), or the object itself (inline). Tasks carry only
the handles; a worker loads an object the first time a task asks for it
(`get_shared(name)`, or `ctx.get_shared(name)` on the context a function
captured) and keeps it for the tasks that follow.
"""

from __future__ import annotations

import contextvars
import pickle
from dataclasses import dataclass
from typing import Any

_registry: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "zephyr_shared_registry", default=None
)
_cache: dict[str, Any] = {}
# Ray: the object refs of the running task's shared objects, by handle key. They come
# as a task argument (not inside the pickled task) so Ray tracks them as borrowed refs.
ray_refs: dict[str, Any] = {}
loads = 0  # how many times this process deserialized a shared object (tests read it)


@dataclass(frozen=True)
class FileShared:
    """An object pickled once to a file every local worker can read."""

    path: str

    @property
    def key(self) -> str:
        return self.path

    def load(self) -> Any:
        with open(self.path, "rb") as f:
            return pickle.load(f)


@dataclass(frozen=True)
class RayShared:
    """An object in Ray's object store (one `ray.put` by the driver)."""

    key: str

    def load(self) -> Any:
        import ray

        if self.key not in ray_refs:
            raise RuntimeError(
                f"shared object {self.key} did not reach this Ray task; it is only "
                "available inside tasks that a ZephyrContext with backend='ray' runs"
            )
        return ray.get(ray_refs[self.key])


@dataclass(frozen=True)
class InlineShared:
    """The object itself: the inline backend runs tasks in the driver, nothing is pickled."""

    key: str
    obj: Any

    def load(self) -> Any:
        return self.obj


def set_registry(registry: dict[str, Any]) -> contextvars.Token:
    # A worker keeps only the objects the running pipeline uses: an object replaced by a
    # later put() under the same name is released, not kept for the worker's lifetime.
    # (Ray: the refs too, or the worker would keep the old object pinned in the store.)
    if _cache or ray_refs:
        live = {h.key for h in registry.values()}
        for key in [k for k in _cache if k not in live]:
            del _cache[key]
        for key in [k for k in ray_refs if k not in live]:
            del ray_refs[key]
    return _registry.set(registry)


def reset_registry(token: contextvars.Token) -> None:
    _registry.reset(token)


def get_shared(name: str) -> Any:
    """The object put under `name` with `ZephyrContext.put` (inside a task)."""
    global loads
    registry = _registry.get()
    if registry is None or name not in registry:
        known = sorted(registry) if registry else []
        raise KeyError(
            f"no shared object {name!r}; put it first with ZephyrContext.put({name!r}, obj) "
            f"before execute() (known: {known})"
        )
    handle = registry[name]
    if handle.key not in _cache:
        _cache[handle.key] = handle.load()
        loads += 1
    return _cache[handle.key]


def forget(key: str) -> None:
    _cache.pop(key, None)
