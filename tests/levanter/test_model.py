"""The Llama model: shapes, causality, GQA, tied embeddings, bfloat16 compute, parameter count."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marin_dagster.levanter import LlamaConfig, llama_150m, llama_nano, llama_small_shakespeare
from marin_dagster.levanter.model import apply_rope, forward, init_params, loss_fn, rope_tables

TINY = LlamaConfig(
    seq_len=16,
    hidden_dim=16,
    intermediate_dim=32,
    num_heads=4,
    num_kv_heads=2,
    num_layers=2,
    vocab_size=40,
)


def _tokens(b: int = 2, t: int = 12, seed: int = 0) -> jnp.ndarray:
    return jnp.asarray(
        np.random.default_rng(seed).integers(0, TINY.vocab_size, size=(b, t)), jnp.int32
    )


def test_named_configs_have_marins_sizes() -> None:
    assert (
        llama_nano.seq_len,
        llama_nano.hidden_dim,
        llama_nano.intermediate_dim,
        llama_nano.num_heads,
        llama_nano.num_kv_heads,
        llama_nano.num_layers,
    ) == (512, 32, 128, 2, 2, 2)
    assert (
        llama_150m.seq_len,
        llama_150m.hidden_dim,
        llama_150m.intermediate_dim,
        llama_150m.num_heads,
        llama_150m.num_kv_heads,
        llama_150m.num_layers,
    ) == (1024, 512, 1792, 8, 8, 6)
    n = llama_small_shakespeare.with_vocab(8192).num_parameters()
    assert 10e6 <= n <= 20e6, n


@pytest.mark.parametrize("tied", [False, True])
def test_parameter_count_matches_the_arrays(tied: bool) -> None:
    config = dataclasses.replace(TINY, tie_word_embeddings=tied)
    params = init_params(config, jax.random.PRNGKey(0))
    assert ("lm_head" in params) is not tied
    assert sum(x.size for x in jax.tree.leaves(params)) == config.num_parameters()
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))


def test_logits_shape_and_causality() -> None:
    params = init_params(TINY, jax.random.PRNGKey(1))
    tokens = _tokens()
    logits = forward(params, tokens, TINY)
    assert logits.shape == (2, 12, TINY.vocab_size) and logits.dtype == jnp.float32
    # Changing a later token must not change any earlier position's logits.
    changed = tokens.at[:, 8].set((tokens[:, 8] + 1) % TINY.vocab_size)
    other = forward(params, changed, TINY)
    np.testing.assert_allclose(logits[:, :8], other[:, :8], rtol=1e-6, atol=1e-6)
    assert not np.allclose(logits[:, 8:], other[:, 8:])


def test_gqa_equals_multi_head_attention_with_repeated_kv_heads() -> None:
    gqa = TINY
    mha = dataclasses.replace(TINY, num_kv_heads=TINY.num_heads)
    params = init_params(gqa, jax.random.PRNGKey(2))
    hd, groups = gqa.actual_head_dim, gqa.num_heads // gqa.num_kv_heads
    expanded = dict(params["layers"])
    for name in ("k_proj", "v_proj"):
        w = params["layers"][name]  # (L, D, kv*hd)
        w = w.reshape(w.shape[0], w.shape[1], gqa.num_kv_heads, 1, hd)
        expanded[name] = jnp.broadcast_to(w, (*w.shape[:3], groups, hd)).reshape(
            w.shape[0], w.shape[1], -1
        )
    mha_params = {**params, "layers": expanded}
    tokens = _tokens(seed=3)
    np.testing.assert_allclose(
        forward(params, tokens, gqa), forward(mha_params, tokens, mha), rtol=1e-5, atol=1e-5
    )


def test_rope_scores_depend_only_on_relative_position() -> None:
    rng = np.random.default_rng(4)
    hd, t = 8, 12
    q = jnp.asarray(np.broadcast_to(rng.normal(size=hd), (1, t, 1, hd)), jnp.float32)
    k = jnp.asarray(np.broadcast_to(rng.normal(size=hd), (1, t, 1, hd)), jnp.float32)
    cos, sin = rope_tables(t, hd, 10000.0)
    qr, kr = apply_rope(q, cos, sin)[0, :, 0], apply_rope(k, cos, sin)[0, :, 0]
    scores = np.asarray(qr @ kr.T)
    # Same offset, same score; different offset, different score.
    assert scores[5, 2] == pytest.approx(scores[9, 6], rel=1e-5)
    assert scores[5, 2] != pytest.approx(scores[5, 4], rel=1e-3)
    # Position 0 is not rotated.
    np.testing.assert_allclose(qr[0], q[0, 0, 0], rtol=1e-6)


def test_bfloat16_compute_is_close_to_float32() -> None:
    params = init_params(TINY, jax.random.PRNGKey(5))
    tokens = _tokens(seed=6)
    full = float(loss_fn(params, tokens, TINY))
    half = float(loss_fn(params, tokens, TINY, jnp.bfloat16))
    assert half != full
    assert abs(half - full) / full < 2e-2
    # Near-uniform predictions at init: the loss is about log(vocab).
    assert abs(full - np.log(TINY.vocab_size)) < 0.5


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("num_kv_heads", 3, "num_kv_heads"),
        ("hidden_dim", 18, "hidden_dim"),
        ("num_layers", 0, "num_layers"),
    ],
)
def test_bad_model_config_names_the_field(field: str, value: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(TINY, **{field: value})


def test_init_without_vocab_says_where_it_comes_from() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        init_params(llama_nano, jax.random.PRNGKey(0))


def test_qk_norm_normalizes_each_heads_queries_and_keys() -> None:
    """Qwen3's QK-norm: scaling a layer's q/k projections changes nothing (each head's queries
    and keys are RMS-normalized before RoPE), while the same scaling changes a plain Llama."""
    from marin_dagster.levanter import Qwen3Config

    qwen = Qwen3Config(
        max_seq_len=16,
        hidden_dim=16,
        intermediate_dim=32,
        num_heads=4,
        num_kv_heads=2,
        num_layers=2,
        vocab_size=40,
    )
    assert qwen.qk_norm and qwen.max_seq_len == 16 and qwen.rope_theta == 1e6
    params = init_params(qwen, jax.random.PRNGKey(3))
    assert params["layers"]["q_norm"].shape == (2, 4) and params["layers"]["k_norm"].shape == (2, 4)
    assert sum(x.size for x in jax.tree.leaves(params)) == qwen.num_parameters()
    tokens = _tokens()

    def scaled(p):
        layers = {
            **p["layers"],
            "q_proj": p["layers"]["q_proj"] * 30.0,
            "k_proj": p["layers"]["k_proj"] * 10.0,
        }
        return {**p, "layers": layers}

    np.testing.assert_allclose(
        forward(params, tokens, qwen), forward(scaled(params), tokens, qwen), rtol=2e-3, atol=2e-3
    )
    plain = dataclasses.replace(qwen, qk_norm=False)
    plain_params = {
        **params,
        "layers": {
            k: v
            for k, v in params["layers"].items()
            if "norm" not in k or k in ("attn_norm", "mlp_norm")
        },
    }
    assert not np.allclose(
        forward(plain_params, tokens, plain),
        forward(scaled(plain_params), tokens, plain),
        atol=1e-3,
    )
    # The gains are used: a changed q_norm changes the logits.
    bumped = {**params, "layers": {**params["layers"], "q_norm": params["layers"]["q_norm"] * 3.0}}
    assert not np.allclose(forward(params, tokens, qwen), forward(bumped, tokens, qwen), atol=1e-4)
