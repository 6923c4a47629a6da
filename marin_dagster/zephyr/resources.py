"""What one task of a stage needs: CPUs, memory, GPUs (and Ray custom resources).

Written three ways, wherever Zephyr takes resources (`ZephyrContext(stage_resources=...)`
values, and `resources=` on an operation):

    {"num_cpus": 2, "memory": "4g"}       a dict (Ray's names; cpu/ram/gpu also accepted)
    "cpu:2,memory:4g"                     a hint string: comma-separated key:value
    ResourceConfig(cpu=2, ram="4g")       Iris's request (or its string, "gpu:h100x8 ram=16g")

The local backend runs as many tasks at once as the CPUs allow (max_workers // cpus),
pins each task's worker to that many cores, and kills a worker whose resident memory goes
over the task's limit (the task fails with an error saying so and is retried on a fresh
worker). Ray gets num_cpus, memory (bytes), num_gpus and custom resources (TPU chips).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace
from typing import Any

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}
_CPU_KEYS = ("num_cpus", "cpus", "cpu")
_MEMORY_KEYS = ("memory", "ram", "mem")
_GPU_KEYS = ("num_gpus", "gpus", "gpu")
_KNOWN = (*_CPU_KEYS, *_MEMORY_KEYS, *_GPU_KEYS, "resources")


def _size(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{where}: memory={value!r} is not a size")
    if isinstance(value, int | float):
        n = int(value)
    else:
        m = _SIZE.match(str(value))
        if not m:
            raise ValueError(
                f"{where}: memory={value!r} is not a size; write bytes or e.g. 512m, 4g, 1.5g"
            )
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ValueError(f"{where}: memory must be positive, got {value!r}")
    return n


def _number(value: Any, where: str, what: str) -> float:
    try:
        n = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {what}={value!r} is not a number") from None
    if not math.isfinite(n) or n < 0 or (what == "cpu" and n == 0):
        raise ValueError(f"{where}: {what}={value!r} must be a positive number")
    return int(n) if n.is_integer() else n


@dataclass(frozen=True)
class TaskResources:
    """One task's request; None leaves a field to the backend's default."""

    cpus: float | None = None
    memory: int | None = None  # bytes
    gpus: float | None = None
    custom: tuple[tuple[str, float], ...] = ()  # Ray custom resources, e.g. (("TPU", 8),)

    @staticmethod
    def parse(value: Any, where: str = "resources") -> TaskResources:
        """A dict, a "cpu:2,memory:4g" string, a ResourceConfig (or its string), or None."""
        if value is None:
            return TaskResources()
        if isinstance(value, TaskResources):
            return value
        if isinstance(value, dict):
            return TaskResources._from_dict(value, where)
        if isinstance(value, str):
            return TaskResources._from_string(value, where)
        if hasattr(value, "ram_bytes") and hasattr(value, "device"):
            return TaskResources._from_resource_config(value)
        raise TypeError(
            f"{where}: expected a dict, a string like 'cpu:2,memory:4g' or a ResourceConfig, "
            f"got {type(value).__name__}"
        )

    @staticmethod
    def _from_dict(d: dict[str, Any], where: str) -> TaskResources:
        unknown = [k for k in d if k not in _KNOWN]
        if unknown:
            raise ValueError(
                f"{where}: unknown resource {unknown[0]!r}; use num_cpus (cpu), memory (ram), "
                "num_gpus (gpu) or resources={name: amount}"
            )
        out = TaskResources()
        for k, v in d.items():
            if k in _CPU_KEYS:
                out = replace(out, cpus=_number(v, where, "cpu"))
            elif k in _MEMORY_KEYS:
                out = replace(out, memory=_size(v, where))
            elif k in _GPU_KEYS:
                out = replace(out, gpus=_number(v, where, "gpu"))
            else:
                if not isinstance(v, dict):
                    raise ValueError(f"{where}: resources= must be a dict of name: amount")
                custom = tuple(sorted((str(n), _number(a, where, str(n))) for n, a in v.items()))
                out = replace(out, custom=custom)
        return out

    @staticmethod
    def _from_string(text: str, where: str) -> TaskResources:
        pairs: dict[str, str] = {}
        hint_error = None
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, raw = part.partition(":") if ":" in part else part.partition("=")
            key = key.strip().lower()
            if not sep or key not in (*_CPU_KEYS, *_MEMORY_KEYS, *_GPU_KEYS):
                hint_error = f"{part!r} is not cpu:N, memory:SIZE or gpu:N"
                break
            pairs[key] = raw.strip()
        if not pairs and hint_error is None:
            hint_error = "it is empty"
        if hint_error is None:
            try:
                return TaskResources._from_dict(pairs, where)
            except ValueError as e:
                hint_error = str(e)
        # Not the hint grammar: Iris's own strings ("gpu:h100x8 ram=16g", "tpu:v5e-8").
        from marin_dagster.iris.resource_config import ResourceConfig, ResourceConfigError

        try:
            return TaskResources._from_resource_config(ResourceConfig.parse(text))
        except ResourceConfigError as e:
            raise ValueError(
                f"{where}: {text!r} is neither a resource hint like 'cpu:2,memory:4g' "
                f"({hint_error}) nor a ResourceConfig string ({e})"
            ) from None

    @staticmethod
    def _from_resource_config(rc: Any) -> TaskResources:
        device = rc.device
        gpus = None
        custom: tuple[tuple[str, float], ...] = ()
        if device.kind == "gpu":
            gpus = device.count
        elif device.kind == "tpu":
            custom = (("TPU", device.chips_per_host),)
        return TaskResources(rc.cpu, rc.ram_bytes, gpus, custom)

    def override(self, other: TaskResources) -> TaskResources:
        """`other`'s fields where it sets them, else ours."""
        return TaskResources(
            other.cpus if other.cpus is not None else self.cpus,
            other.memory if other.memory is not None else self.memory,
            other.gpus if other.gpus is not None else self.gpus,
            other.custom or self.custom,
        )

    def union(self, other: TaskResources) -> TaskResources:
        """The larger of each field: one task running two fused operations needs both."""

        def bigger(a: Any, b: Any) -> Any:
            return b if a is None else a if b is None else max(a, b)

        custom = dict(self.custom)
        for name, amount in other.custom:
            custom[name] = max(custom.get(name, 0), amount)
        return TaskResources(
            bigger(self.cpus, other.cpus),
            bigger(self.memory, other.memory),
            bigger(self.gpus, other.gpus),
            tuple(sorted(custom.items())),
        )

    @property
    def cpu_slots(self) -> int:
        """Whole cores one task occupies (at least one)."""
        return max(1, math.ceil(self.cpus)) if self.cpus is not None else 1

    def ray_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": self.cpus if self.cpus is not None else 1}
        if self.memory is not None:
            options["memory"] = self.memory
        if self.gpus:
            options["num_gpus"] = self.gpus
        if self.custom:
            options["resources"] = dict(self.custom)
        return options

    def __str__(self) -> str:
        parts = []
        if self.cpus is not None:
            parts.append(f"cpu:{self.cpus}")
        if self.memory is not None:
            parts.append(f"memory:{format_bytes(self.memory)}")
        if self.gpus is not None:
            parts.append(f"gpu:{self.gpus}")
        parts += [f"{n}:{a}" for n, a in self.custom]
        return ",".join(parts) or "default"


def machine_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def format_bytes(n: float) -> str:
    for suffix, unit in (("g", 2**30), ("m", 2**20), ("k", 2**10)):
        if n >= unit:
            value = n / unit
            return f"{value:.0f}{suffix}" if value.is_integer() else f"{value:.1f}{suffix}"
    return f"{int(n)}"
