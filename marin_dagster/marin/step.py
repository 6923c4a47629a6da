"""Marin's step API: `ExecutorStep` and the references its config may hold.

An experiment file written for Marin builds `ExecutorStep(name, fn, config)`s whose config
(a dataclass, a pydantic model or a dict, nested as deep as it likes) holds:

    versioned(value)          a value that changes the output: it enters the version
    output_path_of(step, sub) another step's output (plus a sub-path): a dependency
    this_output_path(sub)     this step's own output folder
    InputName.hardcoded(path) a fixed path, versioned as written

Plain values do not enter the version (Marin's rule: a changed worker count must not rerun a
step). `lower` (marin_dagster.marin.lower) turns a step into a Dagster asset.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from marin_dagster.execution.asset import check_name
from marin_dagster.iris import ResourceConfig

T = TypeVar("T")
ConfigT = TypeVar("ConfigT")


@dataclasses.dataclass(frozen=True)
class VersionedValue(Generic[T]):
    """A config value that enters the step's version."""

    value: T


def versioned(value: T) -> VersionedValue[T]:
    return value if isinstance(value, VersionedValue) else VersionedValue(value)


ensure_versioned = versioned


def unwrap_versioned_value(value: Any) -> Any:
    return value.value if isinstance(value, VersionedValue) else value


def _join(base: str | None, name: str | None) -> str | None:
    if not base:
        return name
    return posixpath.join(base, name) if name else base


@dataclasses.dataclass(frozen=True)
class InputName:
    """Another step's output folder (`step`), or a sub-path of it (`name`).

    `step` is an `ExecutorStep` or a factory's asset; `None` with `name` set is a fixed path
    (`InputName.hardcoded`).
    """

    step: Any
    name: str | None = None

    def cd(self, name: str) -> InputName:
        return InputName(self.step, _join(self.name, name))

    @staticmethod
    def hardcoded(path: str) -> InputName:
        return InputName(None, path)


@dataclasses.dataclass(frozen=True)
class OutputName:
    """This step's own output folder, or a sub-path of it."""

    name: str | None = None


def output_path_of(step: Any, name: str | None = None) -> InputName:
    """`step`'s output folder (plus `name`): the step becomes a dependency of this one."""
    if isinstance(step, InputName):
        return step.cd(name) if name else step
    return InputName(step, name)


def this_output_path(name: str | None = None) -> OutputName:
    return OutputName(name)


# eq=False: steps are compared and hashed by identity, as Marin's graph is built by reference.
@dataclasses.dataclass(frozen=True, eq=False)
class ExecutorStep(Generic[ConfigT]):
    """One step of an experiment: `fn(config)` writes `{prefix}/{name}-{version}`.

    `fn` is an ordinary function of the instantiated config (references replaced by paths);
    it never sees Dagster. `resources` ("cpu", "gpu:h100x8", `ResourceConfig.with_gpu(...)`)
    places it; `pip_dependency_groups` names the extras of this package it needs, checked
    before it runs.
    """

    name: str
    fn: Callable[[ConfigT], Any]
    config: ConfigT
    description: str | None = None
    pip_dependency_groups: Sequence[str] | None = None
    resources: ResourceConfig | str | None = None

    def __post_init__(self) -> None:
        check_name(self.name)
        if not callable(self.fn):
            raise TypeError(
                f"ExecutorStep({self.name!r}): fn must be a function of the config, got "
                f"{type(self.fn).__name__}"
            )
        if self.resources is not None:
            ResourceConfig.parse(self.resources)  # a bad spec fails where the step is defined
        from assets.location import attach_caller

        attach_caller()

    def cd(self, name: str) -> InputName:
        return InputName(self, name)

    def as_input_name(self) -> InputName:
        return InputName(self)

    def as_asset(self) -> Any:
        """The Dagster asset this step lowers to (what factories call on a step they get)."""
        from marin_dagster.marin.lower import lower

        return lower(self)
