"""The code location: every experiment's assets, one job per experiment, local resources."""

from __future__ import annotations

import importlib
import pkgutil

import assets.experiments
from assets.experiment import Experiment
from assets.location import build_definitions


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


defs = build_definitions(load_experiments())
