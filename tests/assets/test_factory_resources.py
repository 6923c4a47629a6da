"""Every asset factory takes `resources=`, and the request lands in the asset's op tags,
where the Iris executor (and the UI's op tags) read it."""

from __future__ import annotations

import dagster as dg
import pytest

from marin_dagster.iris import ResourceConfig
from marin_dagster.iris.resource_config import RESOURCES_TAG


def _factories(resources: str) -> dict[str, dg.AssetsDefinition]:
    from assets import (
        dataset_stats,
        deduplicated,
        evaluate,
        folder_corpus,
        sample_corpus,
        tokenized,
        tokenizer,
        train_lm,
        watched_folder,
    )
    from marin_dagster.levanter import llama_nano

    r = resources
    corpus = sample_corpus("raw/r", resources=r)
    tok = tokenizer("tokenizers/r", source=corpus, vocab_size=300, resources=r)
    clean = deduplicated("dedup/r", source=corpus, mode="exact", resources=r)
    ds = tokenized("tokenized/r", source=clean, tokenizer=tok, resources=r)
    model = train_lm(
        "checkpoints/r",
        model=llama_nano,
        datasets={ds: 1.0},
        batch_size=2,
        num_train_steps=1,
        resources=r,
    )
    folder = watched_folder("inbox/r", "/tmp/marin-inbox-r")
    return {
        "sample_corpus": corpus,
        "tokenizer": tok,
        "deduplicated": clean,
        "tokenized": ds,
        "train_lm": model,
        "evaluate": evaluate("eval/r", checkpoint=model, datasets=[ds], resources=r),
        "folder_corpus": folder_corpus("raw/inbox-r", source=folder, resources=r),
        "dataset_stats": dataset_stats("stats/r", [clean, ds], resources=r),
    }


@pytest.mark.parametrize("request_string", ["cpu:4", "gpu:h100x8", "tpu:v5e-8"])
def test_every_factory_puts_its_resources_in_op_tags(request_string: str) -> None:
    expected = ResourceConfig.parse(request_string).to_op_tags()
    for factory, asset in _factories(request_string).items():
        tags = asset.op.tags
        assert tags[RESOURCES_TAG] == expected[RESOURCES_TAG], factory
        assert ResourceConfig.from_op_tags(tags) == ResourceConfig.parse(request_string), factory
        assert set(expected) <= set(tags), factory


def test_resources_do_not_change_the_version() -> None:
    cpu, gpu = _factories("cpu"), _factories("gpu:h100")
    for factory in cpu:
        a, b = cpu[factory], gpu[factory]
        assert a.code_versions_by_key[a.key] == b.code_versions_by_key[b.key], factory
