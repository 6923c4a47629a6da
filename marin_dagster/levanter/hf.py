"""Hugging Face interop: a trained model as a `transformers` LlamaForCausalLM folder, and back.

    export_hf(source, out_dir)        params (+ config) or a checkpoint -> config.json + model.safetensors
                                      (+ the tokenizer's files, with tokenizer=)
    import_hf(folder)                 such a folder -> (LlamaConfig, params)
    import_hf_to_dir(folder, out_dir) such a folder -> params.npz + model_config.json (what
                                      `evaluate` and `load_model` read)

The folder is what `LlamaForCausalLM.save_pretrained` writes: tensors named as the PyTorch
module names them (`model.layers.{i}.self_attn.q_proj.weight`, ...), linear weights in
torch's (out_features, in_features) layout, so the engine's (in, out) matrices are
transposed and its stacked layers split per layer. Both use the "rotate half" RoPE
layout (model.py's `apply_rope` is HF's `rotate_half`), so q/k rows are not permuted.
Conversions are exact: export -> import returns the same bits.

No Dagster here (an engine module).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import uuid
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import safetensors
from safetensors.numpy import save_file

from marin_dagster import fs
from marin_dagster.levanter.config import LlamaConfig
from marin_dagster.levanter.model import Params

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
ARCHITECTURE = "LlamaForCausalLM"

# Parameter dtypes a folder may hold, by their torch / safetensors names.
DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}
_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}

# The engine's per-layer arrays (stacked on a leading layer axis) and their HF names under
# `model.layers.{i}.`; True where torch's Linear stores the transpose of the engine's matrix.
LAYER_TENSORS: dict[str, tuple[str, bool]] = {
    "attn_norm": ("input_layernorm.weight", False),
    "q_proj": ("self_attn.q_proj.weight", True),
    "k_proj": ("self_attn.k_proj.weight", True),
    "v_proj": ("self_attn.v_proj.weight", True),
    "o_proj": ("self_attn.o_proj.weight", True),
    "mlp_norm": ("post_attention_layernorm.weight", False),
    "gate_proj": ("mlp.gate_proj.weight", True),
    "up_proj": ("mlp.up_proj.weight", True),
    "down_proj": ("mlp.down_proj.weight", True),
}
EMBED_TOKENS = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"
# Non-parameter buffers that older transformers versions saved; skipped on import.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


class HfFormatError(ValueError):
    """A Hugging Face folder, or parameters to export, that do not fit the engine's Llama."""


# ---------------------------------------------------------------------------------------
# config.json


def hf_config(
    config: LlamaConfig,
    torch_dtype: str = "float32",
    *,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> dict[str, Any]:
    """config.json for `config`, as transformers' LlamaConfig writes it; the special token ids
    are the tokenizer's (see `hf_tokenizer`)."""
    if config.qk_norm:
        raise HfFormatError(
            "qk_norm=True (a Qwen3Config model): only Llama models export to a Hugging Face "
            "folder so far; train with a LlamaConfig to export"
        )
    if config.vocab_size is None:
        raise HfFormatError(
            "LlamaConfig.vocab_size is unset: set it from the tokenizer (config.with_vocab(n)) "
            "before exporting"
        )
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_dim,
        "intermediate_size": config.intermediate_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.actual_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.seq_len,
        "initializer_range": config.initializer_range,
        "rms_norm_eps": config.layer_norm_epsilon,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "tie_word_embeddings": config.tie_word_embeddings,
        "torch_dtype": torch_dtype,
        "use_cache": True,
        # The tokenizer's, when it is known; None rather than transformers' default (Llama's
        # 1 and 2), which would be some other token of this vocabulary.
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
    }


def config_from_hf(d: Mapping[str, Any], source: str = CONFIG_FILE) -> LlamaConfig:
    """The LlamaConfig of a transformers config.json; what the engine cannot run is refused."""

    def refuse(field: str, why: str) -> HfFormatError:
        return HfFormatError(f"{source}: {field}={d.get(field)!r}: {why}")

    if d.get("model_type") != "llama":
        raise refuse("model_type", 'only Llama models ("model_type": "llama") can be imported')
    architectures = d.get("architectures")
    if architectures and ARCHITECTURE not in architectures:
        raise refuse("architectures", f"expected {ARCHITECTURE} (a causal LM with its lm_head)")
    if d.get("hidden_act", "silu") != "silu":
        raise refuse("hidden_act", "the engine's MLP is SwiGLU (silu); no other activation")
    for field in ("attention_bias", "mlp_bias"):
        if d.get(field):
            raise refuse(field, "the engine's projections have no biases")
    if d.get("rope_scaling") is not None:
        raise refuse(
            "rope_scaling",
            "RoPE scaling (linear, dynamic, llama3, yarn, ...) is not implemented by the engine; "
            "only plain RoPE models (rope_scaling null) can be imported",
        )
    rope_theta = d.get("rope_theta")
    rope_parameters = d.get("rope_parameters")  # transformers 5's spelling
    if rope_parameters is not None:
        rope_type = rope_parameters.get("rope_type", rope_parameters.get("type", "default"))
        if rope_type != "default":
            raise refuse(
                "rope_parameters",
                f'rope_type {rope_type!r} is not implemented by the engine; only "default"',
            )
        nested = rope_parameters.get("rope_theta")
        if nested is not None and rope_theta is not None and float(nested) != float(rope_theta):
            raise refuse("rope_theta", f"differs from rope_parameters.rope_theta ({nested})")
        rope_theta = nested if nested is not None else rope_theta
    missing = [
        f
        for f in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "vocab_size",
        )
        if d.get(f) is None
    ]
    if missing:
        raise HfFormatError(f"{source}: missing fields {missing}; a Llama config.json has them all")
    hidden, heads = d["hidden_size"], d["num_attention_heads"]
    head_dim = d.get("head_dim")
    if head_dim is not None and heads and hidden % heads == 0 and head_dim == hidden // heads:
        head_dim = None  # the default, as the engine spells it
    try:
        return LlamaConfig(
            seq_len=d.get("max_position_embeddings", 2048),
            hidden_dim=hidden,
            intermediate_dim=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=d.get("num_key_value_heads") or heads,
            vocab_size=d["vocab_size"],
            head_dim=head_dim,
            initializer_range=d.get("initializer_range", 0.02),
            # transformers' defaults where the file is silent (rms_norm_eps 1e-6, not the engine's 1e-5).
            layer_norm_epsilon=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta) if rope_theta is not None else 10000.0,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        )
    except ValueError as e:
        raise HfFormatError(f"{source}: {e}") from e


# ---------------------------------------------------------------------------------------
# tensors


def _engine_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Each engine parameter's shape, by its path ("layers/q_proj", ...)."""
    d, i, hd, n = (
        config.hidden_dim,
        config.intermediate_dim,
        config.actual_head_dim,
        config.num_layers,
    )
    h, kv, v = config.num_heads, config.num_kv_heads, config.vocab_size
    if v is None:
        raise HfFormatError(
            "LlamaConfig.vocab_size is unset: set it from the tokenizer (config.with_vocab(n)) "
            "before exporting"
        )
    shapes = {
        "token_embedding": (v, d),
        "layers/attn_norm": (n, d),
        "layers/q_proj": (n, d, h * hd),
        "layers/k_proj": (n, d, kv * hd),
        "layers/v_proj": (n, d, kv * hd),
        "layers/o_proj": (n, h * hd, d),
        "layers/mlp_norm": (n, d),
        "layers/gate_proj": (n, d, i),
        "layers/up_proj": (n, d, i),
        "layers/down_proj": (n, i, d),
        "final_norm": (d,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head"] = (d, v)
    return shapes


def hf_tensor_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Each tensor's name and shape in a transformers LlamaForCausalLM state dict."""
    engine = _engine_shapes(config)
    shapes = {EMBED_TOKENS: engine["token_embedding"], FINAL_NORM: engine["final_norm"]}
    for layer in range(config.num_layers):
        for key, (name, transposed) in LAYER_TENSORS.items():
            shape = engine[f"layers/{key}"][1:]
            shapes[f"model.layers.{layer}.{name}"] = shape[::-1] if transposed else shape
    if not config.tie_word_embeddings:
        shapes[LM_HEAD] = engine["lm_head"][::-1]
    return shapes


def _dtype(dtype: Any) -> np.dtype | None:
    if dtype is None:
        return None
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name not in DTYPES:
        raise HfFormatError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[name]


def _flat_params(params: Params) -> dict[str, np.ndarray]:
    flat = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        flat["/".join(str(getattr(k, "key", k)) for k in path)] = np.asarray(jax.device_get(leaf))
    return flat


def to_hf_tensors(params: Params, config: LlamaConfig, dtype: Any = None) -> dict[str, np.ndarray]:
    """The engine's parameters as transformers names them, each C-contiguous.

    `dtype` (float32, bfloat16, float16) casts every tensor; None keeps each one's dtype.
    """
    target = _dtype(dtype)
    flat = _flat_params(params)
    expected = _engine_shapes(config)
    missing = sorted(set(expected) - set(flat))
    unexpected = sorted(set(flat) - set(expected))
    if missing or unexpected:
        tied = " (tie_word_embeddings is set, so there is no lm_head)" * ("lm_head" in unexpected)
        raise HfFormatError(
            f"parameters do not match the config: missing {missing}, unexpected {unexpected}"
            f"{tied}; export the params with the LlamaConfig they were trained with"
        )
    for path, shape in expected.items():
        if flat[path].shape != shape:
            raise HfFormatError(
                f"parameter {path!r} has shape {flat[path].shape}, the config implies {shape}; "
                "export the params with the LlamaConfig they were trained with"
            )
        if flat[path].dtype.name not in DTYPES:
            raise HfFormatError(
                f"parameter {path!r} is {flat[path].dtype}; only {sorted(DTYPES)} can be exported"
            )

    def out(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x if target is None else x.astype(target))

    tensors = {EMBED_TOKENS: out(flat["token_embedding"])}
    for layer in range(config.num_layers):
        for key, (name, transposed) in LAYER_TENSORS.items():
            x = flat[f"layers/{key}"][layer]
            tensors[f"model.layers.{layer}.{name}"] = out(x.T if transposed else x)
    tensors[FINAL_NORM] = out(flat["final_norm"])
    if not config.tie_word_embeddings:
        tensors[LM_HEAD] = out(flat["lm_head"].T)
    return tensors


def from_hf_tensors(
    tensors: Mapping[str, np.ndarray], config: LlamaConfig, source: str = "the folder"
) -> Params:
    """The engine's parameters from a transformers state dict; names and shapes are checked.

    A tied model's `lm_head.weight`, when the file has one, must equal the embedding.
    """
    names = {n for n in tensors if not n.endswith(_IGNORED_SUFFIXES)}
    expected = hf_tensor_shapes(config)
    if config.tie_word_embeddings and LM_HEAD in names:
        if not np.array_equal(tensors[LM_HEAD], tensors.get(EMBED_TOKENS)):
            raise HfFormatError(
                f"{source}: tie_word_embeddings is true but {LM_HEAD} differs from "
                f"{EMBED_TOKENS}; set tie_word_embeddings false in config.json to keep both"
            )
        names.discard(LM_HEAD)
    missing = sorted(set(expected) - names, key=_natural)
    if missing:
        raise HfFormatError(
            f"{source}: missing tensors {_few(missing)} for the Llama of config.json "
            f"({config.num_layers} layers, tie_word_embeddings={config.tie_word_embeddings}); "
            "is the folder complete, and does config.json describe these weights?"
        )
    unexpected = sorted(names - set(expected), key=_natural)
    if unexpected:
        raise HfFormatError(
            f"{source}: unexpected tensors {_few(unexpected)}: the engine's Llama has no such "
            "parameters (biases, extra layers or another architecture); they cannot be imported"
        )
    for name, shape in expected.items():
        got = tuple(tensors[name].shape)
        if got != shape:
            raise HfFormatError(
                f"{source}: tensor {name} has shape {got}, config.json implies {shape} "
                "(torch Linear layout: [out_features, in_features]); does config.json "
                "describe these weights?"
            )

    def stacked(key: str) -> np.ndarray:
        name, transposed = LAYER_TENSORS[key]
        per_layer = [tensors[f"model.layers.{i}.{name}"] for i in range(config.num_layers)]
        return np.stack([x.T if transposed else x for x in per_layer])

    params: Params = {
        "token_embedding": jnp.asarray(tensors[EMBED_TOKENS]),
        "layers": {key: jnp.asarray(stacked(key)) for key in LAYER_TENSORS},
        "final_norm": jnp.asarray(tensors[FINAL_NORM]),
    }
    if not config.tie_word_embeddings:
        params["lm_head"] = jnp.asarray(np.ascontiguousarray(tensors[LM_HEAD].T))
    return params


def _natural(name: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in name.split(".")]


def _few(names: list[str], n: int = 6) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


# ---------------------------------------------------------------------------------------
# the tokenizer


# Padding tokens by the names tokenizers give them (Llama/SentencePiece, BERT, GPT-style).
PAD_TOKENS = ("<pad>", "[PAD]", "<|pad|>", "<|padding|>")


@dataclasses.dataclass(frozen=True)
class HfTokenizer:
    """A tokenizer as a Hugging Face folder holds it: its files (name -> text) and the special
    token ids config.json names."""

    files: Mapping[str, str]
    bos_token_id: int | None
    eos_token_id: int | None
    vocab_size: int


def hf_tokenizer(spec: str, model_max_length: int | None = None) -> HfTokenizer:
    """The files that make `AutoTokenizer.from_pretrained(folder)` load the tokenizer at
    `spec` (a tokenizer.json, or a folder holding one: a tokenizer asset's output).

    tokenizer.json is copied as it is; tokenizer_config.json (transformers', not the
    training record a tokenizer asset keeps under that name) names PreTrainedTokenizerFast
    and the special tokens. EOS is the one the folder's tokenizer_config.json names, else found
    as the token cache finds it (`find_eos_id`); BOS is the token the tokenizer's template puts
    before every encoding, if any.
    """
    from marin_dagster.tokenize.tokenizer import (
        TOKENIZER_FILE,
        find_eos_id,
        load_tokenizer,
        read_tokenizer_config,
        vocab_size,
    )

    path = fs.normalize(spec)
    tokenizer_json = path if path.endswith(".json") else fs.join(path, TOKENIZER_FILE)
    try:
        tok = load_tokenizer(tokenizer_json)
    except ValueError as e:  # not a tokenizer.json; a missing one is a FileNotFoundError
        raise HfFormatError(str(e)) from e
    # A folder may name its EOS in tokenizer_config.json (a tokenizer asset's, a train
    # output's, transformers'): a token the known names miss, such as <|im_end|>.
    recorded = None if path.endswith(".json") else (read_tokenizer_config(path) or {})
    named = recorded.get("eos_token") if recorded else None
    eos_id = find_eos_id(
        tok, named if isinstance(named, str) and tok.token_to_id(named) is not None else None
    )
    # A token the template puts before the text (Llama's <s>, Llama 3's <|begin_of_text|>).
    plain = tok.encode("a", add_special_tokens=False).ids
    templated = tok.encode("a").ids
    bos_id = templated[0] if templated[1 : len(plain) + 1] == plain else None

    def token(token_id: int | None) -> str | None:
        return None if token_id is None else tok.id_to_token(token_id)

    # transformers reads unk/pad from the config only: without them `tokenizer.pad_token` is
    # None and padding a batch fails, though tokenizer.json holds the token.
    unk = getattr(tok.model, "unk_token", None)
    pad = next((t for t in PAD_TOKENS if tok.token_to_id(t) is not None), None)
    special = {
        "bos_token": token(bos_id),
        "eos_token": token(eos_id),
        "unk_token": unk if unk and tok.token_to_id(unk) is not None else None,
        "pad_token": pad,
    }
    special = {k: v for k, v in special.items() if v is not None}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        **special,
    }
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    files = {
        TOKENIZER_FILE: fs.read_bytes(tokenizer_json).decode("utf-8"),
        "tokenizer_config.json": json.dumps(config, indent=2, sort_keys=True) + "\n",
        "special_tokens_map.json": json.dumps(special, indent=2, sort_keys=True) + "\n",
    }
    return HfTokenizer(files, bos_id, eos_id, vocab_size(tok))


# ---------------------------------------------------------------------------------------
# folders


def export_hf(
    source: Params | str,
    out_dir: str,
    *,
    config: LlamaConfig | None = None,
    dtype: Any = None,
    overwrite: bool = False,
    tokenizer: str | None = None,
) -> str:
    """Write `out_dir` as a transformers LlamaForCausalLM folder (config.json, model.safetensors).

    `source` is a params dict (with its `config`), or a checkpoint path as `evaluate` takes
    it: a train output (params.npz + model_config.json) or an orbax step directory
    `{output}/checkpoints/{step}`. `dtype` (float32, bfloat16, float16) casts the weights;
    None keeps theirs (float32 for the engine's). An existing non-empty `out_dir` is
    refused unless `overwrite`. `tokenizer` (a tokenizer.json or a folder holding one) adds
    its files (`hf_tokenizer`) and sets config.json's bos/eos_token_id; without it they are
    null. The folder appears whole: locally it is written beside `out_dir` and renamed into
    place; on an object store config.json is uploaded last, so a folder without one is
    incomplete. Returns `out_dir`, normalized.
    """
    out_dir = fs.normalize(out_dir)
    _check_free(out_dir, overwrite)  # before reading a checkpoint that may be large
    if isinstance(source, str):
        from marin_dagster.levanter.evaluation import load_model

        loaded, params = load_model(source)
        if config is not None and config != loaded:
            raise HfFormatError(
                f"config given ({config}) differs from the checkpoint's ({loaded}) in {source}; "
                "leave config out to use the checkpoint's"
            )
        config = loaded
    else:
        if config is None:
            raise HfFormatError("export_hf(params, ...) needs the LlamaConfig: pass config=")
        params = source
    tensors = to_hf_tensors(params, config, dtype)
    torch_dtype = tensors[EMBED_TOKENS].dtype.name
    hf_tok = None if tokenizer is None else hf_tokenizer(tokenizer, config.seq_len)
    if (
        hf_tok is not None
        and config.vocab_size is not None
        and hf_tok.vocab_size > config.vocab_size
    ):
        raise HfFormatError(
            f"the tokenizer {tokenizer} has {hf_tok.vocab_size} ids, the model's vocabulary "
            f"{config.vocab_size}: it is not the tokenizer the model was trained with"
        )
    bos, eos = (hf_tok.bos_token_id, hf_tok.eos_token_id) if hf_tok else (None, None)
    cfg = hf_config(config, torch_dtype, bos_token_id=bos, eos_token_id=eos)
    config_json = json.dumps(cfg, indent=2, sort_keys=True) + "\n"
    files = {**(hf_tok.files if hf_tok else {}), CONFIG_FILE: config_json}
    # safetensors' "format" metadata: transformers refuses files without a known one.
    metadata = {"format": "pt"}
    if fs.is_local(out_dir):
        _write_local(out_dir, tensors, metadata, files, overwrite)
    else:
        _write_remote(out_dir, tensors, metadata, files, overwrite)
    size = sum(x.nbytes for x in tensors.values())
    logger.info(
        "exported %d tensors (%.1f MiB, %s) as a Hugging Face Llama folder: %s",
        len(tensors),
        size / 2**20,
        torch_dtype,
        out_dir,
    )
    return out_dir


def _check_free(out_dir: str, overwrite: bool) -> None:
    if overwrite or not fs.exists(out_dir):
        return
    filesystem, path = fs.url_to_fs(out_dir)
    if not filesystem.isdir(path):
        raise FileExistsError(f"{out_dir} exists and is not a folder; choose another output folder")
    if filesystem.ls(path):
        raise FileExistsError(
            f"{out_dir} exists and is not empty; choose another output folder or pass overwrite "
            "(--overwrite) to replace it"
        )


def _write_local(
    out_dir: str,
    tensors: dict[str, np.ndarray],
    metadata: dict[str, str],
    files: Mapping[str, str],
    overwrite: bool,
) -> None:
    parent, name = os.path.split(out_dir)
    os.makedirs(parent, exist_ok=True)
    # ".tmp-" marks it as an interrupted write's leftover (fs.is_temp_name).
    tmp = os.path.join(parent, f"{name}.tmp-{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    try:
        save_file(tensors, os.path.join(tmp, WEIGHTS_FILE), metadata=metadata)
        for file, text in files.items():
            with open(os.path.join(tmp, file), "w", encoding="utf-8") as f:
                f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        for file in (WEIGHTS_FILE, *files):
            # safetensors creates its file 0600; give all the mode a plain write would have.
            os.chmod(os.path.join(tmp, file), 0o666 & ~umask)
            with open(os.path.join(tmp, file), "rb") as f:
                os.fsync(f.fileno())
        if os.path.lexists(out_dir):
            if not overwrite and os.path.isdir(out_dir) and not os.listdir(out_dir):
                os.rmdir(out_dir)
            else:
                _check_free(out_dir, overwrite)  # another writer may have filled it meanwhile
                old = os.path.join(parent, f"{name}.tmp-old-{uuid.uuid4().hex[:8]}")
                os.rename(out_dir, old)
                os.rename(tmp, out_dir)
                _remove_local(old)
                return
        os.rename(tmp, out_dir)
    except BaseException:
        _remove_local(tmp)
        raise


def _remove_local(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def _write_remote(
    out_dir: str,
    tensors: dict[str, np.ndarray],
    metadata: dict[str, str],
    files: Mapping[str, str],
    overwrite: bool,
) -> None:
    if overwrite:
        fs.remove(out_dir, recursive=True)
    with fs.atomic_path(fs.join(out_dir, WEIGHTS_FILE)) as local:
        save_file(tensors, local, metadata=metadata)
    # config.json last: a folder without it is an unfinished export.
    for file in sorted(files, key=lambda name: name == CONFIG_FILE):
        fs.write_text(fs.join(out_dir, file), files[file])


def read_hf_tensors(folder: str) -> dict[str, np.ndarray]:
    """Every tensor of a folder's model.safetensors (or of the shards its index names)."""
    folder = fs.normalize(folder)
    single = fs.join(folder, WEIGHTS_FILE)
    if fs.exists(single):
        return _read_safetensors(single)
    index_path = fs.join(folder, WEIGHTS_INDEX_FILE)
    if not fs.exists(index_path):
        raise HfFormatError(
            f"{folder}: no {WEIGHTS_FILE} (nor {WEIGHTS_INDEX_FILE}); only safetensors weights "
            "are read: resave a pytorch_model.bin folder with transformers' "
            "save_pretrained(..., safe_serialization=True)"
        )
    weight_map = fs.read_json(index_path).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise HfFormatError(f"{index_path}: no weight_map; the index is malformed")
    tensors: dict[str, np.ndarray] = {}
    for file in sorted(set(weight_map.values())):
        shard = _read_safetensors(fs.join(folder, file))
        tensors.update(shard)
    absent = sorted(n for n, f in weight_map.items() if n not in tensors)
    if absent:
        raise HfFormatError(
            f"{index_path}: tensors {_few(absent)} are listed but not in their shard files"
        )
    return tensors


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
    try:
        data = fs.read_bytes(path)
    except FileNotFoundError:
        raise HfFormatError(f"{path}: file not found (named by the folder's index)") from None
    try:
        views = safetensors.deserialize(data)
    except Exception as e:
        raise HfFormatError(f"{path}: not a readable safetensors file ({e})") from e
    tensors = {}
    for name, view in views:
        dtype = _SAFETENSORS_DTYPES.get(view["dtype"])
        if dtype is None:
            raise HfFormatError(
                f"{path}: tensor {name} is {view['dtype']}; only F32, BF16 and F16 weights can "
                "be imported (dequantize a quantized model first)"
            )
        tensors[name] = np.frombuffer(view["data"], dtype=DTYPES[dtype]).reshape(view["shape"])
    return tensors


def import_hf(folder: str, *, dtype: Any = None) -> tuple[LlamaConfig, Params]:
    """The LlamaConfig and engine parameters of a transformers LlamaForCausalLM folder.

    `dtype` casts the parameters (e.g. "float32" to train on); None keeps the file's dtypes,
    so an exported folder comes back bit for bit.
    """
    folder = fs.normalize(folder)
    config_path = fs.join(folder, CONFIG_FILE)
    try:
        raw = fs.read_bytes(config_path)
    except FileNotFoundError:
        raise HfFormatError(
            f"{config_path}: not found; a Hugging Face model folder has config.json beside "
            "its weights (an object-store export without it did not finish)"
        ) from None
    try:
        d = json.loads(raw)
    except json.JSONDecodeError as e:
        raise HfFormatError(f"{config_path}: not valid JSON ({e})") from e
    config = config_from_hf(d, config_path)
    tensors = read_hf_tensors(folder)
    target = _dtype(dtype)
    if target is not None:
        tensors = {n: x.astype(target) for n, x in tensors.items()}
    return config, from_hf_tensors(tensors, config, folder)


def import_hf_to_dir(folder: str, out_dir: str, *, overwrite: bool = False) -> LlamaConfig:
    """Convert a Hugging Face Llama folder to the engine's params.npz + model_config.json
    (float32), which `evaluate` and `load_model` read as a train output."""
    from marin_dagster.levanter.checkpoint import save_params

    out_dir = fs.normalize(out_dir)
    params_path = fs.join(out_dir, "params.npz")
    if fs.exists(params_path) and not overwrite:
        raise FileExistsError(
            f"{params_path} exists; choose another output folder or pass overwrite (--overwrite)"
        )
    config, params = import_hf(folder, dtype="float32")
    # params.npz last: its presence means the pair is complete (load_model looks for it).
    fs.write_json(fs.join(out_dir, "model_config.json"), config.to_dict())
    save_params(params_path, params)
    return config
