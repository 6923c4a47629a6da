"""AdamConfig: Levanter's defaults, the schedules, the weight-decay mask."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from marin_dagster.levanter import AdamConfig, LlamaConfig
from marin_dagster.levanter.model import init_params
from marin_dagster.levanter.optim import weight_decay_mask


def test_levanter_defaults() -> None:
    c = AdamConfig()
    assert (
        c.learning_rate,
        c.weight_decay,
        c.min_lr_ratio,
        c.warmup,
        c.decay,
        c.lr_schedule,
        c.beta1,
        c.beta2,
        c.epsilon,
        c.max_grad_norm,
    ) == (6e-4, 0.1, 0.1, 0.01, None, "cosine", 0.9, 0.95, 1e-8, 1.0)


def _lr(config: AdamConfig, steps: int) -> np.ndarray:
    schedule = config.lr_scheduler(steps)
    return np.asarray(jax.jit(jax.vmap(schedule))(jnp.arange(steps + 1)), dtype=np.float64)


def test_warmup_fraction_and_step_count_agree() -> None:
    frac = _lr(AdamConfig(learning_rate=1.0, warmup=0.1), 100)
    count = _lr(AdamConfig(learning_rate=1.0, warmup=10), 100)
    np.testing.assert_allclose(frac, count)
    assert frac[0] == 0 and frac[5] == pytest.approx(0.5) and frac[10] == pytest.approx(1.0)


@pytest.mark.parametrize("kind", ["cosine", "linear"])
def test_decay_reaches_min_lr(kind: str) -> None:
    lr = _lr(AdamConfig(learning_rate=2.0, warmup=10, lr_schedule=kind, min_lr_ratio=0.1), 110)
    assert lr[10] == pytest.approx(2.0)
    assert lr[110] == pytest.approx(0.2, rel=1e-5)
    assert np.all(np.diff(lr[10:]) <= 1e-7)
    if kind == "linear":
        assert lr[60] == pytest.approx(1.1, rel=1e-5)
    else:
        assert lr[60] == pytest.approx(0.2 + 1.8 * 0.5, rel=1e-5)


def test_constant_and_stable_phase_before_decay() -> None:
    assert set(_lr(AdamConfig(learning_rate=1.0, warmup=0, lr_schedule="constant"), 20)) == {1.0}
    # decay=0.2: the last 20% decays; between warmup and decay the rate is flat.
    lr = _lr(
        AdamConfig(
            learning_rate=1.0, warmup=0.1, decay=0.2, lr_schedule="linear", min_lr_ratio=0.0
        ),
        100,
    )
    assert np.all(lr[10:81] == pytest.approx(1.0))
    assert lr[90] == pytest.approx(0.5, rel=1e-5) and lr[100] == pytest.approx(0.0, abs=1e-7)


def test_inv_sqrt() -> None:
    lr = _lr(
        AdamConfig(learning_rate=1.0, warmup=0, lr_schedule="inv_sqrt", min_lr_ratio=0.0), 40000
    )
    assert lr[10000] == pytest.approx(1.0) and lr[40000] == pytest.approx(0.5, rel=1e-4)


def test_weight_decay_skips_norms_and_embeddings() -> None:
    config = LlamaConfig(
        seq_len=8,
        hidden_dim=8,
        intermediate_dim=16,
        num_heads=2,
        num_kv_heads=2,
        num_layers=1,
        vocab_size=11,
    )
    params = init_params(config, jax.random.PRNGKey(0))
    mask = weight_decay_mask(params)
    assert mask["token_embedding"] is False and mask["final_norm"] is False
    assert mask["layers"]["attn_norm"] is False and mask["layers"]["mlp_norm"] is False
    assert mask["layers"]["q_proj"] is True and mask["lm_head"] is True
    # With zero gradients only decayed leaves move.
    tx = AdamConfig(learning_rate=0.1, weight_decay=0.5, warmup=0, lr_schedule="constant").build(10)
    zeros = jax.tree.map(np.zeros_like, params)
    new = jax.jit(lambda p, g: optax.apply_updates(p, tx.update(g, tx.init(p), p)[0]))(
        params, zeros
    )
    assert np.array_equal(new["token_embedding"], params["token_embedding"])
    assert np.array_equal(new["final_norm"], params["final_norm"])
    np.testing.assert_allclose(
        new["layers"]["q_proj"], params["layers"]["q_proj"] * (1 - 0.05), rtol=1e-6
    )


def test_bad_schedule_names_the_field() -> None:
    with pytest.raises(ValueError, match="lr_schedule"):
        AdamConfig(lr_schedule="cosne")  # type: ignore[arg-type]
