"""Counters: built-in pipeline statistics plus user counters from inside user functions.

Inside any function Zephyr runs (map, filter, map_shard, reducers, ...)::

    from marin_dagster.zephyr import counters
    counters.increment("documents_kept")
    counters.increment("bytes_seen", len(text))

Each task keeps its own totals; the driver aggregates the totals of the tasks
that succeeded (a retried task counts once) into `Counters`: the sum, and the
max, min and mean over tasks. Outside a Zephyr task the calls do nothing.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

BUILTIN_COUNTERS = (
    "records_in",
    "records_out",
    "records_written",
    "bytes_written",
    "partitions_skipped",
    "shards",
    "stages",
    "spills",
)

_task_counters: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
    "zephyr_task_counters", default=None
)


def increment(name: str, value: int | float = 1) -> None:
    """Add `value` to the counter `name` of the running task (no-op outside a task)."""
    current = _task_counters.get()
    if current is None:
        return
    if name in BUILTIN_COUNTERS:
        raise ValueError(f"{name!r} is a built-in Zephyr counter; pick another name")
    current[name] = current.get(name, 0) + value


def get_counters() -> dict[str, float]:
    """A snapshot of the running task's user counters ({} outside a task)."""
    current = _task_counters.get()
    return dict(current) if current is not None else {}


def start_task() -> tuple[dict[str, float], contextvars.Token]:
    values: dict[str, float] = {}
    return values, _task_counters.set(values)


def end_task(token: contextvars.Token) -> None:
    _task_counters.reset(token)


@dataclass(frozen=True)
class CounterStats:
    """A user counter over the tasks that reported it."""

    sum: float
    max: float
    min: float
    mean: float
    tasks: int


class Counters(Mapping[str, float]):
    """Aggregated counters: built-ins and user counters (sum) by name; `stats(name)` for more."""

    def __init__(self) -> None:
        self.builtin: dict[str, int] = dict.fromkeys(BUILTIN_COUNTERS, 0)
        self._user: dict[str, list[float]] = {}

    def add_task(self, builtin: Mapping[str, int], user: Mapping[str, float]) -> None:
        for k, v in builtin.items():
            self.builtin[k] = self.builtin.get(k, 0) + v
        for k, v in user.items():
            self._user.setdefault(k, []).append(v)

    def merge(self, other: Counters) -> None:
        """Add `other`'s counts to these (the built-ins summed, the user counters' tasks
        appended): the totals of several runs."""
        for k, v in other.builtin.items():
            self.builtin[k] = self.builtin.get(k, 0) + v
        for k, values in other._user.items():
            self._user.setdefault(k, []).extend(values)

    def stats(self, name: str) -> CounterStats:
        values = self._user.get(name)
        if not values:
            raise KeyError(f"no user counter {name!r}; known: {sorted(self._user)}")
        return CounterStats(
            sum(values), max(values), min(values), sum(values) / len(values), len(values)
        )

    @property
    def user(self) -> dict[str, CounterStats]:
        return {k: self.stats(k) for k in sorted(self._user)}

    def __getitem__(self, name: str) -> float:
        if name in self.builtin:
            return self.builtin[name]
        if name in self._user:
            return sum(self._user[name])
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        yield from self.builtin
        yield from (k for k in sorted(self._user) if k not in self.builtin)

    def __len__(self) -> int:
        return len(set(self.builtin) | set(self._user))

    def as_dict(self) -> dict[str, float]:
        """Flat name -> number, e.g. for asset metadata: built-ins, and for each user
        counter `name` (sum), `name/max`, `name/min`, `name/mean`."""
        out: dict[str, float] = dict(self.builtin)
        for name, s in self.user.items():
            out[name] = s.sum
            out[f"{name}/max"] = s.max
            out[f"{name}/min"] = s.min
            out[f"{name}/mean"] = s.mean
        return out

    def __repr__(self) -> str:
        return f"Counters({self.as_dict()})"
