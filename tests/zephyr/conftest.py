"""Zephyr fixtures: one long-lived local context (worker processes are reused), and a Ray
context on the session's local Ray cluster (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import cloudpickle
import pytest

import tests
from marin_dagster.zephyr import ZephyrContext

# Functions defined in test modules travel by value, so Ray workers need not import tests/.
cloudpickle.register_pickle_by_value(tests)


@pytest.fixture(scope="session")
def local_ctx() -> Iterator[ZephyrContext]:
    with ZephyrContext(max_workers=2, backend="local") as ctx:
        yield ctx


@pytest.fixture(scope="session")
def ray_ctx(ray_cluster: None) -> Iterator[ZephyrContext]:
    with ZephyrContext(max_workers=2, backend="ray") as ctx:
        yield ctx


@pytest.fixture(params=["local", "ray"])
def any_ctx(request: pytest.FixtureRequest) -> ZephyrContext:
    """The same test on both backends."""
    return request.getfixturevalue(f"{request.param}_ctx")
