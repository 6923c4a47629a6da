"""deduplicated(...) as an asset between the raw corpus and tokenization."""

from __future__ import annotations

import dagster as dg
import pytest

from assets import sample_corpus
from assets.dedup import deduplicated
from marin_dagster.datasets.files import dataset_files
from resources.storage import StorageResource
from resources.zephyr import ZephyrResource


def test_exact_dedup_asset_drops_the_milton_copies(tmp_path, downloads):
    corpus = sample_corpus("raw/shakespeare", num_shards=2)
    clean = deduplicated("dedup/shakespeare-exact", source=corpus, mode="exact")
    storage = StorageResource(prefix=str(tmp_path / "data"), downloads=downloads)
    with dg.instance_for_test() as instance:
        result = dg.materialize([corpus, clean], instance=instance,
                                resources={"storage": storage, "zephyr": ZephyrResource(max_workers=2)})
    meta = {k: v.value for k, v in result.asset_materializations_for_node(clean.op.name)[0].metadata.items()}
    # seven Milton texts ship twice byte for byte
    assert meta["document_total"] == 91
    assert meta["document_duplicates"] == 7
    assert "| document |" in meta["summary"]
    files = dataset_files(meta["path"])
    assert files and all("/documents/part-" in f for f in files)


def test_unknown_dedup_field_is_named():
    corpus = sample_corpus("raw/shakespeare")
    with pytest.raises(TypeError, match=r"unknown field\(s\) \['treshold'\]"):
        deduplicated("dedup/x", source=corpus, treshold=0.5)
