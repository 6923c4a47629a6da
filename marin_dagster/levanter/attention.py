"""Causal self-attention with grouped-query heads: one call, the best kernel the device has.

`jax.nn.dot_product_attention` runs cuDNN's flash attention on an NVIDIA GPU for
bfloat16/float16 inputs: it never holds the (B, heads, T, T) scores (the scan over
layers used to keep every layer's float32 scores for the backward pass: 64 GiB for
a 1B model at 16 x 2048) and skips the masked upper triangle. Elsewhere (CPU, TPU,
float32) it runs XLA's path, which is `reference_attention`'s arithmetic: scores
and softmax in float32. On the CPU, "auto" runs `einsum_attention` instead: the
same arithmetic with the key/value heads repeated to one per query head, so the
two matmuls have a single head axis; XLA's CPU path (and the reference) contract
over a (kv_heads, groups) pair of axes, which took 2-2.5x the time for the
forward and backward pass at llama_nano's and llama_small_shakespeare's shapes
(issue 19, docs/benchmarks.md). `reference_attention` is kept as the
specification the kernels are tested against.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

# auto: cuDNN where it applies (NVIDIA GPU, 16-bit inputs, head_dim a multiple of 8 up to 128),
# else `einsum_attention` on the CPU (measured faster there), else XLA. The others force one path
# (tests and benchmarks).
ATTENTION_IMPLEMENTATIONS = ("auto", "cudnn", "xla", "einsum", "reference")


@functools.cache
def _on_nvidia_gpu() -> bool:
    device = jax.devices()[0]
    version = getattr(getattr(device, "client", None), "platform_version", "")
    return device.platform == "gpu" and "rocm" not in str(version).lower()


def cudnn_applies(q: jax.Array) -> bool:
    head_dim = q.shape[-1]
    return (
        _on_nvidia_gpu()
        and q.dtype in (jnp.bfloat16, jnp.float16)
        and head_dim % 8 == 0
        and head_dim <= 128
    )


def causal_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, implementation: str = "auto"
) -> jax.Array:
    """softmax(q k^T / sqrt(head_dim), causal) v.

    q: (B, T, heads, head_dim); k, v: (B, T, kv_heads, head_dim), kv_heads dividing heads
    (each kv head serves heads // kv_heads query heads). Returns q's shape and dtype.
    """
    if implementation == "auto":
        if cudnn_applies(q):
            implementation = "cudnn"
        elif jax.default_backend() == "cpu":
            implementation = "einsum"
        else:
            implementation = "xla"
    if implementation == "reference":
        return reference_attention(q, k, v)
    if implementation == "einsum":
        return einsum_attention(q, k, v)
    if implementation not in ("cudnn", "xla"):
        raise ValueError(
            f"attention implementation must be one of {ATTENTION_IMPLEMENTATIONS}, "
            f"got {implementation!r}"
        )
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)


def einsum_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """The formula with one head axis: kv heads repeated to the query heads (grouped-query
    attention as Llama's reference code writes it), scores and softmax in float32."""
    b, t, h, hd = q.shape
    kv = k.shape[2]
    if kv != h:
        k, v = jnp.repeat(k, h // kv, axis=2), jnp.repeat(v, h // kv, axis=2)
    scores = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32)
    scores = scores / jnp.sqrt(jnp.float32(hd))
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    return jnp.einsum("bhts,bshd->bthd", probs, v)


def reference_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """The plain formula (the model's attention before issue 14): materialises the float32 scores."""
    b, t, h, hd = q.shape
    kv = k.shape[2]
    dtype = q.dtype
    # Grouped-query attention: each of the kv heads serves `groups` query heads.
    groups = h // kv
    q = q.reshape(b, t, kv, groups, hd)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k).astype(jnp.float32) / jnp.sqrt(jnp.float32(hd))
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
    return jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(b, t, h, hd)
