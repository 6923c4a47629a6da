"""The independent baseline of benchmarks/train.py computes what the engine computes.

benchmarks/baseline_llama.py is a hand-written JAX + optax Llama that imports nothing from the
engine; the training benchmark times the engine against it. These tests are what make that a
comparison of speed: on the same parameters (the engine's, converted) both give the same loss
and gradients, and the same parameters after optimizer steps (clipping, AdamW, decay mask,
schedule).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from benchmarks import baseline_llama as bl
from marin_dagster.levanter import AdamConfig, LlamaConfig
from marin_dagster.levanter.config import llama_nano
from marin_dagster.levanter.model import init_params, loss_fn

# Grouped-query attention (4 query heads over 2 kv heads), 3 layers, a real causal length.
GQA = LlamaConfig(
    seq_len=128,
    hidden_dim=64,
    intermediate_dim=160,
    num_heads=4,
    num_kv_heads=2,
    num_layers=3,
    vocab_size=300,
)


def shape_of(config: LlamaConfig) -> bl.Shape:
    return bl.Shape(
        vocab=config.vocab_size,
        dim=config.hidden_dim,
        ffn=config.intermediate_dim,
        layers=config.num_layers,
        heads=config.num_heads,
        kv_heads=config.num_kv_heads,
        eps=config.layer_norm_epsilon,
        rope_theta=config.rope_theta,
    )


def engine_params(config: LlamaConfig, seed: int = 0):
    params = init_params(config, jax.random.PRNGKey(seed))
    # Larger weights than the init's 0.02, so attention is far from uniform and a wrong mask,
    # rotation or head grouping changes the loss well above the tolerance.
    return jax.tree.map(lambda x: x * 10 if x.ndim == 3 else x, params)


def tokens_for(config: LlamaConfig, batch: int, seq: int, seed: int = 1) -> jax.Array:
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.integers(0, config.vocab_size, (batch, seq)), jnp.int32)


CASES = [
    pytest.param(GQA, 3, 128, id="gqa"),
    pytest.param(llama_nano.with_vocab(8192), 2, 512, id="llama_nano"),
]


@pytest.mark.parametrize("config,batch,seq", CASES)
def test_same_loss_and_gradients_on_the_same_parameters(config, batch, seq) -> None:
    params = engine_params(config)
    tokens = tokens_for(config, batch, seq)
    shape = shape_of(config)
    loss_e, grads_e = jax.jit(jax.value_and_grad(lambda p, t: loss_fn(p, t, config)))(
        params, tokens
    )
    loss_b, grads_b = jax.jit(jax.value_and_grad(lambda p, t: bl.loss(p, t, shape)))(
        bl.from_engine_params(params), tokens
    )
    assert abs(float(loss_e) - float(loss_b)) <= 1e-5, (float(loss_e), float(loss_b))
    assert float(loss_e) > 1.0  # not a degenerate loss
    converted = bl.from_engine_params(grads_e)
    for path, g_b in jax.tree_util.tree_leaves_with_path(grads_b):
        g_e = converted
        for key in path:
            g_e = g_e[key.key if hasattr(key, "key") else key.idx]
        scale = float(jnp.max(jnp.abs(g_e)))
        assert scale > 0, path
        assert float(jnp.max(jnp.abs(g_e - g_b))) <= 1e-4 * scale, path


def test_a_different_model_is_told_apart() -> None:
    """The tolerance is tight enough to catch a real difference: swapping two layers, or a
    norm epsilon 10x larger, moves the loss far beyond 1e-5."""
    config = GQA
    params = engine_params(config)
    tokens = tokens_for(config, 3, 128)
    reference = float(bl.loss(bl.from_engine_params(params), tokens, shape_of(config)))
    swapped = bl.from_engine_params(params)
    swapped["layers"][0], swapped["layers"][1] = swapped["layers"][1], swapped["layers"][0]
    assert abs(float(bl.loss(swapped, tokens, shape_of(config))) - reference) > 1e-3
    other_eps = dataclasses.replace(shape_of(config), eps=1e-2)
    assert abs(float(bl.loss(bl.from_engine_params(params), tokens, other_eps)) - reference) > 1e-4


def test_same_parameters_after_optimizer_steps() -> None:
    """Three steps of each loop's own optimizer (the engine's AdamConfig.build; the baseline's
    optax.adamw chain) from the same parameters on the same batches."""
    config = GQA
    steps = 100  # one warmup step (1%): the first update has learning rate 0
    opt = AdamConfig()
    tx_e = opt.build(steps)
    params_e = init_params(config, jax.random.PRNGKey(0))
    state_e = tx_e.init(params_e)

    @jax.jit
    def step_e(params, state, tokens):
        grads = jax.grad(loss_fn)(params, tokens, config)
        updates, state = tx_e.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    shape = shape_of(config)
    tx_b = bl.optimizer(
        bl.Adam(
            lr=opt.learning_rate,
            min_lr_ratio=opt.min_lr_ratio,
            warmup_fraction=opt.warmup,
            b1=opt.beta1,
            b2=opt.beta2,
            eps=opt.epsilon,
            weight_decay=opt.weight_decay,
            clip=opt.max_grad_norm,
        ),
        steps,
    )
    params_b = bl.from_engine_params(params_e)
    state_b = tx_b.init(params_b)
    step_b = bl.make_step(shape, tx_b)
    for i in range(4):
        tokens = tokens_for(config, 3, 128, seed=10 + i)
        params_e, state_e = step_e(params_e, state_e, tokens)
        params_b, state_b, _ = step_b(params_b, state_b, tokens)
    start = bl.from_engine_params(init_params(config, jax.random.PRNGKey(0)))
    moved = bl.from_engine_params(params_e)
    diffs = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), moved, params_b)
    travel = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), moved, start)
    # Three steps with a non-zero learning rate (6e-4) moved every parameter by ~1e-3; the two
    # loops agree to 1e-5, 1/60 of one step's size (Adam divides by the root of tiny second
    # moments for rare tokens' embedding rows, which amplifies float32 rounding to ~3e-6 there;
    # elsewhere the difference is ~1e-7). A different schedule, mask or clipping moves a
    # parameter by a whole step.
    assert min(jax.tree.leaves(travel)) > 1e-4
    assert max(jax.tree.leaves(diffs)) <= 1e-5, diffs
