"""The code location: every experiment's assets, one job per experiment, local resources."""

from __future__ import annotations

import importlib
import pkgutil

import dagster as dg

import assets.experiments
from assets.experiment import Experiment
from assets.sensors import sensors_for
from marin_dagster.execution.asset import DuplicateAssetError, Step, upstream_closure
from resources import local_resources


def load_experiments() -> list[Experiment]:
    experiments = []
    for module_info in sorted(
        pkgutil.iter_modules(assets.experiments.__path__), key=lambda m: m.name
    ):
        module = importlib.import_module(f"assets.experiments.{module_info.name}")
        experiments.extend(v for v in vars(module).values() if isinstance(v, Experiment))
    names = [e.name for e in experiments]
    if len(set(names)) != len(names):
        raise ValueError(f"two experiments share a name: {sorted(names)}")
    return experiments


def build_definitions(experiments: list[Experiment]) -> dg.Definitions:
    # An asset shared by experiments shows in the group of the first that lists it.
    asset_defs: dict[dg.AssetKey, dg.AssetsDefinition] = {}
    owners: dict[dg.AssetKey, tuple[Step, str]] = {}
    for experiment in experiments:
        for step in upstream_closure(experiment.leaves):
            key = step.asset.key
            if key in owners:
                first, first_experiment = owners[key]
                if first.version != step.version:
                    raise DuplicateAssetError(
                        first, step, f" (experiments {first_experiment!r} and {experiment.name!r})"
                    )
                continue
            owners[key] = (step, experiment.name)
            asset_defs[key] = step.asset.with_attributes(group_names_by_key={key: experiment.name})
    resources = local_resources()
    return dg.Definitions(
        assets=list(asset_defs.values()),
        jobs=[experiment.job() for experiment in experiments],
        sensors=sensors_for(experiments),
        resources=resources,
        # CPU steps run as local subprocesses; accelerator steps go to the Iris launcher.
        executor=resources["iris"].executor(),
    )


defs = build_definitions(load_experiments())
