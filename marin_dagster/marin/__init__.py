"""Marin's step API on Dagster: experiment files written for Marin run here as written.

    from marin_dagster.marin import ExecutorStep, executor_main, output_path_of, this_output_path, versioned

Each `ExecutorStep` (and each asset of the project's factories) is a Dagster asset with
Marin's version and skip; the file is a script (`python exp.py`) and a code location
(`dagster dev -f exp.py`, `dagster job execute -f exp.py -j exp_job`).
"""

from marin_dagster.iris import ResourceConfig
from marin_dagster.marin.lower import instantiate, lower
from marin_dagster.marin.runner import ExecutorMainConfig, StepRunner, executor_main
from marin_dagster.marin.step import (
    ExecutorStep,
    InputName,
    OutputName,
    VersionedValue,
    ensure_versioned,
    output_path_of,
    this_output_path,
    unwrap_versioned_value,
    versioned,
)

__all__ = [
    "ExecutorMainConfig",
    "ExecutorStep",
    "InputName",
    "OutputName",
    "ResourceConfig",
    "StepRunner",
    "VersionedValue",
    "ensure_versioned",
    "executor_main",
    "instantiate",
    "lower",
    "output_path_of",
    "this_output_path",
    "unwrap_versioned_value",
    "versioned",
]
