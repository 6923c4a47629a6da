"""An independent Llama training step in plain JAX + optax: the peer that `train.py` times the
engine against.

Written from the Llama recipe, not from marin_dagster.levanter: it imports nothing from the
engine, so a slow construct in the engine's model or optimizer code shows up as a ratio above
1. What it is:
  - parameters a dict with one dict per layer (a Python loop over layers, no `lax.scan`);
  - RMSNorm, RoPE ("rotate half" layout), SwiGLU MLP, causal multi-head attention with grouped
    key/value heads, untied input embedding and LM head;
  - the loss: mean next-token cross entropy (optax's) over the full (B, T-1, vocab) logits;
  - AdamW (`optax.adamw` with a decay mask on the projection matrices) after global-norm
    clipping, a warmup + cosine learning rate;
  - one jitted step, parameters and optimizer state donated.
Matmuls run in `compute_dtype`; norms, softmax and the loss in float32 (no casts at all when
the compute dtype is float32).

`from_engine_params` converts the engine's parameter tree, so a test can check that both
compute the same loss on the same parameters (tests/levanter/test_baseline_equivalence.py):
the timing compares speed, not different maths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax


@dataclass(frozen=True)
class Shape:
    """The model's sizes (the same numbers as the engine's LlamaConfig, named here)."""

    vocab: int
    dim: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    eps: float = 1e-5
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


@dataclass(frozen=True)
class Adam:
    """AdamW with clipping and a warmup + cosine schedule (the engine's defaults)."""

    lr: float = 6e-4
    min_lr_ratio: float = 0.1
    warmup_fraction: float = 0.01
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip: float = 1.0


def init(shape: Shape, seed: int = 0, std: float = 0.02) -> dict[str, Any]:
    rng = np.random.default_rng(seed)

    def normal(*dims: int) -> jax.Array:
        return jnp.asarray(rng.normal(0.0, std, dims), jnp.float32)

    d, f, hd = shape.dim, shape.ffn, shape.head_dim
    return {
        "embed": normal(shape.vocab, d),
        "layers": [
            {
                "ln1": jnp.ones((d,), jnp.float32),
                "wq": normal(d, shape.heads * hd),
                "wk": normal(d, shape.kv_heads * hd),
                "wv": normal(d, shape.kv_heads * hd),
                "wo": normal(shape.heads * hd, d),
                "ln2": jnp.ones((d,), jnp.float32),
                "w1": normal(d, f),
                "w3": normal(d, f),
                "w2": normal(f, d),
            }
            for _ in range(shape.layers)
        ],
        "norm": jnp.ones((d,), jnp.float32),
        "head": normal(d, shape.vocab),
    }


_FROM_ENGINE = {
    "attn_norm": "ln1",
    "q_proj": "wq",
    "k_proj": "wk",
    "v_proj": "wv",
    "o_proj": "wo",
    "mlp_norm": "ln2",
    "gate_proj": "w1",
    "up_proj": "w3",
    "down_proj": "w2",
}


def from_engine_params(params: dict[str, Any]) -> dict[str, Any]:
    """The engine's tree (layers stacked on a leading axis) in this module's layout."""
    stacked = params["layers"]
    n = stacked["attn_norm"].shape[0]
    return {
        "embed": jnp.asarray(params["token_embedding"]),
        "layers": [
            {ours: jnp.asarray(stacked[theirs][i]) for theirs, ours in _FROM_ENGINE.items()}
            for i in range(n)
        ],
        "norm": jnp.asarray(params["final_norm"]),
        "head": jnp.asarray(params["lm_head"]),
    }


def _norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    dtype = x.dtype
    if dtype != jnp.float32:
        x = x.astype(jnp.float32)
    y = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * w
    return y if dtype == jnp.float32 else y.astype(dtype)


def _rope(t: int, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    freqs = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.arange(t, dtype=np.float64)[:, None] * freqs[None, :]
    ang = np.concatenate([ang, ang], axis=1)
    return jnp.asarray(np.cos(ang), jnp.float32), jnp.asarray(np.sin(ang), jnp.float32)


def _rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x: (B, T, H, hd); cos, sin: (T, hd) already in x's dtype."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    return x * cos[:, None, :] + jnp.concatenate([-x2, x1], axis=-1) * sin[:, None, :]


def _attend(x, p, shape: Shape, cos, sin):
    b, t, _ = x.shape
    h, kv, hd = shape.heads, shape.kv_heads, shape.head_dim
    dtype = x.dtype
    q = _rotate((x @ p["wq"].astype(dtype)).reshape(b, t, h, hd), cos, sin)
    k = _rotate((x @ p["wk"].astype(dtype)).reshape(b, t, kv, hd), cos, sin)
    v = (x @ p["wv"].astype(dtype)).reshape(b, t, kv, hd)
    if kv != h:  # grouped-query attention: each key/value head serves h // kv query heads
        k, v = jnp.repeat(k, h // kv, axis=2), jnp.repeat(v, h // kv, axis=2)
    s = jnp.einsum("bqhd,bshd->bhqs", q, k, preferred_element_type=jnp.float32)
    s = jnp.where(np.tril(np.ones((t, t), dtype=bool)), s * (1.0 / np.sqrt(hd)), -1e30)
    a = jax.nn.softmax(s, axis=-1).astype(dtype)
    o = jnp.einsum("bhqs,bshd->bqhd", a, v).reshape(b, t, h * hd)
    return o @ p["wo"].astype(dtype)


def _ffn(x, p):
    dtype = x.dtype
    return (jax.nn.silu(x @ p["w1"].astype(dtype)) * (x @ p["w3"].astype(dtype))) @ p["w2"].astype(
        dtype
    )


def loss(params: dict[str, Any], tokens: jax.Array, shape: Shape, dtype=jnp.float32) -> jax.Array:
    """Mean cross entropy of predicting tokens[:, 1:] from tokens[:, :-1]'s prefixes."""
    t = tokens.shape[1]
    cos, sin = _rope(t, shape.head_dim, shape.rope_theta)
    cos, sin = cos.astype(dtype), sin.astype(dtype)
    x = params["embed"][tokens].astype(dtype)
    for p in params["layers"]:
        x = x + _attend(_norm(x, p["ln1"], shape.eps), p, shape, cos, sin)
        x = x + _ffn(_norm(x, p["ln2"], shape.eps), p)
    x = _norm(x, params["norm"], shape.eps)[:, :-1]
    logits = jnp.einsum(
        "btd,dv->btv", x, params["head"].astype(dtype), preferred_element_type=jnp.float32
    )
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]))


def optimizer(adam: Adam, steps: int) -> optax.GradientTransformation:
    warmup = int(round(adam.warmup_fraction * steps))
    lr = optax.warmup_cosine_decay_schedule(
        0.0, adam.lr, warmup, steps, end_value=adam.lr * adam.min_lr_ratio
    )

    def decay_mask(params):
        # Weight decay on the matrices that multiply activations; not on norms or the embedding.
        return {
            "embed": False,
            "layers": [{k: k.startswith("w") for k in p} for p in params["layers"]],
            "norm": False,
            "head": True,
        }

    return optax.chain(
        optax.clip_by_global_norm(adam.clip),
        optax.adamw(
            lr, adam.b1, adam.b2, adam.eps, weight_decay=adam.weight_decay, mask=decay_mask
        ),
    )


def make_step(shape: Shape, tx: optax.GradientTransformation, dtype=jnp.float32):
    """The jitted step (params, opt_state, tokens) -> (params, opt_state, loss), state donated."""

    def step(params, opt_state, tokens):
        value, grads = jax.value_and_grad(loss)(params, tokens, shape, dtype)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return jax.jit(step, donate_argnums=(0, 1))
