"""The contract between the driver and a backend."""

from __future__ import annotations

import os
import sys
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

import cloudpickle

from marin_dagster.zephyr.resources import TaskResources
from marin_dagster.zephyr.runtime import Task, TaskResult, run_task
from marin_dagster.zephyr.shared import FileShared


@dataclass
class WorkerLost:
    """The process running a task died (killed, out of memory) before it answered.

    `over_memory` is set when the backend killed it for going over the task's memory
    limit: that counts as a failed attempt (it would likely fail again), not as a lost
    worker.
    """

    reason: str
    over_memory: bool = False
    exit_code: int | None = None
    """The process's exit status where known: negative, the signal that ended it."""

    def advice(self) -> str:
        """What a shard that keeps losing its worker this way likely needs."""
        if self.exit_code is not None and self.exit_code > 0:
            return (
                "the process exited by itself: the task's code, or a library it calls, ended "
                "it (os._exit, exit() in native code); run the function on that shard's "
                "records in one process to find which"
            )
        if self.exit_code is not None and self.exit_code != -9:
            return "a crash in native code (a library's C or Rust code) ended the process"
        return "the shard may need more memory (stage_resources) or a smaller memory_budget"


class Backend(Protocol):
    capacity: int

    def submit(self, key: Any, task: Task, resources: TaskResources) -> None:
        """Start `task`; its outcome comes back from poll() under `key`."""

    def poll(self, timeout: float) -> list[tuple[Any, TaskResult | WorkerLost]]:
        """Outcomes of finished tasks (waits up to `timeout` seconds for the first)."""

    def share(self, obj: Any, folder: str) -> Any:
        """A small handle for `obj` that tasks resolve with shared.get_shared (done once)."""

    def shutdown(self) -> None: ...


_EXAMINED: set[str] = set()


def _importable(name: str) -> bool:
    # importlib's own search without its sys.modules shortcut: the path, and finders such
    # as an editable install's, which a worker has too
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        try:
            if find is not None and find(name, None) is not None:
                return True
        except Exception:
            return True  # a finder that cannot be asked: by reference, as before
    return False


def pickle_file_modules_by_value() -> None:
    """Make functions of modules that a worker cannot import by name pickle by value.

    `dagster dev -f exp.py` and `dagster job execute -f exp.py` load an experiment file as a
    top-level module whose folder need not be on sys.path. A worker's import path is the
    driver's, so it could not import that module to unpickle a function defined there
    (cloudpickle does for `__main__` what this does for such modules). Called by the driver
    at each execute(), before it pickles anything for the workers; a module is examined
    once, when it first appears."""
    new = [n for n in list(sys.modules) if "." not in n and n not in _EXAMINED]
    path = {os.path.abspath(p or os.curdir) for p in sys.path}
    for name in new:
        _EXAMINED.add(name)
        module = sys.modules.get(name)
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        if name == "__main__" or not isinstance(origin, str) or not origin.endswith(".py"):
            continue
        folder = os.path.dirname(os.path.abspath(origin))
        if (
            os.path.basename(origin) != "__init__.py"
            and folder not in path
            and not _importable(name)
        ):
            cloudpickle.register_pickle_by_value(module)


def share_as_file(obj: Any, folder: str) -> FileShared:
    """Pickle `obj` once into `folder`: workers on this machine load it from there."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{uuid.uuid4().hex}.pkl")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        cloudpickle.dump(obj, f, protocol=5)
    os.replace(tmp, path)
    return FileShared(path)


def dumps_task(task: Task) -> bytes:
    # cloudpickle: user functions are lambdas and closures from experiment files.
    try:
        return cloudpickle.dumps(task)
    except Exception as e:  # a bare "cannot pickle '_thread.lock' object" named no stage
        raise TypeError(
            f"{task.stage_name}: its functions cannot be sent to a worker ({type(e).__name__}: "
            f"{e}): one of them, or an object it refers to, holds a lock, an open file, a "
            "connection or a client; create that inside the function (once per worker: "
            "ZephyrContext.put / get_shared), or pass what it is made from"
        ) from e


def load_task(payload: bytes) -> Task | bytes:
    """Worker side: the task, or the bytes of a result saying why it could not be loaded."""
    try:
        return cloudpickle.loads(payload)
    except Exception as e:
        result = TaskResult(
            False,
            error_text=f"could not load the task in the worker: {type(e).__name__}: {e}",
            fatal=True,
        )
        return cloudpickle.dumps(result)


def run_loaded_task(task: Task) -> bytes:
    """Worker side: run a loaded task, result bytes out (never raises)."""
    result = run_task(task)
    try:
        return cloudpickle.dumps(result)
    except Exception as e:
        bad = TaskResult(
            False,
            error_text=f"{task.stage_name}, shard {task.shard_idx}: its "
            f"results cannot be pickled: {type(e).__name__}: {e}",
            fatal=True,
        )
        return cloudpickle.dumps(bad)


def run_task_bytes(payload: bytes) -> bytes:
    """Worker side: task bytes in, result bytes out (never raises)."""
    task = load_task(payload)
    if isinstance(task, bytes):
        return task
    return run_loaded_task(task)


def loads_result(payload: bytes) -> TaskResult:
    return cloudpickle.loads(payload)
