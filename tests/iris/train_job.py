"""A job of the tiny training experiment on the Iris executor, for the preemption test.

Step processes re-import the job, so it lives in a module; where outputs go comes from
MARIN_PREFIX and the sdist from MARIN_TEST_DOWNLOADS.
"""

from __future__ import annotations

import os

import dagster as dg

from marin_dagster.iris.executor import iris_executor

TRAIN_STEPS = 40
CHECKPOINT_EVERY = 5


def assets() -> list[dg.AssetsDefinition]:
    from tests.assets.test_train_assets import build

    return build(steps=TRAIN_STEPS, checkpoint_every_steps=CHECKPOINT_EVERY)[:4]


def train_job() -> dg.JobDefinition:
    from tests.assets.test_train_assets import _resources

    selected = assets()
    return dg.Definitions(
        assets=selected,
        resources=_resources(os.environ["MARIN_PREFIX"], os.environ["MARIN_TEST_DOWNLOADS"]),
        jobs=[dg.define_asset_job("train_job", selection=[a.key for a in selected])],
        executor=iris_executor,
    ).resolve_job_def("train_job")
