"""Marin's step API: `ExecutorStep` and the references its config may hold.

An experiment file written for Marin builds `ExecutorStep(name, fn, config)`s whose config
(a dataclass, a pydantic model or a dict, nested as deep as it likes) holds:

    versioned(value)          a value that changes the output: it enters the version
    output_path_of(step, sub) another step's output (plus a sub-path): a dependency
    this_output_path(sub)     this step's own output folder
    InputName.hardcoded(path) a fixed path, versioned as written; relative: under the prefix

`ref / "sub"` is `ref` plus a sub-path; `ref.nonblocking()` is a dependency that does not
block (Marin's pseudo-dependency): its version enters this step's, but it is not run first.

Plain values do not enter the version (Marin's rule: a changed worker count must not rerun a
step). `lower` (marin_dagster.marin.lower) turns a step into a Dagster asset.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from marin_dagster.execution.asset import caller_frame, check_name
from marin_dagster.iris import ResourceConfig
from marin_dagster.words import checked_keywords

T = TypeVar("T")
ConfigT = TypeVar("ConfigT")


@dataclasses.dataclass(frozen=True)
class VersionedValue(Generic[T]):
    """A config value that enters the step's version."""

    value: T


def versioned(value: T) -> VersionedValue[T]:
    if isinstance(value, InputName | OutputName):
        # A reference is versioned already (its step's version enters this one's); wrapped,
        # it failed as "cannot version a value of type function", naming the step's fn.
        return value  # type: ignore[return-value]
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
    (`InputName.hardcoded`). `block_on_step=False` (`.nonblocking()`): the step's version
    enters this one's and its path is handed over, but it is neither run first nor waited
    for (e.g. to read a training run's checkpoints while it still runs). A step that other
    steps depend on normally, or that is listed to run, still runs.
    """

    step: Any
    name: str | None = None
    block_on_step: bool = True

    def cd(self, name: str) -> InputName:
        # Marin's cd drops block_on_step; kept here, so `ref.nonblocking() / "sub"` stays so.
        return dataclasses.replace(self, name=_join(self.name, name))

    def __truediv__(self, name: str) -> InputName:
        return self.cd(name)

    def nonblocking(self) -> InputName:
        return dataclasses.replace(self, block_on_step=False)

    @staticmethod
    def hardcoded(path: str) -> InputName:
        """A fixed path: a relative one is under the prefix (`{prefix}/{path}`), as in Marin."""
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
@checked_keywords
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
    override_output_path: str | None = None
    """Marin's fixed output folder: refused, as outputs here are found by name and version."""
    defined_at: str = dataclasses.field(default="", init=False, repr=False)
    """`file:line` of the experiment's code that built the step, for errors naming it."""

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.override_output_path is not None:
            # Skipping, resuming and `output_path_of` find an output at {name}-{version}; a
            # folder of the user's choosing would be found by none of them.
            raise TypeError(
                f"ExecutorStep({self.name!r}): override_output_path is not supported; outputs "
                "are {prefix}/{name}-{version}, which is how a rerun finds and skips them. "
                "Drop it, and read the output with output_path_of(step) (or `marin status`)"
            )
        # Here, not when the step is lowered: that happens in executor_main or in Dagster's
        # loading of the file, neither of which is where a clash must be fixed.
        frame = caller_frame()
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame else "<unknown>"
        object.__setattr__(self, "defined_at", where)
        if not callable(self.fn):
            raise TypeError(
                f"ExecutorStep({self.name!r}): fn must be a function of the config, got "
                f"{type(self.fn).__name__}"
            )
        if self.resources is not None:
            ResourceConfig.parse(self.resources)  # a bad spec fails where the step is defined
        if not _walkable(self.config):
            raise TypeError(
                f"ExecutorStep({self.name!r}) at {where}: config must be a dataclass (as in "
                "Marin), a pydantic model or a dict, not a "
                f"{type(self.config).__name__}: the executor cannot see into it, so its "
                "versioned(...) values would stay out of the version and its output paths "
                "would reach fn unresolved"
            )
        from assets.location import attach_caller

        attach_caller()

    def cd(self, name: str) -> InputName:
        return InputName(self, name)

    def __truediv__(self, name: str) -> InputName:
        return self.cd(name)

    def as_input_name(self) -> InputName:
        return InputName(self)

    def as_asset(self) -> Any:
        """The Dagster asset this step lowers to (what factories call on a step they get)."""
        from marin_dagster.marin.lower import lower

        return lower(self)


def _walkable(config: Any) -> bool:
    """Whether the executor can find a config's references and versioned values."""
    import pydantic

    if config is None or isinstance(config, str | bytes | int | float | bool):
        return True  # nothing inside to find
    if isinstance(config, Mapping | list | tuple | pydantic.BaseModel):
        return True
    if isinstance(config, VersionedValue | InputName | OutputName | ExecutorStep):
        return True  # a reference or versioned value on its own
    return dataclasses.is_dataclass(config) and not isinstance(config, type)
