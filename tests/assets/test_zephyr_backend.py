"""Every data asset runs its pipelines through the ZephyrResource: switch the resource to the
Ray backend (a real local Ray cluster) and every data step runs there, with its progress in
the Dagster run log."""

from __future__ import annotations

import json

import dagster as dg

from assets import dataset, dataset_stats, deduplicated, sample_corpus, tokenized, tokenizer
from resources.ducky import stats_duckdb
from resources.storage import StorageResource
from resources.zephyr import ZephyrResource

TEXTS = [
    "Now is the winter of our discontent made glorious summer by this sun of York.",
    "All the world's a stage, and all the men and women merely players.",
    "Friends, Romans, countrymen, lend me your ears; I come to bury Caesar.",
    "The quality of mercy is not strained; it droppeth as the gentle rain.",
]


def test_every_data_step_runs_on_the_resources_ray_backend(
    tmp_path, downloads, ray_cluster
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name, texts in {"a.jsonl": TEXTS, "b.jsonl": TEXTS[:2] + TEXTS}.items():
        lines = [json.dumps({"id": f"{name}-{i}", "text": t}) for i, t in enumerate(texts)]
        (src / name).write_text("\n".join(lines) + "\n")
    corpus = sample_corpus("raw/ray-shakespeare", num_shards=2)
    local = dataset("raw/ray-notes", str(src))
    clean = deduplicated("dedup/ray-notes", source=local, mode="exact")
    tok = tokenizer("tokenizers/ray-bpe", source=local, vocab_size=300, min_frequency=1)
    tokens = tokenized("tokenized/ray-notes", source=clean, tokenizer=tok, validation=0.25)
    stats = dataset_stats("stats/ray", datasets=[corpus, local, clean, tokens])
    data_steps = [corpus, local, clean, tokens, stats]

    prefix = str(tmp_path / "data")
    resources = {
        "storage": StorageResource(prefix=prefix, downloads=downloads),
        "zephyr": ZephyrResource(backend="ray", max_workers=2),
        "duckdb": stats_duckdb(prefix),
    }
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [corpus, local, clean, tok, tokens, stats], instance=instance, resources=resources
        )
        assert result.success
        logs = [(e.step_key, e.user_message) for e in instance.all_logs(result.run_id)]

    for asset in data_steps:
        meta = result.asset_materializations_for_node(asset.op.name)[0].metadata
        # The backend its ZephyrContext ran: the resource's, for every data step.
        assert meta["zephyr/backend"].value == "ray", asset.key
        assert meta["zephyr/max_workers"].value == 2
        assert meta["zephyr/shards"].value > 0, asset.key
        progress = [
            m
            for step, m in logs
            if step == asset.op.name and m.startswith("zephyr ") and m.endswith("(ray)")
        ]
        assert any("shards" in m for m in progress), (asset.key, logs)
        # nothing ran on local worker processes
        assert not any(
            step == asset.op.name and m.startswith("zephyr ") and "(local)" in m for step, m in logs
        )

    # the work was done, not only logged: the outputs are what the local backend gives
    clean_meta = result.asset_materializations_for_node(clean.op.name)[0].metadata
    assert clean_meta["document_total"].value == 10
    assert clean_meta["document_duplicates"].value == 6 and clean_meta["document_kept"].value == 4
    stats_meta = result.asset_materializations_for_node(stats.op.name)[0].metadata
    assert stats_meta["datasets"].value == 4
    assert "| raw/ray-notes | 10 |" in stats_meta["stats"].value
    token_meta = result.asset_materializations_for_node(tokens.op.name)[0].metadata
    assert token_meta["documents"].value == 4
