"""How an `ExecutorStep` becomes a Dagster asset.

The step's version is Marin's: a hash of its name, the `versioned(...)` values of its config
(by their path in the config, e.g. `train.lr`), its references to other steps (`DEP[name]`
and the sub-path) and those steps' versions. Everything else in the config is free to change.
Each referenced step becomes an upstream asset, so lineage in the UI is the config's
references; a `.nonblocking()` one does not (it is neither run first nor waited for), but
its version enters the step's, under `pseudo_dependencies` as in Marin. When the asset runs, the config is instantiated (references replaced by paths,
`versioned` unwrapped) and handed to `fn`; `.executor_info` beside the output records what ran.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

import dagster as dg
import pydantic
from packaging.requirements import InvalidRequirement, Requirement

from marin_dagster import fs
from marin_dagster.execution.asset import (
    Step,
    StepContext,
    claim_name,
    register_step,
    step_for,
    versioned_asset,
)
from marin_dagster.execution.status import EXECUTOR_INFO_FILE
from marin_dagster.execution.version import canonical
from marin_dagster.marin.step import ExecutorStep, InputName, OutputName, VersionedValue

KIND = "executor_step"
PACKAGE = "marin-dagster"

# Keyed by id(step); the step is kept alive with its asset so an id is never reused.
_LOWERED: dict[int, tuple[ExecutorStep, dg.AssetsDefinition]] = {}
# The steps being lowered, outermost first: one met again is a cycle of references.
_LOWERING: list[ExecutorStep] = []


class StepCycleError(ValueError):
    """Steps whose configs refer to each other's outputs, in a loop."""


def lower(step: Any) -> dg.AssetsDefinition:
    """The asset of an `ExecutorStep` (built once per step), or a factory's asset itself."""
    if isinstance(step, dg.AssetsDefinition):
        step_for(step)  # not a factory's asset: say so here, not when it runs
        return step
    if isinstance(step, InputName) and step.step is not None and step.block_on_step:
        step = step.step  # Marin runs the step of `output_path_of(step, ...)` given as a step
    if isinstance(step, dg.AssetsDefinition):
        return lower(step)
    if isinstance(step, ExecutorStep):
        known = _LOWERED.get(id(step))
        if known is None:
            if any(s is step for s in _LOWERING):
                cycle = [*_LOWERING[next(i for i, s in enumerate(_LOWERING) if s is step) :], step]
                raise StepCycleError(
                    "ExecutorSteps that need each other: "
                    + " -> ".join(f"{s.name} (at {s.defined_at})" for s in cycle)
                    + "; a step can only read outputs of steps that do not read its own"
                )
            _LOWERING.append(step)
            try:
                asset = _lower(step)
            finally:
                _LOWERING.pop()
            # Errors about the step (a name defined twice) point at the ExecutorStep(...) call.
            register_step(dataclasses.replace(step_for(asset), defined_at=step.defined_at))
            known = _LOWERED[id(step)] = (step, asset)
        return known[1]
    raise TypeError(
        f"cannot run {type(step).__name__} {step!r} as a step: give an ExecutorStep or an "
        "asset made by a factory (tokenized, train_lm, ...)"
    )


def _walk(value: Any, path: str, visit: Any) -> None:
    """Call `visit(path, leaf)` for each reference or versioned value in a config."""
    if isinstance(value, VersionedValue | InputName | OutputName):
        visit(path, value)
    elif isinstance(value, ExecutorStep | dg.AssetsDefinition):
        visit(path, InputName(value))  # a bare step in a config means its output folder
    elif isinstance(value, pydantic.BaseModel):
        for name in type(value).model_fields:
            _walk(getattr(value, name), f"{path}.{name}" if path else name, visit)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _walk(getattr(value, f.name), f"{path}.{f.name}" if path else f.name, visit)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _walk(v, f"{path}.{k}" if path else str(k), visit)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _walk(v, f"{path}[{i}]", visit)


def _lower(step: ExecutorStep) -> dg.AssetsDefinition:
    upstream: dict[str, dg.AssetsDefinition] = {}
    nonblocking: dict[str, Step] = {}
    version: dict[str, Any] = {}
    # References go by name (outputs do): two steps of one name would be one input.
    referenced: dict[str, Step] = {}

    def visit(path: str, leaf: Any) -> None:
        if isinstance(leaf, VersionedValue):
            try:
                version[path] = canonical(leaf.value)
            except TypeError as e:
                raise TypeError(
                    f"ExecutorStep({step.name!r}) at {step.defined_at}: versioned {path}: {e}"
                ) from None
        elif isinstance(leaf, InputName):
            if leaf.step is None:
                version[path] = leaf.name
                return
            dep = _upstream_asset(step, path, leaf.step)
            claim_name(referenced, step_for(dep))
            role = step_for(dep).name
            if leaf.block_on_step:
                upstream[role] = dep
            else:
                nonblocking[role] = step_for(dep)
            version[path] = f"DEP[{role}]" + (f"/{leaf.name}" if leaf.name else "")

    _walk(step.config, "", visit)
    version_config: dict[str, Any] = {"name": step.name, "config": version}
    if nonblocking:  # absent otherwise, so steps without any keep their versions
        version_config["pseudo_dependencies"] = {r: s.version for r, s in nonblocking.items()}
    return versioned_asset(
        name=step.name,
        kind=KIND,
        config=version_config,
        run=_runner(step, nonblocking),
        upstream=upstream,
        description=step.description or f"{_qualname(step.fn)}(config)",
        resources=step.resources or "cpu",
        kinds=("python",),
    )


def _upstream_asset(step: ExecutorStep, path: str, target: Any) -> dg.AssetsDefinition:
    if isinstance(target, ExecutorStep | dg.AssetsDefinition):
        try:
            return lower(target)
        except StepCycleError:
            raise  # it names every step of the loop already
        except ValueError as e:
            raise ValueError(f"ExecutorStep({step.name!r}): {path}: {e}") from None
    raise TypeError(
        f"ExecutorStep({step.name!r}): {path} refers to a {type(target).__name__}; "
        "output_path_of takes an ExecutorStep or an asset made by a factory"
    )


def _remote(fn: Any) -> Any:
    """The `.remote` of a `@ray.remote` function, None for a plain one."""
    return getattr(fn, "remote", None) if type(fn).__module__.startswith("ray.") else None


def _call(fn: Any, config: Any) -> Any:
    """`fn(config)`; a `@ray.remote` function runs as a Ray task, waited for, as Marin runs it
    (called directly, Ray refuses: "Remote functions cannot be called directly")."""
    remote = _remote(fn)
    if remote is None:
        return fn(config)
    import ray

    return ray.get(remote(config))


def _qualname(fn: Any) -> str:
    fn = getattr(fn, "_function", fn) if _remote(fn) else fn  # the function Ray wraps
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _under_prefix(prefix: str, path: str) -> str:
    """Marin's rule for a hardcoded path: one with no scheme and no leading '/' is relative
    to the prefix, so the same file reads the same data wherever the prefix is."""
    if urlparse(path).scheme or path.startswith("/"):
        return path
    return fs.join(prefix, path)


def instantiate(value: Any, inputs: Mapping[str, str], output_path: str, prefix: str) -> Any:
    """`value` with every reference replaced by its path and every `versioned` unwrapped.

    `inputs` maps each referenced step's name to its output folder; a relative
    `InputName.hardcoded` path is put under `prefix`.
    """

    def sub(v: Any) -> Any:
        return instantiate(v, inputs, output_path, prefix)

    if isinstance(value, VersionedValue):
        return sub(value.value)
    if isinstance(value, ExecutorStep | dg.AssetsDefinition):
        value = InputName(value)
    if isinstance(value, InputName):
        if value.step is None:
            return _under_prefix(prefix, value.name)
        base = inputs[step_for(lower(value.step)).name]
        return fs.join(base, value.name) if value.name else base
    if isinstance(value, OutputName):
        return fs.join(output_path, value.name) if value.name else output_path
    if isinstance(value, pydantic.BaseModel):
        return value.model_copy(
            update={n: sub(getattr(value, n)) for n in type(value).model_fields}
        )
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: sub(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    if isinstance(value, Mapping):
        items = {k: sub(v) for k, v in value.items()}
        try:
            return type(value)(items)  # type: ignore[call-arg]
        except TypeError:  # a mapping type that is not built from a dict (defaultdict, ...)
            return items
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple
        return type(value)(*(sub(v) for v in value))
    if isinstance(value, list | tuple):
        return type(value)(sub(v) for v in value)
    return value


def _requirements_of(group: str) -> list[str] | None:
    """The requirement names of this package's extra `group`, None if it has no such extra."""
    meta = importlib.metadata.metadata(PACKAGE)
    if group not in (meta.get_all("Provides-Extra") or []):
        return None
    names = []
    for req in importlib.metadata.requires(PACKAGE) or []:
        spec, _, marker = req.partition(";")
        if re.search(rf"""extra\s*==\s*["']{re.escape(group)}["']""", marker):
            names.append(re.split(r"[\s\[<>=!~;(]", spec.strip(), maxsplit=1)[0])
    return names


def check_dependency_groups(name: str, groups: Any) -> None:
    """Fail before `fn` runs when an extra the step names is unknown or not installed.

    Marin installs a step's groups into its Ray worker; here steps run in this environment,
    so a missing one is named with the command that installs it.
    """
    for group in groups or ():
        required = _requirements_of(group)
        if required is None:
            # Not an extra: a package, as Marin also takes ("lm-eval>=0.4").
            try:
                package = Requirement(group).name
            except InvalidRequirement:
                known = importlib.metadata.metadata(PACKAGE).get_all("Provides-Extra") or []
                raise dg.Failure(
                    f"step {name}: pip dependency group {group!r} is neither an extra of "
                    f"{PACKAGE} (extras: {', '.join(known) or 'none'}) nor a pip requirement; "
                    "fix it or drop it from pip_dependency_groups"
                ) from None
            try:
                importlib.metadata.version(package)
            except importlib.metadata.PackageNotFoundError:
                raise dg.Failure(
                    f"step {name}: pip dependency {group!r} is not installed here (steps run "
                    f"in this environment); run `pip install '{group}'` and rerun"
                ) from None
            continue
        missing = []
        for requirement in required:
            try:
                importlib.metadata.version(requirement)
            except importlib.metadata.PackageNotFoundError:
                missing.append(requirement)
        if missing:
            raise dg.Failure(
                f"step {name}: pip dependency group {group!r} needs {', '.join(missing)}, not "
                f"installed here; run `pip install -e '.[{group}]'` and rerun"
            )


def _runner(step: ExecutorStep, nonblocking: Mapping[str, Step]) -> Any:
    def run(
        version_config: Mapping[str, Any],
        inputs: Mapping[str, str],
        output_path: str,
        context: StepContext,
    ) -> dict[str, Any]:
        check_dependency_groups(step.name, step.pip_dependency_groups)
        storage = context.resources.storage
        # Where a nonblocking dependency writes, whether it has run or not (Marin's rule).
        pseudo = {r: storage.output_path(s.name, s.version) for r, s in nonblocking.items()}
        config = instantiate(step.config, {**pseudo, **inputs}, output_path, storage.root)
        fs.write_json(
            fs.join(output_path, EXECUTOR_INFO_FILE),
            {
                "name": step.name,
                "fn": _qualname(step.fn),
                "version": context.version,
                "versioned": version_config["config"],
                "dependencies": dict(sorted(inputs.items())),
                "pseudo_dependencies": dict(sorted(pseudo.items())),
                "config": _describe(config),
                "description": step.description,
                "pip_dependency_groups": list(step.pip_dependency_groups or []),
            },
        )
        context.log.info(f"{step.name}: {_qualname(step.fn)}(config) -> {output_path}")
        _call(step.fn, config)
        return {"fn": _qualname(step.fn), "dependencies": len(inputs)}

    return run


def _describe(value: Any) -> Any:
    """The instantiated config as JSON, for `.executor_info`; unknown objects by their repr."""
    try:
        return canonical(value)
    except TypeError:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: _describe(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, Mapping):
            return {str(k): _describe(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [_describe(v) for v in value]
        return repr(value)
