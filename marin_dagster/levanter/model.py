"""A Llama decoder in plain JAX: parameters are a dict of arrays, the model is functions.

Layers are stacked along a leading axis and run with `lax.scan`, so compile
time does not grow with depth (Levanter's `Stacked` does the same).
Parameters stay float32; `compute_dtype` (e.g. bfloat16) is what matmuls run in.
Softmax, norms' statistics and the loss are float32 either way. Attention is
attention.py's (cuDNN flash attention on NVIDIA GPUs); the loss is loss.py's,
which never holds all B x T x vocab logits at once.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from marin_dagster.levanter.attention import causal_attention
from marin_dagster.levanter.config import REMAT_POLICIES, LlamaConfig
from marin_dagster.levanter.loss import cross_entropy_sum, token_cross_entropy

Params = dict


@functools.partial(jax.jit, static_argnums=0)
def init_params(config: LlamaConfig, key: jax.Array) -> Params:
    """Fresh float32 parameters (one compiled program, not dozens of eager ops)."""
    if config.vocab_size is None:
        raise ValueError("LlamaConfig.vocab_size is unset: set it from the tokenizer (with_vocab)")
    d, i, hd, n_layers = (
        config.hidden_dim,
        config.intermediate_dim,
        config.actual_head_dim,
        config.num_layers,
    )
    h, kv, v = config.num_heads, config.num_kv_heads, config.vocab_size
    std = config.initializer_range
    keys = iter(jax.random.split(key, 9))

    def normal(shape: tuple[int, ...]) -> jax.Array:
        return std * jax.random.normal(next(keys), shape, jnp.float32)

    params: Params = {
        "token_embedding": normal((v, d)),
        "layers": {
            "attn_norm": jnp.ones((n_layers, d), jnp.float32),
            "q_proj": normal((n_layers, d, h * hd)),
            "k_proj": normal((n_layers, d, kv * hd)),
            "v_proj": normal((n_layers, d, kv * hd)),
            "o_proj": normal((n_layers, h * hd, d)),
            "mlp_norm": jnp.ones((n_layers, d), jnp.float32),
            **(
                {
                    "q_norm": jnp.ones((n_layers, hd), jnp.float32),
                    "k_norm": jnp.ones((n_layers, hd), jnp.float32),
                }
                if config.qk_norm
                else {}
            ),
            "gate_proj": normal((n_layers, d, i)),
            "up_proj": normal((n_layers, d, i)),
            "down_proj": normal((n_layers, i, d)),
        },
        "final_norm": jnp.ones((d,), jnp.float32),
    }
    if not config.tie_word_embeddings:
        params["lm_head"] = normal((d, v))
    return params


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (normed * weight).astype(x.dtype)


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    angles = jnp.concatenate(
        [angles, angles], axis=-1
    )  # (T, head_dim), HF/Llama "rotate half" layout
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x: (B, T, heads, head_dim)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return (x.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin).astype(x.dtype)


def attention(
    x: jax.Array,
    layer: Params,
    config: LlamaConfig,
    cos: jax.Array,
    sin: jax.Array,
    implementation: str = "auto",
) -> jax.Array:
    b, t, _ = x.shape
    h, kv, hd = config.num_heads, config.num_kv_heads, config.actual_head_dim
    dtype = x.dtype
    q = (x @ layer["q_proj"].astype(dtype)).reshape(b, t, h, hd)
    k = (x @ layer["k_proj"].astype(dtype)).reshape(b, t, kv, hd)
    v = (x @ layer["v_proj"].astype(dtype)).reshape(b, t, kv, hd)
    if config.qk_norm:
        q = rms_norm(q, layer["q_norm"], config.layer_norm_epsilon)
        k = rms_norm(k, layer["k_norm"], config.layer_norm_epsilon)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    out = causal_attention(q, k, v, implementation).reshape(b, t, h * hd)
    return out @ layer["o_proj"].astype(dtype)


def mlp(x: jax.Array, layer: Params) -> jax.Array:
    dtype = x.dtype
    gate = jax.nn.silu(x @ layer["gate_proj"].astype(dtype))
    return (gate * (x @ layer["up_proj"].astype(dtype))) @ layer["down_proj"].astype(dtype)


def remat_block(block, remat: str):
    """`block` wrapped for the `remat` policy (see REMAT_POLICIES)."""
    if remat == "none":
        return block
    if remat == "block":
        return jax.checkpoint(block)
    if remat == "dots":
        return jax.checkpoint(
            block, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable
        )
    raise ValueError(f"remat must be one of {REMAT_POLICIES}, got {remat!r}")


def hidden_states(
    params: Params,
    tokens: jax.Array,
    config: LlamaConfig,
    compute_dtype: jnp.dtype = jnp.float32,
    *,
    remat: str = "none",
    attention_impl: str = "auto",
) -> jax.Array:
    """The final normed hidden states (B, T, hidden_dim), in the compute dtype."""
    t = tokens.shape[1]
    eps = config.layer_norm_epsilon
    cos, sin = rope_tables(t, config.actual_head_dim, config.rope_theta)
    x = params["token_embedding"][tokens].astype(compute_dtype)

    def block(x: jax.Array, layer: Params) -> tuple[jax.Array, None]:
        x = x + attention(
            rms_norm(x, layer["attn_norm"], eps), layer, config, cos, sin, attention_impl
        )
        x = x + mlp(rms_norm(x, layer["mlp_norm"], eps), layer)
        return x, None

    x, _ = jax.lax.scan(remat_block(block, remat), x, params["layers"])
    return rms_norm(x, params["final_norm"], eps)


def lm_head(params: Params, config: LlamaConfig) -> jax.Array:
    """The (hidden_dim, vocab) output projection, float32."""
    return params["token_embedding"].T if config.tie_word_embeddings else params["lm_head"]


def forward(
    params: Params,
    tokens: jax.Array,
    config: LlamaConfig,
    compute_dtype: jnp.dtype = jnp.float32,
    *,
    remat: str = "none",
    attention_impl: str = "auto",
) -> jax.Array:
    """Logits (float32, shape (B, T, vocab)) for int tokens of shape (B, T).

    All B x T x vocab of them: for sampling and tests. Training and evaluation go
    through loss.py, which makes them a chunk of positions at a time.
    """
    x = hidden_states(
        params, tokens, config, compute_dtype, remat=remat, attention_impl=attention_impl
    )
    return jnp.einsum(
        "btd,dv->btv",
        x,
        lm_head(params, config).astype(compute_dtype),
        preferred_element_type=jnp.float32,
    )


def token_losses(
    params: Params,
    tokens: jax.Array,
    config: LlamaConfig,
    compute_dtype: jnp.dtype = jnp.float32,
    *,
    remat: str = "none",
) -> jax.Array:
    """Next-token cross entropy (nats) for positions 0..T-2, shape (B, T-1). Forward only (eval)."""
    x = hidden_states(params, tokens, config, compute_dtype, remat=remat)
    return token_cross_entropy(x[:, :-1], lm_head(params, config), tokens[:, 1:])


def loss_fn(
    params: Params,
    tokens: jax.Array,
    config: LlamaConfig,
    compute_dtype: jnp.dtype = jnp.float32,
    *,
    remat: str = "none",
    z_loss_weight: float = 0.0,
) -> jax.Array:
    """Mean next-token cross entropy over the batch (plus the z-loss, if weighted): the
    training loss."""
    b, t = tokens.shape
    x = hidden_states(params, tokens, config, compute_dtype, remat=remat)
    # Every position predicts the next token; the last has none, so it gets weight 0 (rather
    # than slicing x to T-1 positions, which would copy it and break power-of-two chunks).
    targets = jnp.concatenate([tokens[:, 1:], jnp.zeros((b, 1), tokens.dtype)], axis=1)
    weights = jnp.broadcast_to(jnp.arange(t) < t - 1, (b, t)).astype(jnp.float32)
    total = cross_entropy_sum(x, lm_head(params, config), targets, weights, None, z_loss_weight)
    return total / (b * (t - 1))
