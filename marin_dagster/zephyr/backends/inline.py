"""Tasks run one at a time in the driver process: for debugging and tiny inputs."""

from __future__ import annotations

import uuid
from typing import Any

from marin_dagster.zephyr.backends.base import WorkerLost
from marin_dagster.zephyr.resources import TaskResources
from marin_dagster.zephyr.runtime import Task, TaskResult, run_task
from marin_dagster.zephyr.shared import InlineShared


class InlineBackend:
    capacity = 1

    def __init__(self) -> None:
        self._done: list[tuple[Any, TaskResult | WorkerLost]] = []

    def share(self, obj: Any, folder: str) -> Any:
        return InlineShared(uuid.uuid4().hex, obj)

    def submit(self, key: Any, task: Task, resources: TaskResources | None = None) -> None:
        self._done.append((key, run_task(task)))

    def poll(self, timeout: float) -> list[tuple[Any, TaskResult | WorkerLost]]:
        done, self._done = self._done, []
        return done

    def shutdown(self) -> None:
        self._done = []
