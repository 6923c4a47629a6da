"""`remat` changes what the backward pass keeps, never the numbers: same loss and gradients,
and the trainer runs with each setting."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marin_dagster.levanter import AdamConfig, LlamaConfig, TrainerSettings, TrainLmConfig, train
from marin_dagster.levanter.model import REMAT_POLICIES, init_params, loss_fn
from tests.levanter.caches import write_cache

CONFIG = LlamaConfig(
    seq_len=32,
    hidden_dim=32,
    intermediate_dim=64,
    num_heads=4,
    num_kv_heads=2,
    num_layers=3,
    vocab_size=50,
)


@pytest.mark.parametrize("remat", ["block", "dots"])
def test_remat_gives_the_same_loss_and_gradients(remat: str) -> None:
    params = init_params(CONFIG, jax.random.PRNGKey(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50, (4, 32)), jnp.int32)
    grad = jax.jit(
        jax.value_and_grad(loss_fn, argnums=0), static_argnums=(2,), static_argnames=("remat",)
    )
    loss, grads = grad(params, tokens, CONFIG, remat="none")
    loss_r, grads_r = grad(params, tokens, CONFIG, remat=remat)
    assert float(loss_r) == pytest.approx(float(loss), rel=1e-6)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_r), strict=True):
        np.testing.assert_allclose(r, g, rtol=1e-5, atol=1e-7)


def test_block_remat_keeps_less() -> None:
    params = jax.eval_shape(lambda: init_params(CONFIG, jax.random.PRNGKey(0)))
    tokens = jax.ShapeDtypeStruct((16, 32), jnp.int32)

    def temp(remat: str) -> int:
        step = jax.jit(jax.grad(lambda p, t: loss_fn(p, t, CONFIG, remat=remat)))
        return step.lower(params, tokens).compile().memory_analysis().temp_size_in_bytes

    assert temp("block") < temp("none")


def test_trainer_runs_with_each_remat_setting(tmp_path) -> None:
    data = write_cache(str(tmp_path / "cache"), 50, 20_000, period=5)
    losses = {}
    for remat in REMAT_POLICIES:
        config = TrainLmConfig(
            model=CONFIG,
            datasets={data: 1.0},
            optimizer=AdamConfig(learning_rate=3e-3, warmup=2),
            batch_size=4,
            num_train_steps=4,
            validation={},
        )
        result = train(
            config, str(tmp_path / remat), settings=TrainerSettings(remat=remat, sample_tokens=0)
        )
        losses[remat] = result.final_train_loss
    assert losses["block"] == pytest.approx(losses["none"], rel=1e-5)
    assert losses["dots"] == pytest.approx(losses["none"], rel=1e-5)
    with pytest.raises(ValueError, match="remat must be one of"):
        TrainerSettings(remat="everything")
