"""Next-token cross entropy that never holds the full (B, T, vocab) float32 logits.

For a small model with a big vocabulary the LM head's logits are the largest
activation by far: batch 32 x 1024 positions x a 128k vocabulary is 17 GB in
float32, and autodiff keeps them (and their softmax) for the backward pass. Here
the logits are made one chunk of positions at a time (`lax.scan` over the
sequence, at most `CHUNK_ELEMENTS` logits a chunk), and for training the
gradients for the hidden states and the head are computed in that same pass (a
custom VJP): the backward pass neither keeps nor recomputes any logits, so the
head costs the same three matmuls as plain autodiff.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

# One chunk's logits: 2^27 float32 values (512 MiB). Small models on the CPU get one chunk.
CHUNK_ELEMENTS = 2**27


def chunk_length(batch: int, seq_len: int, vocab: int, max_elements: int | None = None) -> int:
    """Positions per chunk: the whole sequence if its logits fit, else the largest power of two that does."""
    fits = max(1, (max_elements or CHUNK_ELEMENTS) // (batch * vocab))
    return seq_len if fits >= seq_len else 1 << (fits.bit_length() - 1)


def _to_chunks(x: jax.Array, chunk: int) -> jax.Array:
    """(B, T, ...) -> (T / chunk, B, chunk, ...), zero-padding T up to a multiple of `chunk`."""
    b, t = x.shape[:2]
    n = -(-t // chunk)
    x = jnp.pad(x, [(0, 0), (0, n * chunk - t)] + [(0, 0)] * (x.ndim - 2))
    return jnp.moveaxis(x.reshape(b, n, chunk, *x.shape[2:]), 1, 0)


def _from_chunks(x: jax.Array, seq_len: int) -> jax.Array:
    n, b, chunk = x.shape[:3]
    return jnp.moveaxis(x, 0, 1).reshape(b, n * chunk, *x.shape[3:])[:, :seq_len]


def _logits(x: jax.Array, head: jax.Array) -> jax.Array:
    # Matmul in the compute dtype, result in float32: log-softmax needs the precision.
    return jnp.einsum("btd,dv->btv", x, head, preferred_element_type=jnp.float32)


def token_cross_entropy(
    x: jax.Array,
    head: jax.Array,
    targets: jax.Array,
    max_elements: int | None = None,
    z_loss_weight: float = 0.0,
) -> jax.Array:
    """Cross entropy (nats) of each position, shape (B, T): -log softmax(x @ head)[target].

    x: (B, T, D) final hidden states in the compute dtype; head: (D, vocab), cast to x's dtype.
    Forward only (evaluation): differentiating it keeps every chunk's logits.
    """
    b, t, _ = x.shape
    head = head.astype(x.dtype)
    chunk = chunk_length(b, t, head.shape[1], max_elements)

    def losses(xt: tuple[jax.Array, jax.Array]) -> jax.Array:
        x_c, targets_c = xt
        logits = _logits(x_c, head)
        target_logit = jnp.take_along_axis(logits, targets_c[..., None], axis=-1)[..., 0]
        log_z = jax.nn.logsumexp(logits, axis=-1)
        return log_z - target_logit + z_loss_weight * log_z**2

    return _from_chunks(jax.lax.map(losses, (_to_chunks(x, chunk), _to_chunks(targets, chunk))), t)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def cross_entropy_sum(
    x: jax.Array,
    head: jax.Array,
    targets: jax.Array,
    weights: jax.Array,
    max_elements: int | None = None,
    z_loss_weight: float = 0.0,
) -> jax.Array:
    """sum(weights * token_cross_entropy(x, head, targets)): a float32 scalar, differentiable in
    x and head with the gradients computed chunk by chunk in the forward pass.

    `z_loss_weight` adds PaLM's z-loss, weight * log(Z)^2 per position (Z the softmax's
    normalizer), which keeps the logits from drifting in scale.
    """
    return jnp.sum(weights * token_cross_entropy(x, head, targets, max_elements, z_loss_weight))


def _cross_entropy_sum_fwd(x, head, targets, weights, max_elements, z_loss_weight):
    b, t, _ = x.shape
    w = head.astype(x.dtype)
    vocab = w.shape[1]
    chunk = chunk_length(b, t, vocab, max_elements)

    def step(carry, xs):
        total, d_head = carry
        x_c, targets_c, weights_c = xs
        logits = _logits(x_c, w)
        log_z = jax.nn.logsumexp(logits, axis=-1)
        target_logit = jnp.take_along_axis(logits, targets_c[..., None], axis=-1)[..., 0]
        total = total + jnp.sum(weights_c * (log_z - target_logit + z_loss_weight * log_z**2))
        # d loss / d logits = softmax * (1 + 2 z log Z) - one_hot(target), times the weight.
        softmax = jnp.exp(logits - log_z[..., None])
        if z_loss_weight:
            softmax = softmax * (1.0 + 2.0 * z_loss_weight * log_z)[..., None]
        d_logits = (softmax - jax.nn.one_hot(targets_c, vocab)) * weights_c[..., None]
        d_logits = d_logits.astype(x.dtype)
        d_x = jnp.einsum("btv,dv->btd", d_logits, w)
        d_head = d_head + jnp.einsum(
            "btd,btv->dv", x_c, d_logits, preferred_element_type=jnp.float32
        )
        return (total, d_head), d_x

    init = (jnp.zeros((), jnp.float32), jnp.zeros(w.shape, jnp.float32))
    xs = (
        _to_chunks(x, chunk),
        _to_chunks(targets, chunk),
        _to_chunks(weights.astype(jnp.float32), chunk),
    )
    (total, d_head), d_x = jax.lax.scan(step, init, xs)
    return total, (_from_chunks(d_x, t), d_head.astype(head.dtype))


def _cross_entropy_sum_bwd(max_elements, z_loss_weight, residuals, g):
    d_x, d_head = residuals
    return (g * d_x).astype(d_x.dtype), (g * d_head).astype(d_head.dtype), None, None


cross_entropy_sum.defvjp(_cross_entropy_sum_fwd, _cross_entropy_sum_bwd)
