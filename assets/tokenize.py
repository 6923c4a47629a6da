"""Tokenizers and tokenized datasets: `tokenizer(...)` and `tokenized(...)`."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

import dagster as dg
import pydantic

from assets.dataset import records_text_key
from marin_dagster import fs
from marin_dagster.datasets.files import dataset_files
from marin_dagster.execution.asset import StepContext, defining, versioned_asset
from marin_dagster.execution.version import StepConfig, added_later
from marin_dagster.iris import ResourceConfig
from marin_dagster.tokenize import TokenCache
from marin_dagster.tokenize.build import build_token_cache
from marin_dagster.tokenize.records import RecordCounts, held_out, iter_documents, read_records
from marin_dagster.tokenize.tokenizer import (
    DEFAULT_EOS,
    KNOWN_EOS,
    TOKENIZER_FILE,
    describe_tokenizer,
    examples_markdown,
    load_tokenizer,
    save_tokenizer,
    train_tokenizer,
    vocab_size,
)

HELD_OUT_FRACTION = 0.05
HELD_OUT_CHARS = 20_000


class TokenizerConfig(StepConfig):
    vocab_size: int = pydantic.Field(8192, ge=257)
    special_tokens: tuple[str, ...] = (DEFAULT_EOS,)
    min_frequency: int = pydantic.Field(2, ge=1)
    max_documents: int | None = pydantic.Field(None, ge=1)
    text_key: str = "text"
    pretrained: str | None = None
    """A tokenizer.json path or a hub name, used instead of training."""
    pretrained_sha256: str | None = None
    skip_bad_records: bool = added_later(False)
    """Skip records that cannot be read (broken JSON, no text field) and count them, rather
    than fail naming the first; the same option as `tokenized`'s."""

    @pydantic.field_validator("special_tokens", mode="before")
    @classmethod
    def _tuple(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value


def _training_eos(special_tokens: tuple[str, ...]) -> str:
    """The end-of-document token of a BPE trained with `special_tokens`: the one the token
    cache will find (`find_eos_id` looks for the known names in this order)."""
    for token in KNOWN_EOS:
        if token in special_tokens:
            return token
    raise ValueError(
        f"special_tokens={list(special_tokens)} holds no end-of-document token, which the "
        f"token cache appends after each document: add one of {', '.join(KNOWN_EOS)} "
        "(e.g. special_tokens=['<s>', '</s>'])"
    )


def _texts(
    files: list[str], config: TokenizerConfig, held: list[str], counts: RecordCounts
) -> Iterator[str]:
    """Training texts, streamed; documents in the held-out fraction go to `held` instead."""
    for path in files:
        skip = config.skip_bad_records
        docs = iter_documents(
            read_records(path), path, config.text_key, skip_bad_records=skip, counts=counts
        )
        for doc in docs:
            if held_out(doc.doc_id, HELD_OUT_FRACTION):
                held.append(doc.text[:HELD_OUT_CHARS])
            else:
                yield doc.text


def _run_tokenizer(
    config: TokenizerConfig, inputs: Mapping[str, str], output_path: str, step: StepContext
) -> dict[str, Any]:
    held: list[str] = []
    counts = RecordCounts()
    if config.pretrained:
        tok = load_tokenizer(config.pretrained)
        save_tokenizer(tok, output_path, {"pretrained": config.pretrained})
        if "source" in inputs:
            for _ in _texts(dataset_files(inputs["source"]), config, held, counts):
                pass
    else:
        trained = train_tokenizer(
            _texts(dataset_files(inputs["source"]), config, held, counts),
            output_path,
            vocab_size=config.vocab_size,
            special_tokens=config.special_tokens,
            # The engine's default, <|endoftext|>, is not among every user's special tokens.
            eos_token=_training_eos(config.special_tokens),
            min_frequency=config.min_frequency,
            max_documents=config.max_documents,
        )
        tok = trained.tokenizer
        if vocab_size(tok) < config.vocab_size:
            # BPE stops when no pair is left to merge: the corpus is too small for the ask
            step.log.warning(
                f"tokenizer: vocab_size={config.vocab_size:,} asked, {vocab_size(tok):,} "
                "learned: the corpus holds no more merges (or none at min_frequency="
                f"{config.min_frequency}); the model's embedding follows the learned size. "
                "Lower vocab_size to match, or train on more text"
            )
    if counts.bad:
        step.log.warning(f"tokenizer: skipped {counts.bad:,} bad record(s) (skip_bad_records)")
    info = describe_tokenizer(tok, held[:16] or ["To be, or not to be, that is the question."])
    step.log.info(
        f"tokenizer: vocab {info['vocab_size']}, {info['bytes_per_token']:.2f} bytes/token"
    )
    return {
        "vocab_size": info["vocab_size"],
        "eos_id": info["eos_id"],
        "bytes_per_token": round(info["bytes_per_token"], 4),
        "held_out_documents": len(held),
        "bad_records": counts.bad,
        "tokenizer_json": dg.MetadataValue.path(fs.join(output_path, TOKENIZER_FILE)),
        "examples": dg.MetadataValue.md(examples_markdown(info["examples"])),
    }


def _file_sha256(spec: str) -> str | None:
    path = os.path.expanduser(spec)
    if os.path.isdir(path):
        path = os.path.join(path, TOKENIZER_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _local_path(spec: str) -> bool:
    """A spec naming a local file (a hub name or a URL is looked up when the step runs)."""
    return "://" not in spec and (spec.endswith(".json") or spec.startswith((".", "/", "~")))


def tokenizer(
    name: str,
    source: dg.AssetsDefinition | None = None,
    *,
    pretrained: str | None = None,
    resources: str | ResourceConfig = "cpu",
    **config: Any,
) -> dg.AssetsDefinition:
    """A byte-level BPE trained on `source`'s text, or an existing tokenizer (`pretrained`)."""
    if source is None and pretrained is None:
        raise ValueError(
            f"tokenizer({name!r}): give a source dataset to train on, or pretrained=..."
        )
    with defining("tokenizer", name):
        if source is not None:
            config.setdefault("text_key", records_text_key(source))
        cfg = TokenizerConfig(
            pretrained=pretrained,
            # a local tokenizer.json is versioned by its bytes, not only by its path
            pretrained_sha256=_file_sha256(pretrained) if pretrained else None,
            **config,
        )
        if not pretrained:
            _training_eos(cfg.special_tokens)  # refused now, not when the step runs
        elif cfg.pretrained_sha256 is None and _local_path(pretrained):
            # The dry run listed the step to run, and the run failed on it.
            raise ValueError(
                f"pretrained={pretrained!r}: no {TOKENIZER_FILE} there; give the path of a "
                f"{TOKENIZER_FILE} (or of the folder holding it), or a hub name"
            )
    return versioned_asset(
        name=name,
        kind="tokenizer",
        config=cfg,
        run=_run_tokenizer,
        upstream={"source": source} if source is not None else None,
        description=(
            f"Tokenizer loaded from {pretrained}."
            if pretrained
            else f"Byte-level BPE, vocabulary {cfg.vocab_size}, trained on the source's text."
        ),
        resources=resources,
        kinds=("tokenizers",),
    )


def pretrained_tokenizer(spec: str) -> dg.AssetsDefinition:
    """The tokenizer asset of a pretrained tokenizer (`tokenizers/<hub id or file name>`),
    one per spec however many datasets use it."""
    stem = spec.rstrip("/").removesuffix(".json") if os.path.sep in spec else spec
    parts = [p for p in re.split(r"[/\\]", stem) if p not in ("", ".", "..", "~")]
    name = "tokenizers/" + "/".join(re.sub(r"[^A-Za-z0-9_.-]", "_", p) for p in parts[-2:])
    known = _PRETRAINED.get(spec)
    if known is None:
        known = _PRETRAINED[spec] = tokenizer(name, pretrained=spec)
    return known


_PRETRAINED: dict[str, dg.AssetsDefinition] = {}


class TokenizedConfig(StepConfig):
    sample_count: int | None = pydantic.Field(None, ge=1)
    validation_fraction: float = pydantic.Field(0.05, ge=0.0, lt=1.0)
    text_key: str = "text"
    id_key: str | None = "id"
    append_eos: bool = True
    add_special_tokens: bool = True
    """Encode with the tokenizer's template (e.g. its BOS), as Levanter does."""
    skip_bad_records: bool = False
    eos_token: str | None = added_later(None)
    """The token appended after each document (append_eos); None: the first well-known one
    the tokenizer has (<|endoftext|>, </s>, ...). A tokenizer with another name for it
    (<|im_end|>, [SEP]) needs it named here."""


def _samples_markdown(cache_path: str, tokenizer_dir: str, n: int = 3, chars: int = 300) -> str:
    tok = load_tokenizer(fs.join(tokenizer_dir, TOKENIZER_FILE))
    cache = TokenCache.open(cache_path, split="train")
    lines = []
    for i in range(min(n, len(cache))):
        text = tok.decode(cache[i][:128].tolist(), skip_special_tokens=False)
        lines.append(f"{i + 1}. `{text[:chars]!r}`")
    return "\n".join(lines)


def _run_tokenized(
    config: TokenizedConfig, inputs: Mapping[str, str], output_path: str, step: StepContext
) -> dict[str, Any]:
    # The build is one Zephyr pipeline on the resource's context (backend, workers, progress
    # in the run log), plus the ledgers it writes after.
    zephyr = step.resources.zephyr
    with zephyr.context(log=step.log, output_path=output_path) as zephyr_context:
        stats = build_token_cache(
            dataset_files(inputs["source"]),
            fs.join(inputs["tokenizer"], TOKENIZER_FILE),
            output_path,
            text_key=config.text_key,
            id_key=config.id_key,
            append_eos=config.append_eos,
            add_special_tokens=config.add_special_tokens,
            eos_token=config.eos_token,
            sample_count=config.sample_count,
            validation_fraction=0.0 if "validation" in inputs else config.validation_fraction,
            validation_files=dataset_files(inputs["validation"])
            if "validation" in inputs
            else None,
            skip_bad_records=config.skip_bad_records,
            context=zephyr_context,
        )
    # Input shards, not Zephyr's tasks: with a validation split each input shard is two
    # tasks (its train and its held-out cache shard), which the progress lines count.
    cache_shards = ", ".join(f"{v['num_shards']} {split}" for split, v in stats.splits.items())
    step.log.info(
        f"token cache: {stats.shards_processed} of {stats.shards_total} input shards tokenized, "
        f"{stats.shards_skipped} already done (cache shards: {cache_shards})"
    )
    meta: dict[str, Any] = {
        "tokens": stats.num_tokens,
        "documents": stats.num_docs,
        "text_bytes": stats.num_bytes,
        "bytes_per_token": round(stats.num_bytes / max(stats.num_tokens, 1), 4),
        "dtype": stats.dtype,
        "empty_documents": stats.num_empty,
        "bad_records": stats.num_bad,
        "samples": dg.MetadataValue.md(_samples_markdown(output_path, inputs["tokenizer"])),
    }
    for split, s in stats.splits.items():
        meta[f"{split}_tokens"] = s["num_tokens"]
        meta[f"{split}_documents"] = s["num_docs"]
    if stats.num_docs and not meta.get("train_documents"):
        # Training would fail on it much later, naming only the cache's path.
        step.log.warning(
            f"the train split is empty: all {stats.num_docs:,} documents fell in the held-out "
            f"{config.validation_fraction:.0%} (validation); lower validation=..., or give "
            "validation=<a dataset asset> and keep this source for training"
        )
    elif config.validation_fraction > 0 and not meta.get("validation_documents"):
        # Training evaluates on this split by default and would fail only then, much later.
        step.log.warning(
            f"the validation split is empty: no document of {stats.num_docs:,} fell in the "
            f"held-out {config.validation_fraction:.0%} (chosen by a hash of each id); raise "
            "validation=..., give validation=<a dataset asset>, or evaluate on other datasets "
            "(train_lm's evals=[...])"
        )
    return {**meta, **zephyr.metadata(zephyr_context)}


def tokenized(
    name: str,
    source: dg.AssetsDefinition | str,
    tokenizer: dg.AssetsDefinition | str,
    *,
    validation: float | dg.AssetsDefinition = 0.05,
    version: str | None = None,
    resources: str | ResourceConfig = "cpu",
    **config: Any,
) -> dg.AssetsDefinition:
    """A Levanter-style token cache of `source` (train and validation splits), one shard per input shard.

    `source` may be a dataset asset or anything `dataset` reads (a hub dataset id, which takes
    its train split, a path, a URL); `tokenizer` a tokenizer asset or a pretrained tokenizer
    (hub id or tokenizer.json path). `version` is a label of your own that enters the version.
    """
    if isinstance(source, str):
        from assets.dataset import as_dataset
        from marin_dagster.datasets.sources import parse_source

        spec = parse_source(source)
        split = {"split": "train"} if spec.kind == "hub" else {}
        source = as_dataset(source, text_key=config.get("text_key", "text"), **split)
    if isinstance(tokenizer, str):
        tokenizer = pretrained_tokenizer(tokenizer)
    upstream = {"source": source, "tokenizer": tokenizer}
    with defining("tokenized", name):
        config.setdefault("text_key", records_text_key(source))
        if isinstance(validation, dg.AssetsDefinition):
            upstream["validation"] = validation
            cfg = TokenizedConfig(validation_fraction=0.0, **config)
        else:
            cfg = TokenizedConfig(validation_fraction=float(validation), **config)
    return versioned_asset(
        name=name,
        kind="tokenized",
        config=cfg,
        run=_run_tokenized,
        upstream=upstream,
        label=version,
        description="Token cache (uint16/uint32 ids and document offsets as .npy shards, a ledger "
        "per split) that training reads with TokenCache.",
        resources=resources,
        required_resources=("zephyr",),
        kinds=("numpy",),
    )
