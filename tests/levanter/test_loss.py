"""The chunked cross entropy: same values and gradients as the full logits, bounded memory."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marin_dagster.levanter import LlamaConfig
from marin_dagster.levanter.loss import chunk_length, cross_entropy_sum, token_cross_entropy
from marin_dagster.levanter.model import forward, init_params, loss_fn, token_losses


def _full_logits_sum(x, head, targets, weights):
    logits = x @ head
    target = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.sum(weights * (jax.nn.logsumexp(logits, axis=-1) - target))


def test_chunk_length() -> None:
    assert chunk_length(8, 256, 8192) == 256  # fits: one chunk
    assert chunk_length(64, 1024, 32000) == 64  # 2^27 / (64 * 32000) = 65 -> 64
    assert chunk_length(32, 1024, 128256) == 32
    assert chunk_length(3, 13, 40, max_elements=3 * 40 * 5) == 4
    assert chunk_length(4096, 8, 300_000) == 1


@pytest.mark.parametrize(
    "max_elements", [10**9, 3 * 40 * 4, 3 * 40]
)  # 1 chunk; 4 (padded 13 -> 16); 13
def test_values_and_gradients_match_full_logits(max_elements: int) -> None:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(3, 13, 16)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(16, 40)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, 40, (3, 13)), jnp.int32)
    weights = jnp.asarray(rng.random((3, 13)), jnp.float32)
    value, grads = jax.value_and_grad(cross_entropy_sum, argnums=(0, 1))(
        x, head, targets, weights, max_elements
    )
    ref_value, ref_grads = jax.value_and_grad(_full_logits_sum, argnums=(0, 1))(
        x, head, targets, weights
    )
    assert float(value) == pytest.approx(float(ref_value), rel=1e-6)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, r, atol=1e-5)
    # Not differentiated: the forward-only path, same value.
    assert float(cross_entropy_sum(x, head, targets, weights, max_elements)) == pytest.approx(
        float(ref_value), rel=1e-6
    )
    per_token = token_cross_entropy(x, head, targets, max_elements)
    np.testing.assert_allclose(jnp.sum(weights * per_token), ref_value, rtol=1e-6)


@pytest.mark.parametrize("max_elements", [10**9, 3 * 40])
def test_z_loss_values_and_gradients_match_full_logits(max_elements: int) -> None:
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(3, 13, 16)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(16, 40)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, 40, (3, 13)), jnp.int32)
    weights = jnp.asarray(rng.random((3, 13)), jnp.float32)
    z = 1e-2

    def reference(x, head):
        log_z = jax.nn.logsumexp(x @ head, axis=-1)
        return _full_logits_sum(x, head, targets, weights) + z * jnp.sum(weights * log_z**2)

    value, grads = jax.value_and_grad(cross_entropy_sum, argnums=(0, 1))(
        x, head, targets, weights, max_elements, z
    )
    ref_value, ref_grads = jax.value_and_grad(reference, argnums=(0, 1))(x, head)
    assert float(value) == pytest.approx(float(ref_value), rel=1e-6)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, r, atol=1e-5)
    # The z-loss is there: without it, value and gradients differ.
    plain = cross_entropy_sum(x, head, targets, weights, max_elements)
    assert float(value) - float(plain) > 0.1


def test_model_loss_is_the_mean_of_token_losses_and_of_full_logits() -> None:
    config = LlamaConfig(
        seq_len=16,
        hidden_dim=16,
        intermediate_dim=32,
        num_heads=4,
        num_kv_heads=2,
        num_layers=2,
        vocab_size=40,
    )
    params = init_params(config, jax.random.PRNGKey(0))
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 40, (2, 12)), jnp.int32)
    logits = forward(params, tokens, config)[:, :-1]
    full = (
        jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, tokens[:, 1:, None], -1)[..., 0]
    )
    np.testing.assert_allclose(token_losses(params, tokens, config), full, atol=1e-6)
    assert float(loss_fn(params, tokens, config)) == pytest.approx(float(jnp.mean(full)), rel=1e-6)


def test_a_128k_vocabulary_never_holds_all_logits() -> None:
    """Compiled (not run): the training step's scratch memory stays below one full set of
    float32 logits, where autodiff through the full logits needed about three."""
    config = LlamaConfig(
        seq_len=2048,
        hidden_dim=32,
        intermediate_dim=64,
        num_heads=2,
        num_kv_heads=2,
        num_layers=1,
        vocab_size=128256,
    )
    params = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0)))
    tokens = jax.ShapeDtypeStruct((2, 2048), jnp.int32)
    full_logits_bytes = 2 * 2048 * config.vocab_size * 4
    for dtype in (jnp.float32, jnp.bfloat16):
        step = jax.jit(jax.value_and_grad(lambda p, t, d=dtype: loss_fn(p, t, config, d)))
        temp = step.lower(params, tokens).compile().memory_analysis().temp_size_in_bytes
        assert temp < 0.75 * full_logits_bytes, (dtype, temp / 2**30)
