"""The contract between the driver and a backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import cloudpickle

from marin_dagster.zephyr.runtime import Task, TaskResult, run_task


@dataclass
class WorkerLost:
    """The process running a task died (killed, out of memory) before it answered."""

    reason: str


class Backend(Protocol):
    capacity: int

    def submit(self, key: Any, task: Task, resources: dict[str, Any]) -> None:
        """Start `task`; its outcome comes back from poll() under `key`."""

    def poll(self, timeout: float) -> list[tuple[Any, TaskResult | WorkerLost]]:
        """Outcomes of finished tasks (waits up to `timeout` seconds for the first)."""

    def shutdown(self) -> None: ...


def dumps_task(task: Task) -> bytes:
    # cloudpickle: user functions are lambdas and closures from experiment files.
    return cloudpickle.dumps(task)


def run_task_bytes(payload: bytes) -> bytes:
    """Worker side: task bytes in, result bytes out (never raises)."""
    try:
        task = cloudpickle.loads(payload)
    except Exception as e:
        result = TaskResult(
            False,
            error_text=f"could not load the task in the worker: {type(e).__name__}: {e}",
            fatal=True,
        )
        return cloudpickle.dumps(result)
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


def loads_result(payload: bytes) -> TaskResult:
    return cloudpickle.loads(payload)
