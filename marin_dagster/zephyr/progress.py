"""Progress: a tqdm bar per stage on a terminal, and a callback for everyone else.

The callback (ZephyrContext(progress=fn)) receives a ProgressEvent at each
stage start and each finished shard; ZephyrResource turns them into lines in
the Dagster run log.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ProgressEvent:
    stage_index: int
    num_stages: int
    stage_name: str
    completed: int
    total: int
    retries: int = 0

    @property
    def done(self) -> bool:
        return self.completed >= self.total

    def __str__(self) -> str:
        return f"{self.stage_name}: {self.completed}/{self.total} shards" + (
            f" ({self.retries} retried)" if self.retries else ""
        )


class StageProgress:
    def __init__(
        self,
        stage_index: int,
        num_stages: int,
        name: str,
        total: int,
        callback: Callable[[ProgressEvent], Any] | None,
        bar: bool | None = None,
    ):
        self.stage_index, self.num_stages, self.name, self.total = (
            stage_index,
            num_stages,
            name,
            total,
        )
        self.callback = callback
        self.completed = 0
        self.retries = 0
        self._bar = None
        show = sys.stderr.isatty() if bar is None else bar
        if show:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=f"zephyr {name}"[:60], unit="shard", leave=False)
        self._emit()

    def _emit(self) -> None:
        if self.callback is not None:
            self.callback(
                ProgressEvent(
                    self.stage_index,
                    self.num_stages,
                    self.name,
                    self.completed,
                    self.total,
                    self.retries,
                )
            )

    def shard_done(self) -> None:
        self.completed += 1
        if self._bar is not None:
            self._bar.update(1)
        self._emit()

    def retried(self) -> None:
        self.retries += 1

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
