"""The tiny training experiment with its train_lm step on 2 hosts (`gpu:1 replicas=2`), on the
Iris executor, for the multi-host launcher test. Step processes re-import the job, so it
lives in a module; outputs go to MARIN_PREFIX, the sdist comes from MARIN_TEST_DOWNLOADS."""

from __future__ import annotations

import os

import dagster as dg

from marin_dagster.iris.executor import iris_executor

TRAIN_STEPS = 30
CHECKPOINT_EVERY = 5
RESOURCES = "gpu:1 replicas=2"


def assets() -> list[dg.AssetsDefinition]:
    from assets import sample_corpus, tokenized, tokenizer
    from assets.train import train_lm
    from marin_dagster.levanter import AdamConfig
    from tests.assets.test_train_assets import TINY

    corpus = sample_corpus("raw/shakespeare", num_shards=2)
    tok = tokenizer("tokenizers/shakespeare-bpe", source=corpus, vocab_size=512)
    ds = tokenized("tokenized/shakespeare", source=corpus, tokenizer=tok, validation=0.1)
    model = train_lm(
        "checkpoints/tiny-shakespeare-2hosts",
        model=TINY,
        optimizer=AdamConfig(learning_rate=3e-3, warmup=2),
        datasets={ds: 1.0},
        batch_size=4,
        seq_len=128,
        num_train_steps=TRAIN_STEPS,
        checkpoint_every_steps=CHECKPOINT_EVERY,
        resources=RESOURCES,
    )
    return [corpus, tok, ds, model]


def multihost_job() -> dg.JobDefinition:
    from resources.levanter import LevanterResource
    from tests.assets.test_train_assets import _resources

    selected = assets()
    resources = _resources(os.environ["MARIN_PREFIX"], os.environ["MARIN_TEST_DOWNLOADS"])
    resources["levanter"] = LevanterResource(
        log_every=2, checkpoint_every_minutes=None, parallelism="fsdp", sample_tokens=4
    )
    return dg.Definitions(
        assets=selected,
        resources=resources,
        jobs=[dg.define_asset_job("multihost_job", selection=[a.key for a in selected])],
        executor=iris_executor,
    ).resolve_job_def("multihost_job")
