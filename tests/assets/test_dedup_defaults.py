"""The deduplicated(...) factory checks doubtful links exactly unless told not to."""

from __future__ import annotations

from assets import sample_corpus
from assets.dedup import deduplicated
from marin_dagster.execution.asset import step_for


def test_fuzzy_asset_verifies_by_default_and_can_opt_out():
    corpus = sample_corpus("raw/shakespeare-defaults")
    safe = deduplicated("dedup/shakespeare-defaults", source=corpus)
    fast = deduplicated("dedup/shakespeare-unverified", source=corpus, verify=False)
    assert step_for(safe).config.mode == "fuzzy"
    assert step_for(safe).config.verify is True
    assert step_for(fast).config.verify is False
    # verify decides the output, so it is part of the version: the two never share a path.
    assert step_for(safe).version != step_for(fast).version
