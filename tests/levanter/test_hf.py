"""Hugging Face interop: export -> import returns the same bits, and the exported folder, read
by a numpy LlamaForCausalLM written here from config.json and the tensors alone, gives the
engine's logits. transformers and torch are not installed: `hf_logits` below is the check."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from marin_dagster.levanter import LlamaConfig, TrainerSettings, TrainLmConfig, train
from marin_dagster.levanter.checkpoint import load_params
from marin_dagster.levanter.evaluation import load_model
from marin_dagster.levanter.hf import (
    HfFormatError,
    config_from_hf,
    export_hf,
    hf_config,
    import_hf,
    import_hf_to_dir,
)
from marin_dagster.levanter.model import forward, init_params
from tests.cli.sql_server import MARIN
from tests.conftest import subprocess_env
from tests.levanter.caches import write_cache

# Grouped-query attention (2 query heads per kv head), 2 layers, a separate lm_head, and a small
# rope_theta so positions rotate far within 16 tokens.
GQA = LlamaConfig(
    seq_len=16,
    hidden_dim=32,
    intermediate_dim=48,
    num_heads=4,
    num_kv_heads=2,
    num_layers=2,
    vocab_size=61,
    rope_theta=100.0,
)
# Multi-query (1 kv head for 4), head_dim 8 != hidden/heads = 6, 3 layers, tied embeddings.
TIED = LlamaConfig(
    seq_len=16,
    hidden_dim=24,
    intermediate_dim=40,
    num_heads=4,
    num_kv_heads=1,
    head_dim=8,
    num_layers=3,
    vocab_size=50,
    tie_word_embeddings=True,
    layer_norm_epsilon=1e-6,
)
CONFIGS = {"gqa": GQA, "tied": TIED}


def random_params(config: LlamaConfig, seed: int = 0) -> dict:
    """Parameters far from init (unit-scale activations, norm weights away from 1), so a wrong
    RoPE layout, head grouping or transpose moves the logits by much more than the tolerance."""
    rng = np.random.default_rng(seed)
    shapes = init_params(config, jax.random.PRNGKey(0))

    def draw(path, x):
        name = str(getattr(path[-1], "key", path[-1]))
        if name.endswith("norm"):
            value = 1.0 + 0.5 * rng.standard_normal(x.shape)
        elif name == "token_embedding":
            value = rng.standard_normal(x.shape)
        else:  # (in, out) matrices: unit-variance outputs for unit-variance inputs
            value = rng.standard_normal(x.shape) / np.sqrt(x.shape[-2])
        return jnp.asarray(value, jnp.float32)

    return jax.tree_util.tree_map_with_path(draw, shapes)


def assert_bitwise_equal(a: dict, b: dict) -> None:
    flat_a = dict(jax.tree_util.tree_flatten_with_path(a)[0])
    flat_b = dict(jax.tree_util.tree_flatten_with_path(b)[0])
    assert flat_a.keys() == flat_b.keys()
    for path, x in flat_a.items():
        y = flat_b[path]
        assert x.dtype == y.dtype and x.shape == y.shape, path
        x, y = np.asarray(x), np.asarray(y)
        assert x.tobytes() == y.tobytes(), path


# ---------------------------------------------------------------------------------------
# A LlamaForCausalLM forward pass in numpy (float64), from the folder only.


def hf_logits(folder: str, tokens: np.ndarray, *, variant: str = "hf") -> np.ndarray:
    """transformers' LlamaForCausalLM arithmetic: RMSNorm, rotate_half RoPE, GQA (repeat_kv)
    with a causal mask, SwiGLU, lm_head. `variant` breaks one convention on purpose
    ("interleaved_rope", "tiled_kv") to show the comparison can tell."""
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    w = {
        k: v.astype(np.float64)
        for k, v in safetensors.numpy.load_file(os.path.join(folder, "model.safetensors")).items()
    }
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // h
    eps = cfg["rms_norm_eps"]
    b, t = tokens.shape

    def rms_norm(x, weight):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight

    def linear(x, name):  # torch Linear: y = x W^T, W is (out, in)
        return x @ w[name].T

    inv_freq = 1.0 / cfg["rope_theta"] ** (np.arange(0, hd, 2) / hd)
    freqs = np.arange(t)[:, None] * inv_freq[None, :]  # (T, hd/2)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[None, None], np.sin(emb)[None, None]  # (1, 1, T, hd)

    def rope(x):  # x: (B, heads, T, hd)
        if variant == "interleaved_rope":  # GPT-J / Meta's complex pairs: (0,1), (2,3), ...
            pairs = x.reshape(*x.shape[:-1], hd // 2, 2)
            c, s = np.cos(freqs)[None, None], np.sin(freqs)[None, None]
            x0, x1 = pairs[..., 0], pairs[..., 1]
            return np.stack([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1).reshape(x.shape)
        rotated = np.concatenate([-x[..., hd // 2 :], x[..., : hd // 2]], axis=-1)
        return x * cos + rotated * sin

    def heads(x, n):  # (B, T, n*hd) -> (B, n, T, hd)
        return x.reshape(b, t, n, hd).transpose(0, 2, 1, 3)

    x = w["model.embed_tokens.weight"][tokens]
    causal = np.tril(np.ones((t, t), dtype=bool))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        y = rms_norm(x, w[p + "input_layernorm.weight"])
        q = rope(heads(linear(y, p + "self_attn.q_proj.weight"), h))
        k = rope(heads(linear(y, p + "self_attn.k_proj.weight"), kv))
        v = heads(linear(y, p + "self_attn.v_proj.weight"), kv)
        if variant == "tiled_kv":  # kv head j % kv instead of HF's j // (h / kv)
            k, v = np.tile(k, (1, h // kv, 1, 1)), np.tile(v, (1, h // kv, 1, 1))
        else:  # repeat_kv
            k, v = np.repeat(k, h // kv, axis=1), np.repeat(v, h // kv, axis=1)
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
        scores = np.where(causal, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = (probs @ v).transpose(0, 2, 1, 3).reshape(b, t, h * hd)
        x = x + linear(attn, p + "self_attn.o_proj.weight")
        y = rms_norm(x, w[p + "post_attention_layernorm.weight"])
        gate = linear(y, p + "mlp.gate_proj.weight")
        silu = gate / (1.0 + np.exp(-gate))
        x = x + linear(silu * linear(y, p + "mlp.up_proj.weight"), p + "mlp.down_proj.weight")
    x = rms_norm(x, w["model.norm.weight"])
    head = w.get("lm_head.weight")
    if head is None:
        assert cfg["tie_word_embeddings"]
        head = w["model.embed_tokens.weight"]
    return x @ head.T


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_exported_folder_gives_the_engines_logits(name: str, tmp_path) -> None:
    config = CONFIGS[name]
    params = random_params(config)
    folder = export_hf(params, str(tmp_path / "hf"), config=config)
    assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors"]
    tokens = np.random.default_rng(1).integers(0, config.vocab_size, size=(2, config.seq_len))
    engine = np.asarray(
        forward(params, jnp.asarray(tokens, jnp.int32), config, jnp.float32, attention_impl="xla")
    )
    reference = hf_logits(folder, tokens)
    assert engine.shape == reference.shape == (2, config.seq_len, config.vocab_size)
    assert np.abs(reference).max() > 1.0  # logits of a real size, not all near zero
    np.testing.assert_allclose(engine, reference, rtol=0, atol=1e-4)
    # The check can fail: one convention changed in the reference moves the logits far.
    # (With one kv head, as TIED has, every grouping is the same: only GQA can tell them apart.)
    variants = ["interleaved_rope"] + ["tiled_kv"] * (config.num_kv_heads > 1)
    for variant in variants:
        assert np.abs(hf_logits(folder, tokens, variant=variant) - engine).max() > 1e-2, variant


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_round_trip_is_bitwise(name: str, dtype: str, tmp_path) -> None:
    config = CONFIGS[name]
    params = jax.tree.map(lambda x: x.astype(dtype), random_params(config, seed=3))
    folder = export_hf(params, str(tmp_path / "hf"), config=config)
    with open(os.path.join(folder, "config.json")) as f:
        written = json.load(f)
    assert written["torch_dtype"] == dtype
    modes = {os.stat(os.path.join(folder, f)).st_mode & 0o777 for f in os.listdir(folder)}
    assert len(modes) == 1  # the weights as readable as config.json (safetensors makes 0600)
    assert written["architectures"] == ["LlamaForCausalLM"] and written["model_type"] == "llama"
    assert written["head_dim"] == config.actual_head_dim
    assert written["tie_word_embeddings"] is config.tie_word_embeddings
    imported_config, imported = import_hf(folder)
    assert imported_config == config
    assert_bitwise_equal(params, imported)


def test_tensor_names_and_torch_layout(tmp_path) -> None:
    params = random_params(GQA)
    folder = export_hf(params, str(tmp_path / "hf"), config=GQA, dtype="bfloat16")
    with open(os.path.join(folder, "model.safetensors"), "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
    assert header.pop("__metadata__") == {"format": "pt"}
    d, i, hd, v = 32, 48, 8, 61
    expected = {
        "model.embed_tokens.weight": [v, d],
        "model.norm.weight": [d],
        "lm_head.weight": [v, d],
    }
    for layer in range(2):
        p = f"model.layers.{layer}."
        expected |= {
            p + "self_attn.q_proj.weight": [4 * hd, d],
            p + "self_attn.k_proj.weight": [2 * hd, d],
            p + "self_attn.v_proj.weight": [2 * hd, d],
            p + "self_attn.o_proj.weight": [d, 4 * hd],
            p + "mlp.gate_proj.weight": [i, d],
            p + "mlp.up_proj.weight": [i, d],
            p + "mlp.down_proj.weight": [d, i],
            p + "input_layernorm.weight": [d],
            p + "post_attention_layernorm.weight": [d],
        }
    assert {n: h["shape"] for n, h in header.items()} == expected
    assert {h["dtype"] for h in header.values()} == {"BF16"}
    tensors = import_hf(folder)[1]
    # Layer 1's q_proj is the transpose of the engine's matrix, rounded to bfloat16.
    np.testing.assert_array_equal(
        np.asarray(tensors["layers"]["q_proj"][1]),
        np.asarray(params["layers"]["q_proj"][1]).astype(ml_dtypes.bfloat16),
    )
    config, as_f32 = import_hf(folder, dtype="float32")
    assert as_f32["lm_head"].dtype == jnp.float32 and config == GQA


def test_sharded_folder_and_object_store(tmp_path) -> None:
    params = random_params(GQA, seed=4)
    folder = export_hf(params, str(tmp_path / "hf"), config=GQA)
    # Split into two shards with an index, as save_pretrained does for big models.
    tensors = safetensors.numpy.load_file(os.path.join(folder, "model.safetensors"))
    os.remove(os.path.join(folder, "model.safetensors"))
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[:7],
        "model-00002-of-00002.safetensors": names[7:],
    }
    for file, part in shards.items():
        safetensors.numpy.save_file({n: tensors[n] for n in part}, os.path.join(folder, file))
    index = {"weight_map": {n: f for f, part in shards.items() for n in part}}
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    assert_bitwise_equal(params, import_hf(folder)[1])

    url = "memory://hf-test/exported"
    try:
        assert export_hf(params, url, config=GQA) == url
        config, imported = import_hf(url)
        assert config == GQA
        assert_bitwise_equal(params, imported)
        with pytest.raises(FileExistsError, match="overwrite"):
            export_hf(params, url, config=GQA)
        export_hf(jax.tree.map(lambda x: x * 2, params), url, config=GQA, overwrite=True)
        assert np.array_equal(import_hf(url)[1]["final_norm"], params["final_norm"] * 2)
    finally:
        import fsspec

        fsspec.filesystem("memory").rm("/hf-test", recursive=True)


# ---------------------------------------------------------------------------------------
# From the engine's own outputs: a train output and an orbax step directory, and the CLI.

VOCAB = 40
TRAIN_MODEL = LlamaConfig(
    seq_len=16, hidden_dim=16, intermediate_dim=32, num_heads=4, num_kv_heads=2, num_layers=2
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("hf_train")
    cache = write_cache(str(root / "cache"), VOCAB, 1000)
    out = str(root / "out")
    config = TrainLmConfig(
        model=TRAIN_MODEL,
        datasets={cache: 1.0},
        batch_size=2,
        num_train_steps=4,
        tokenizer_vocab_size=VOCAB,
        checkpoint_every_steps=2,
        max_eval_batches=1,
    )
    train(config, out, settings=TrainerSettings(checkpoint_every_minutes=None, sample_tokens=0))
    return out


def test_export_of_a_train_output_and_a_checkpoint(trained: str, tmp_path) -> None:
    config, imported = import_hf(export_hf(trained, str(tmp_path / "final")))
    assert config == TRAIN_MODEL.with_vocab(VOCAB)
    assert_bitwise_equal(load_params(os.path.join(trained, "params.npz")), imported)

    step_dir = os.path.join(trained, "checkpoints", "2")
    step_config, step_params = load_model(step_dir)
    config, imported = import_hf(export_hf(step_dir, str(tmp_path / "step2"), dtype="bfloat16"))
    assert config == step_config
    assert_bitwise_equal(jax.tree.map(lambda x: x.astype(jnp.bfloat16), step_params), imported)
    with pytest.raises(HfFormatError, match="differs from the checkpoint's"):
        export_hf(trained, str(tmp_path / "x"), config=TRAIN_MODEL.with_vocab(VOCAB + 1))


def _marin(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MARIN, *args],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def test_cli_export_and_import(trained: str, tmp_path) -> None:
    folder, back = str(tmp_path / "hf"), str(tmp_path / "back")
    done = _marin("export-hf", trained, folder, "--dtype", "bfloat16")
    assert done.returncode == 0, done.stderr
    assert folder in done.stdout and "bfloat16" in done.stdout
    refused = _marin("export-hf", trained, folder)
    assert refused.returncode == 1 and "--overwrite" in refused.stderr, refused.stderr
    done = _marin("import-hf", folder, back)
    assert done.returncode == 0, done.stderr
    # The import is a train output that evaluate/load_model read: float32, bf16-rounded.
    config, params = load_model(back)
    assert config == TRAIN_MODEL.with_vocab(VOCAB)
    rounded = jax.tree.map(
        lambda x: x.astype(jnp.bfloat16).astype(jnp.float32),
        load_params(os.path.join(trained, "params.npz")),
    )
    assert_bitwise_equal(rounded, params)
    bad = _marin("import-hf", str(tmp_path / "nowhere"), str(tmp_path / "b2"))
    assert bad.returncode == 1 and "config.json: not found" in bad.stderr, bad.stderr


# ---------------------------------------------------------------------------------------
# Clear errors.


@pytest.fixture
def folder(tmp_path) -> str:
    return export_hf(random_params(GQA), str(tmp_path / "hf"), config=GQA)


def _edit_config(folder: str, **changes) -> None:
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(path, "w") as f:
        json.dump(cfg, f)


def _edit_tensors(folder: str, edit) -> None:
    path = os.path.join(folder, "model.safetensors")
    tensors = dict(safetensors.numpy.load_file(path))
    edit(tensors)
    safetensors.numpy.save_file(tensors, path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "config.json: rope_scaling="),
        ({"rope_parameters": {"rope_type": "yarn"}}, "rope_type 'yarn' is not implemented"),
        ({"model_type": "mistral"}, "model_type='mistral'"),
        ({"architectures": ["LlamaModel"]}, "expected LlamaForCausalLM"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"attention_bias": True}, "attention_bias=True"),
        ({"hidden_size": None}, r"missing fields \['hidden_size'\]"),
        ({"num_key_value_heads": 3}, "must divide num_heads"),
    ],
)
def test_unsupported_config_fields_are_named(folder: str, changes: dict, message: str) -> None:
    _edit_config(folder, **changes)
    with pytest.raises(HfFormatError, match=message) as e:
        import_hf(folder)
    assert os.path.join(folder, "config.json") in str(e.value)


def test_transformers_5_rope_parameters_are_read() -> None:
    d = hf_config(GQA) | {"rope_parameters": {"rope_type": "default", "rope_theta": 100.0}}
    del d["rope_theta"]
    assert config_from_hf(d) == GQA
    # Keys transformers writes that do not change the arithmetic are ignored; defaults as theirs.
    d = {k: v for k, v in hf_config(GQA).items() if k not in ("rms_norm_eps", "head_dim")}
    assert config_from_hf(d | {"transformers_version": "4.46.0"}).layer_norm_epsilon == 1e-6


def test_missing_unexpected_and_misshapen_tensors_are_named(folder: str) -> None:
    _edit_tensors(folder, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(HfFormatError, match=r"missing tensors model\.layers\.1\.mlp\.up_proj"):
        import_hf(folder)
    _edit_tensors(
        folder,
        lambda t: t.update({"model.layers.1.mlp.up_proj.weight": np.zeros((48, 32), np.float32)}),
    )
    import_hf(folder)  # complete again

    _edit_tensors(
        folder,
        lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": np.zeros(32, np.float32)}),
    )
    with pytest.raises(
        HfFormatError, match=r"unexpected tensors model\.layers\.0\.self_attn\.q_proj\.bias"
    ):
        import_hf(folder)
    _edit_tensors(folder, lambda t: t.pop("model.layers.0.self_attn.q_proj.bias"))

    # Old transformers saved RoPE's inv_freq buffer; it is not a parameter and is skipped.
    _edit_tensors(
        folder,
        lambda t: t.update(
            {"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32)}
        ),
    )
    import_hf(folder)

    def transpose(t):
        name = "model.layers.0.self_attn.k_proj.weight"
        t[name] = np.ascontiguousarray(t[name].T)

    _edit_tensors(folder, transpose)
    with pytest.raises(
        HfFormatError, match=r"k_proj\.weight has shape \(32, 16\), config\.json implies \(16, 32\)"
    ) as e:
        import_hf(folder)
    assert folder in str(e.value)
    _edit_tensors(folder, lambda t: t.update({"model.norm.weight": np.ones(32, np.int8)}))
    with pytest.raises(HfFormatError, match="model.norm.weight is I8; only F32, BF16 and F16"):
        import_hf(folder)


def test_tied_lm_head_must_equal_the_embedding(tmp_path) -> None:
    folder = export_hf(random_params(TIED), str(tmp_path / "hf"), config=TIED)
    emb = safetensors.numpy.load_file(os.path.join(folder, "model.safetensors"))[
        "model.embed_tokens.weight"
    ]
    _edit_tensors(folder, lambda t: t.update({"lm_head.weight": emb.copy()}))
    import_hf(folder)  # transformers may keep the tied copy: accepted
    _edit_tensors(folder, lambda t: t.update({"lm_head.weight": emb + 1}))
    with pytest.raises(
        HfFormatError, match="tie_word_embeddings is true but lm_head.weight differs"
    ):
        import_hf(folder)


def test_bad_folders_and_bad_exports(folder: str, tmp_path) -> None:
    os.remove(os.path.join(folder, "model.safetensors"))
    with pytest.raises(HfFormatError, match="no model.safetensors .*save_pretrained"):
        import_hf(folder)
    os.remove(os.path.join(folder, "config.json"))
    with pytest.raises(HfFormatError, match="config.json: not found"):
        import_hf(folder)

    params = random_params(GQA)
    with pytest.raises(FileExistsError, match="not empty; .*overwrite"):
        export_hf(params, str(tmp_path), config=GQA)
    (tmp_path / "empty").mkdir()
    export_hf(params, str(tmp_path / "empty"), config=GQA)  # an empty folder is fine
    with pytest.raises(
        HfFormatError,
        match=r"'layers/attn_norm' has shape \(3, 32\), the config implies \(2, 32\)",
    ):
        export_hf(
            random_params(dataclasses.replace(GQA, num_layers=3)), str(tmp_path / "a"), config=GQA
        )
    with pytest.raises(
        HfFormatError, match=r"unexpected \['lm_head'\].*tie_word_embeddings is set"
    ):
        export_hf(
            params, str(tmp_path / "b"), config=dataclasses.replace(GQA, tie_word_embeddings=True)
        )
    with pytest.raises(HfFormatError, match="dtype must be one of"):
        export_hf(params, str(tmp_path / "c"), config=GQA, dtype="int8")
    with pytest.raises(HfFormatError, match="vocab_size is unset"):
        export_hf(params, str(tmp_path / "d"), config=dataclasses.replace(GQA, vocab_size=None))
    with pytest.raises(HfFormatError, match="needs the LlamaConfig"):
        export_hf(params, str(tmp_path / "e"))
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]  # no leftovers
    out = str(tmp_path / "imported")
    assert import_hf_to_dir(str(tmp_path / "empty"), out) == GQA
    with pytest.raises(FileExistsError, match="params.npz exists"):
        import_hf_to_dir(str(tmp_path / "empty"), out)


def test_an_unfinished_train_output_points_at_its_saved_steps(tmp_path) -> None:
    """A run stopped mid-training has checkpoints but no params.npz: export and evaluate said
    only "neither a train output nor an orbax step directory"."""
    out = tmp_path / "checkpoints" / "tiny-1a2b3c4d"
    for step in ("50", "100", "150.orbax-checkpoint-tmp-1"):  # the last one never finished
        (out / "checkpoints" / step).mkdir(parents=True)
    with pytest.raises(FileNotFoundError) as err:
        load_model(str(out))
    assert str(err.value).endswith(
        "; it looks like a train output that has not finished: its saved steps are 50, 100, "
        f"e.g. {out / 'checkpoints' / '100'} (a rerun of its step resumes from the last)"
    ), str(err.value)
    with pytest.raises(FileNotFoundError) as err:  # no checkpoints at all: no hint
        load_model(str(tmp_path / "nothing"))
    assert "saved steps" not in str(err.value)
