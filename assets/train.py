"""Language models: `train_lm(...)` checkpoints and `evaluate(...)` on Levanter (JAX)."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import dagster as dg
import pydantic

from marin_dagster import fs
from marin_dagster.execution.asset import (
    Step,
    StepContext,
    asset_list,
    defining,
    step_for,
    steps_by_name,
    versioned_asset,
)
from marin_dagster.execution.version import StepConfig, added_later
from marin_dagster.iris import ResourceConfig
from marin_dagster.levanter import AdamConfig, LlamaConfig, TrainInputError, TrainLmConfig
from marin_dagster.levanter.config import ComputeDtype
from marin_dagster.markdown import code_block
from marin_dagster.tokenize import TokenCache
from marin_dagster.tokenize.tokenizer import (
    CONFIG_FILE,
    TOKENIZER_FILE,
    find_eos_id,
    load_tokenizer,
    token_byte_lengths,
    vocab_size,
)
from marin_dagster.words import unknown_keyword


def _tokenizer_of(factory: str, name: str, asset: dg.AssetsDefinition) -> Step:
    with defining(factory, name):
        step = step_for(asset, "dataset")
    if "tokenizer" not in step.upstream:
        raise ValueError(
            f"{factory}({name!r}): datasets must be tokenized(...) assets; "
            f"{step.name} is a {step.kind!r}"
        )
    return step.upstream["tokenizer"]


def _tokenizer_step(
    name: str, datasets: Mapping[dg.AssetsDefinition, float], evals: Sequence[dg.AssetsDefinition]
) -> Step:
    """The one tokenizer shared by every dataset of the mixture and every eval set."""
    tokenizers = {}
    for asset in [*datasets, *evals]:
        tok = _tokenizer_of("train_lm", name, asset)
        tokenizers[tok.version] = tok
    if len(tokenizers) != 1:
        what = "the datasets and evals" if evals else "the datasets"
        raise ValueError(
            f"train_lm({name!r}): {what} use {len(tokenizers)} different tokenizers "
            f"({sorted(t.name + '-' + v for v, t in tokenizers.items())}); the model reads "
            "one: tokenize them all with the same tokenizer"
        )
    return next(iter(tokenizers.values()))


def _check_split(assets: Sequence[dg.AssetsDefinition], split: str, field: str) -> None:
    """Token caches read for `split` must have written it: one tokenized with validation=0
    has no validation split (train_lm dropped it from evals silently; evaluate failed at run
    time with advice to rebuild)."""
    if split != "validation":
        return
    for asset in assets:
        step = step_for(asset, field)
        if step.kind == "tokenized" and not (
            step.config.validation_fraction > 0 or "validation" in step.upstream
        ):
            raise ValueError(
                f"{field}: {step.name} has no validation split (tokenized with validation=0); "
                f"give its tokenized(...) a validation fraction or dataset, or leave it out"
                + (", or score it with split='train'" if field == "datasets" else "")
            )


def _png_markdown(path: str, alt: str) -> str:
    data = base64.b64encode(fs.read_bytes(path)).decode("ascii")
    return f"![{alt}](data:image/png;base64,{data})"


def _check_accelerator(step: StepContext) -> str:
    """The kind of device JAX trains on; a warning where the step asked for an accelerator
    that JAX does not see (a script ignores `resources=`, and a CPU-only jax sees none)."""
    import jax

    from marin_dagster.levanter import distributed

    # Join the other hosts first: JAX's backend must not start before that (train() joins
    # the same way; joining twice is a no-op).
    distributed.initialize_from_env()
    asked = ResourceConfig.from_op_tags(step.dagster.op_def.tags)
    kind = jax.devices()[0].device_kind
    if asked.needs_accelerator and jax.default_backend() == "cpu":
        step.log.warning(
            f"resources={asked.to_string()!r} asks for an accelerator, but JAX sees only CPU "
            f"devices ({kind}): training on the CPU. On a GPU machine install JAX's CUDA "
            "build (pip install 'jax[cuda12]') and check CUDA_VISIBLE_DEVICES; on a TPU VM, "
            "'jax[tpu]'"
        )
    return kind


def _run_train(
    config: TrainLmConfig, inputs: Mapping[str, str], output_path: str, step: StepContext
) -> dict[str, Any]:
    # The engine (JAX, optax, orbax) loads in the step that trains, not in every code location.
    from marin_dagster.levanter.trainer import train, with_split

    levanter = step.resources.levanter
    device = _check_accelerator(step)
    tokenizer_file = fs.join(inputs["tokenizer"], TOKENIZER_FILE)
    tok = load_tokenizer(tokenizer_file)
    # The checkpoint carries its tokenizer: `marin export-hf` and anyone sampling from it
    # need no experiment file to find which one it was.
    fs.write_bytes(fs.join(output_path, TOKENIZER_FILE), fs.read_bytes(tokenizer_file))
    # ... and the EOS its caches end documents with, when the tokenizer names it otherwise than
    # the known names (tokenized(eos_token="<|im_end|>")): export-hf reads it back.
    eos_id = TokenCache.open(inputs[next(iter(config.datasets))], config.train_split).eos_id
    if eos_id is not None and find_eos_id(tok) != eos_id:
        fs.write_json(fs.join(output_path, CONFIG_FILE), {"eos_token": tok.id_to_token(eos_id)})
    # The experiment names datasets by asset; the engine reads their token caches.
    train_config = dataclasses.replace(
        config,
        datasets={inputs[name]: weight for name, weight in config.datasets.items()},
        # Eval metrics named by asset, as the evaluate(...) asset names them.
        validation=with_split(
            {name: inputs[name] for name in (config.validation or config.datasets)},
            config.validation_split,
        ),
        tokenizer_vocab_size=vocab_size(tok),
    )
    try:
        result = train(
            train_config,
            output_path,
            settings=levanter.settings(),
            on_metrics=levanter.metrics_logger(step.log),
            decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
            log=step.log,
            token_bytes=token_byte_lengths(tok),
        )
    except TrainInputError as e:
        _name_caches(e, inputs)
        raise
    meta: dict[str, Any] = {
        "final_train_loss": round(result.final_train_loss, 4),
        "eval_loss": None if result.eval_loss is None else round(result.eval_loss, 4),
        "tokens_per_second": None
        if result.tokens_per_second is None
        else round(result.tokens_per_second, 1),
        "mfu": None if result.mfu is None else round(result.mfu, 5),
        "mfu_formula": result.mfu_formula,
        "total_tokens": result.total_tokens,
        "parameters": result.num_parameters,
        "steps": result.final_step,
        "devices": result.num_devices,
        "device_kind": device,
        "resumed_from_step": result.resumed_from_step,
        "loss_curve": dg.MetadataValue.md(_png_markdown(result.loss_curve_path, "loss curve")),
        "sample": dg.MetadataValue.md(code_block(result.sample_text or "")),
        "eval": dg.MetadataValue.json({k: v.to_dict() for k, v in result.eval.items()}),
        "params": dg.MetadataValue.path(result.params_path),
    }
    return meta


# train_lm's own keywords, then the engine config's fields it passes on as they are.
_TRAIN_LM_KEYWORDS = (
    "version",
    "model",
    "optimizer",
    "datasets",
    "batch_size",
    "num_train_steps",
    "seq_len",
    "evals",
    "resources",
)


def _check_keywords(name: str, config: Mapping[str, Any]) -> None:
    passed_on = [
        f.name
        for f in dataclasses.fields(TrainLmConfig)
        if f.name not in (*_TRAIN_LM_KEYWORDS, "validation", "tokenizer_vocab_size")
    ]
    for keyword in config:
        if keyword in passed_on:
            continue
        if keyword in {f.name for f in dataclasses.fields(AdamConfig)}:
            raise TypeError(
                f"train_lm({name!r}): {keyword} is an optimizer setting: pass "
                f"optimizer=AdamConfig({keyword}=...)"
            )
        raise TypeError(
            f"train_lm({name!r}): " + unknown_keyword(keyword, [*_TRAIN_LM_KEYWORDS, *passed_on])
        )


def train_lm(
    name: str,
    *,
    version: str = "v1",
    model: LlamaConfig | None = None,
    optimizer: AdamConfig | None = None,
    datasets: Mapping[dg.AssetsDefinition, float] | None = None,
    batch_size: int | None = None,
    num_train_steps: int | None = None,
    seq_len: int | None = None,
    evals: Sequence[dg.AssetsDefinition] | None = None,
    resources: str | ResourceConfig = "cpu",
    **config: Any,
) -> dg.AssetsDefinition:
    """A Llama trained on a mixture of tokenized datasets; output: orbax checkpoints and final params.

    The step's config is the engine's `TrainLmConfig` (its other fields as keywords, e.g.
    `z_loss_weight`), with the datasets named by asset; `version` is a label of your own that
    enters the step's version. Evaluation reads the validation split of `evals` (tokenized
    assets with the same tokenizer), by default of the training datasets.
    """
    # Required, yet None by default: a misspelt keyword (`num_train_step=`) is then named as
    # such, not hidden behind Python's "missing argument".
    _check_keywords(name, config)
    for required, value in (
        ("model", model),
        ("datasets", datasets),
        ("batch_size", batch_size),
        ("num_train_steps", num_train_steps),
    ):
        if value is None:
            raise TypeError(f"train_lm({name!r}): {required}= is required")
    assert model is not None and datasets is not None and num_train_steps is not None
    if not isinstance(datasets, Mapping):
        raise TypeError(
            f"train_lm({name!r}): datasets must map tokenized assets to their weights, e.g. "
            f"datasets={{tokens: 1.0}}; got {type(datasets).__name__}"
        )
    if not datasets:
        raise ValueError(f"train_lm({name!r}): datasets is empty; give {{tokenized_asset: weight}}")
    if evals is not None:
        with defining("train_lm", name):
            evals = asset_list(evals, "evals")
            _check_split(evals, "validation", "evals")
    tokenizer_step = _tokenizer_step(name, datasets, evals or [])
    with defining("train_lm", name):
        # the mixture and the upstream go by name: two datasets of one name would be one
        steps_by_name([*datasets, *(evals or ())], "dataset")
        cfg = TrainLmConfig(
            model=model,
            optimizer=optimizer or AdamConfig(),
            datasets={step_for(a).name: float(w) for a, w in datasets.items()},
            batch_size=batch_size,
            num_train_steps=num_train_steps,
            seq_len=seq_len,
            validation={step_for(a).name: step_for(a).name for a in evals} if evals else None,
            **config,
        )
    upstream = {step_for(a).name: a for a in [*datasets, *(evals or ())]}
    upstream["tokenizer"] = tokenizer_step.asset
    return versioned_asset(
        name=name,
        kind="train_lm",
        config=cfg,
        run=_run_train,
        upstream=upstream,
        label=version,
        description=(
            f"Llama ({model.num_layers} layers, hidden {model.hidden_dim}) trained "
            f"{num_train_steps} steps, batch {batch_size}, on "
            + ", ".join(f"{n} x{w:g}" for n, w in cfg.datasets.items())
            + ". Orbax checkpoints with resume; final params as npz."
        ),
        resources=resources,
        required_resources=("levanter",),
        kinds=("jax",),
    )


class EvaluateStepConfig(StepConfig):
    split: Literal["train", "validation"] = "validation"
    """The token cache split scored: the two a `tokenized` step writes."""
    batch_size: int = pydantic.Field(8, ge=1)
    max_batches: int | None = pydantic.Field(16, ge=1)
    seq_len: int | None = pydantic.Field(None, ge=2)
    """Tokens per scored sequence; `evaluate` sets the length the checkpoint was trained at.
    In the version: evaluations that scored at the model's maximum, with bits per byte over
    the split's average bytes per token, are not reused as these."""
    compute_dtype: ComputeDtype = added_later("float32")
    """What the matmuls run in; the checkpoint's parameters are float32 whatever it was
    trained in. Versioned: a bfloat16 loss is not the float32 one."""


def _name_caches(e: Exception, inputs: Mapping[str, str]) -> None:
    """The engine names a training dataset by its token cache's path; the experiment by
    its asset. Say which asset each path in the message is."""
    named = [f"{path!r} is the asset {name}" for name, path in inputs.items() if path in str(e)]
    if named:
        e.add_note("; ".join(named))


def _run_evaluate(
    config: EvaluateStepConfig, inputs: Mapping[str, str], output_path: str, step: StepContext
) -> dict[str, Any]:
    from marin_dagster.levanter.evaluation import evaluate as evaluate_checkpoint
    from marin_dagster.levanter.evaluation import evaluate_to_dict

    datasets = {name: path for name, path in inputs.items() if name != "checkpoint"}
    # The copy of its tokenizer the train output keeps: bits per byte over the bytes scored.
    tokenizer_file = fs.join(inputs["checkpoint"], TOKENIZER_FILE)
    token_bytes = (
        token_byte_lengths(load_tokenizer(tokenizer_file)) if fs.exists(tokenizer_file) else None
    )
    results = evaluate_checkpoint(
        inputs["checkpoint"],
        datasets,
        split=config.split,
        batch_size=config.batch_size,
        max_batches=config.max_batches,
        seq_len=config.seq_len,
        compute_dtype=config.compute_dtype,
        token_bytes=token_bytes,
    )
    as_dict = evaluate_to_dict(results)
    fs.write_json(fs.join(output_path, "eval.json"), as_dict)
    # The same as rows, which `marin sql` shows as the asset's table (it reads no plain .json):
    # evaluations of several checkpoints compared in one query.
    checkpoint = fs.basename(inputs["checkpoint"])
    rows = [{"checkpoint": checkpoint, "dataset": name, **r} for name, r in as_dict.items()]
    fs.write_bytes(
        fs.join(output_path, "eval.jsonl"),
        "".join(
            json.dumps({k: v for k, v in row.items() if k != "name"}) + "\n" for row in rows
        ).encode(),
    )
    meta: dict[str, Any] = {"results": dg.MetadataValue.json(as_dict)}
    for name, r in results.items():
        meta[f"{name}/loss"] = round(r.loss, 4)
        meta[f"{name}/perplexity"] = round(r.perplexity, 3)
        if r.bits_per_byte is not None:
            meta[f"{name}/bits_per_byte"] = round(r.bits_per_byte, 4)
    step.log.info(json.dumps(as_dict))
    return meta


def evaluate(
    name: str,
    checkpoint: dg.AssetsDefinition,
    datasets: list[dg.AssetsDefinition],
    *,
    resources: str | ResourceConfig = "cpu",
    **config: Any,
) -> dg.AssetsDefinition:
    """Eval loss, perplexity and bits per byte of a checkpoint on tokenized datasets."""
    with defining("evaluate", name):
        trained = step_for(checkpoint, "checkpoint")
        datasets = asset_list(datasets, "datasets")
        _check_split(datasets, config.get("split", "validation"), "datasets")
    if trained.kind != "train_lm":
        raise ValueError(
            f"evaluate({name!r}): checkpoint must be a train_lm(...) asset; "
            f"{trained.name} is a {trained.kind!r}"
        )
    model_tok = trained.upstream["tokenizer"]
    for asset in datasets:
        tok = _tokenizer_of("evaluate", name, asset)
        if tok.version != model_tok.version:
            # the ids would mean other words to the model: a loss, but of nothing
            raise ValueError(
                f"evaluate({name!r}): {step_for(asset).name} is tokenized with "
                f"{tok.name}-{tok.version}, but {trained.name} was trained with "
                f"{model_tok.name}-{model_tok.version}; evaluate on datasets tokenized with "
                f"the checkpoint's tokenizer (tokenized(..., tokenizer=<that tokenizer>))"
            )
    with defining("evaluate", name):
        steps_by_name(datasets, "dataset")  # by name below: one name, one dataset
    upstream = {step_for(a).name: a for a in datasets}
    upstream["checkpoint"] = checkpoint
    trained_at = trained.config.seq_len or trained.config.model.seq_len
    with defining("evaluate", name):
        cfg = EvaluateStepConfig(**{"seq_len": trained_at, **config})
    if cfg.seq_len > trained.config.model.seq_len:
        raise ValueError(
            f"evaluate({name!r}): seq_len={cfg.seq_len} is above the model's maximum "
            f"({trained.name}: model.seq_len={trained.config.model.seq_len})"
        )
    return versioned_asset(
        name=name,
        kind="evaluate",
        config=cfg,
        run=_run_evaluate,
        upstream=upstream,
        description="Evaluation of a checkpoint on the datasets' validation split.",
        resources=resources,
        required_resources=("levanter",),
        kinds=("jax",),
    )
