"""deduplicated(...) as an asset between the raw corpus and tokenization."""

from __future__ import annotations

import gzip
import json

import dagster as dg
import pytest

from assets import sample_corpus
from assets.dedup import deduplicated
from marin_dagster import fs
from marin_dagster.datasets.files import dataset_files
from resources.storage import StorageResource
from resources.zephyr import ZephyrResource


def test_exact_dedup_asset_drops_the_milton_copies(tmp_path, downloads):
    corpus = sample_corpus("raw/shakespeare", num_shards=2)
    clean = deduplicated("dedup/shakespeare-exact", source=corpus, mode="exact")
    storage = StorageResource(prefix=str(tmp_path / "data"), downloads=downloads)
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [corpus, clean],
            instance=instance,
            resources={"storage": storage, "zephyr": ZephyrResource(max_workers=2)},
        )
        # each Zephyr stage of the dedup reports its progress in the run log as it goes
        progress = [
            e.user_message
            for e in instance.all_logs(result.run_id)
            if e.step_key == clean.op.name and e.user_message.startswith("zephyr ")
        ]
    assert len({m.split()[1] for m in progress}) >= 2, progress
    meta = {
        k: v.value
        for k, v in result.asset_materializations_for_node(clean.op.name)[0].metadata.items()
    }
    # seven Milton texts ship twice byte for byte
    assert meta["document_total"] == 91
    assert meta["document_duplicates"] == 7
    assert "| document |" in meta["summary"]
    files = dataset_files(meta["path"])
    assert files and all("/documents/part-" in f for f in files)


def test_unknown_dedup_field_is_named():
    corpus = sample_corpus("raw/shakespeare")
    with pytest.raises(
        TypeError,
        match=r"^deduplicated\('dedup/x'\): DedupConfig: unknown keyword 'treshold'; did you "
        r"mean 'threshold'\?",
    ):
        deduplicated("dedup/x", source=corpus, treshold=0.5)


def test_fuzzy_dedup_asset_links_the_identical_texts_and_writes_attributes(tmp_path, downloads):
    """The demo's mode: MinHash-LSH on the real corpus, counts as metadata, one attribute per
    input document, every removed document in a cluster with a kept one."""
    corpus = sample_corpus("raw/shakespeare", num_shards=2)
    clean = deduplicated("dedup/shakespeare", source=corpus)
    storage = StorageResource(prefix=str(tmp_path / "data"), downloads=downloads)
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [corpus, clean],
            instance=instance,
            resources={"storage": storage, "zephyr": ZephyrResource(max_workers=2)},
        )
    meta = {
        k: v.value
        for k, v in result.asset_materializations_for_node(clean.op.name)[0].metadata.items()
    }
    assert meta["mode"] == "fuzzy" and meta["fuzzy_bands"] * meta["fuzzy_rows"] <= 128
    assert meta["document_total"] == 91
    attributes = {a["id"]: a for a in _jsonl(meta["path"], "attributes")}
    kept = {d["id"] for d in _jsonl(meta["path"], "documents")}
    assert len(attributes) == 91
    assert {i for i, a in attributes.items() if not a["duplicate"]} == kept
    assert (
        sum(a["duplicate"] for a in attributes.values())
        == meta["document_duplicates"]
        == 91 - len(kept)
    )
    for doc_id, a in attributes.items():
        if a["duplicate"]:
            assert a["cluster_id"] in kept, f"{doc_id} was removed but its cluster kept nothing"
    # byte-identical Milton texts fall in one cluster whatever the threshold
    for name in ("comus", "areopagitica"):
        assert (
            attributes[f"milton/{name}"]["cluster_id"]
            == attributes[f"milton/{name}_gut"]["cluster_id"]
        )


def _jsonl(path: str, folder: str) -> list[dict]:
    fsys, root = fs.url_to_fs(path)
    out = []
    for name in sorted(fsys.glob(f"{root}/{folder}/part-*.jsonl.gz")):
        with fsys.open(name, "rb") as f:
            out.extend(json.loads(line) for line in gzip.decompress(f.read()).splitlines())
    return out
