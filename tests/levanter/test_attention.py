"""Attention through jax.nn.dot_product_attention against the plain formula it replaced."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marin_dagster.levanter import LlamaConfig
from marin_dagster.levanter.attention import causal_attention, cudnn_applies, reference_attention
from marin_dagster.levanter.model import forward, init_params

# Grouped-query (8 query heads over 2 kv heads), a sequence long enough for real masking.
CONFIG = LlamaConfig(
    seq_len=64,
    hidden_dim=64,
    intermediate_dim=128,
    num_heads=8,
    num_kv_heads=2,
    num_layers=3,
    vocab_size=97,
)


@pytest.mark.parametrize("kv_heads", [2, 8])
def test_model_logits_match_the_reference_attention_in_float32(kv_heads: int) -> None:
    config = dataclasses.replace(CONFIG, num_kv_heads=kv_heads)
    params = init_params(config, jax.random.PRNGKey(0))
    # Larger weights than the init's 0.02 so attention is far from uniform and a wrong mask shows.
    params = jax.tree.map(lambda x: x * 10 if x.ndim == 3 else x, params)
    tokens = jnp.asarray(
        np.random.default_rng(1).integers(0, config.vocab_size, (3, 64)), jnp.int32
    )
    old = forward(params, tokens, config, attention_impl="reference")
    # "auto" is einsum_attention on the CPU; "xla" is XLA's dot_product_attention.
    for implementation in ("auto", "xla", "einsum"):
        new = forward(params, tokens, config, attention_impl=implementation)
        assert float(jnp.max(jnp.abs(new - old))) <= 1e-5, implementation
    assert float(jnp.std(old)) > 0.1  # the comparison is not between near-constant logits


@pytest.mark.parametrize("implementation", ["auto", "xla", "einsum"])
def test_attention_is_causal_and_grouped(implementation: str) -> None:
    rng = np.random.default_rng(2)
    q = jnp.asarray(rng.normal(size=(2, 16, 4, 8)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(2, 16, 2, 8)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(2, 16, 2, 8)), jnp.float32)
    out = causal_attention(q, k, v, implementation)
    np.testing.assert_allclose(out, reference_attention(q, k, v), atol=1e-6)
    # Changing position 10's keys and values changes nothing before it.
    k2, v2 = k.at[:, 10].add(1.0), v.at[:, 10].add(1.0)
    out2 = causal_attention(q, k2, v2, implementation)
    np.testing.assert_allclose(out[:, :10], out2[:, :10], atol=1e-6)
    assert not np.allclose(out[:, 10:], out2[:, 10:])
    # Query heads 0-1 use kv head 0, heads 2-3 kv head 1: repeating the kv heads is the same.
    mha = causal_attention(q, jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2), implementation)
    np.testing.assert_allclose(out, mha, atol=1e-6)


@pytest.mark.parametrize("implementation", ["auto", "xla", "einsum"])
def test_gradients_match_the_reference(implementation: str) -> None:
    rng = np.random.default_rng(3)
    q, k, v = (
        jnp.asarray(rng.normal(size=s), jnp.float32)
        for s in ((2, 12, 4, 8), (2, 12, 2, 8), (2, 12, 2, 8))
    )
    grads = jax.grad(
        lambda *a: jnp.sum(jnp.sin(causal_attention(*a, implementation))), argnums=(0, 1, 2)
    )(q, k, v)
    ref = jax.grad(lambda *a: jnp.sum(jnp.sin(reference_attention(*a))), argnums=(0, 1, 2))(q, k, v)
    for g, r in zip(grads, ref, strict=True):
        np.testing.assert_allclose(g, r, atol=1e-5)


def test_cudnn_only_where_it_applies() -> None:
    q = jnp.zeros((1, 8, 2, 64), jnp.bfloat16)
    on_nvidia = jax.devices()[0].platform == "gpu"
    assert cudnn_applies(q) is on_nvidia
    assert not cudnn_applies(q.astype(jnp.float32))  # float32: XLA's path, even on a GPU
    with pytest.raises(ValueError, match="implementation must be one of"):
        causal_attention(q, q, q, "flash")
