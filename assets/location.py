"""Code locations: experiments -> `Definitions`, and any experiment file as a location.

`build_definitions` makes the default location (marin_dagster/definitions.py) of every
experiment under assets/experiments. A user's own file, written with the factories or with
Marin's `ExecutorStep`s and no Dagster code, is a location too (`dagster dev -f exp.py`):
the first factory or step it calls attaches a lazy loader to the file's module
(`attach_caller`), which Dagster's module discovery picks first and which builds the
location from what the module holds once it has finished importing.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import dagster as dg
from dagster.components.definitions import LazyDefinitions

from assets.experiment import Experiment
from marin_dagster.execution.asset import (
    DuplicateAssetError,
    Step,
    caller_frame,
    check_op_names,
    upstream_closure,
)

LOADER = "marin_definitions"


def build_definitions(experiments: list[Experiment]) -> dg.Definitions:
    from assets.sensors import sensors_for
    from resources import local_resources

    # An asset shared by experiments shows in the group of the first that lists it.
    asset_defs: dict[dg.AssetKey, dg.AssetsDefinition] = {}
    # By name, as upstream_closure: two kinds of step named alike have different keys.
    owners: dict[str, tuple[Step, str]] = {}
    for experiment in experiments:
        for step in upstream_closure(experiment.leaves):
            key = step.asset.key
            if step.name in owners:
                first, first_experiment = owners[step.name]
                if first.version != step.version:
                    raise DuplicateAssetError(
                        first, step, f" (experiments {first_experiment!r} and {experiment.name!r})"
                    )
                continue
            owners[step.name] = (step, experiment.name)
            asset_defs[key] = step.asset.with_attributes(group_names_by_key={key: experiment.name})
    check_op_names(step for step, _ in owners.values())
    resources = local_resources()
    return dg.Definitions(
        assets=list(asset_defs.values()),
        jobs=[experiment.job() for experiment in experiments],
        sensors=sensors_for(experiments),
        resources=resources,
        # CPU steps run as local subprocesses; accelerator steps go to the Iris launcher.
        executor=resources["iris"].executor(),
    )


def _members(namespace: Mapping[str, Any]) -> Iterator[Any]:
    for name, value in list(namespace.items()):
        if name.startswith("__"):
            continue
        # Exact types: Dagster's records are tuples that refuse iteration.
        if type(value) in (list, tuple):
            yield from value
        elif type(value) is dict:
            yield from value.values()
        else:
            yield value


def _is_step(value: Any) -> bool:
    from marin_dagster.execution.asset import is_registered
    from marin_dagster.marin.step import ExecutorStep

    return isinstance(value, ExecutorStep) or (
        isinstance(value, dg.AssetsDefinition) and is_registered(value)
    )


def module_definitions(namespace: Mapping[str, Any]) -> dg.Definitions | dg.RepositoryDefinition:
    """The location of a module: its own `Definitions` if it has one, else one job of its
    `Experiment`s, or else one experiment named after the file of every step it holds."""
    own = [v for v in namespace.values() if isinstance(v, dg.Definitions | dg.RepositoryDefinition)]
    if len(own) > 1:
        raise dg.DagsterInvariantViolationError(
            f"{namespace.get('__file__')}: more than one Definitions at module scope"
        )
    if own:
        return own[0]
    return build_definitions(module_experiments(namespace))


def module_experiments(namespace: Mapping[str, Any]) -> list[Experiment]:
    """A module's `Experiment`s, or else one experiment named after the file of every step it
    holds (factories' assets and Marin `ExecutorStep`s at module scope)."""
    experiments = [v for v in namespace.values() if isinstance(v, Experiment)]
    if experiments:
        return experiments
    from marin_dagster.marin.lower import lower

    leaves = {id(a): a for a in (lower(v) for v in _members(namespace) if _is_step(v))}
    if not leaves:
        raise dg.DagsterInvariantViolationError(
            f"{namespace.get('__file__')}: no steps at module scope; assign the steps "
            "(or a list of them) to module-level names"
        )
    return [Experiment(experiment_name(namespace), leaves=list(leaves.values()))]


def experiment_name(namespace: Mapping[str, Any]) -> str:
    """The file's stem (`my_exp.py` -> `my_exp`, so its job is `my_exp_job`)."""
    stem = str(namespace.get("__file__") or namespace.get("__name__") or "steps")
    stem = re.split(r"[/\\]", stem)[-1].removesuffix(".py").split(".")[-1]
    return re.sub(r"\W", "_", stem) or "steps"


# Each loader made here, by id, and the module it loads: `from exp import *` copies exp's
# loader into another experiment file, which Dagster then loaded as exp (its own steps and
# experiments missing from `dagster job list -f`).
_LOADERS: dict[int, str] = {}


def attach_caller() -> None:
    """Give the module that is defining steps a loader Dagster's discovery picks first."""
    frame = caller_frame()
    if frame is None:
        return
    namespace = frame.f_globals
    name = namespace.get("__name__")
    if not name:
        return
    lazy = [v for v in namespace.values() if isinstance(v, LazyDefinitions)]
    if any(_LOADERS.get(id(v)) == name for v in lazy):
        return  # attached already
    if any(id(v) not in _LOADERS for v in lazy):
        return  # the module loads itself (@dg.definitions)
    if name not in sys.modules:
        return  # exec'd code, not a module Dagster could load

    def load() -> dg.Definitions | dg.RepositoryDefinition:
        return module_definitions(namespace)

    loader = dg.definitions(load)
    _LOADERS[id(loader)] = name
    namespace[LOADER] = loader  # in place of one imported with another module's steps
