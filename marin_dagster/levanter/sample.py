"""Text generation from a trained model: greedy or temperature sampling.

No KV cache: each new token re-runs the model over a fixed-length window
(causal masking makes the unused tail irrelevant), so one compiled function
serves every position. Plenty for the short samples shown after training.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from marin_dagster.levanter.config import LlamaConfig
from marin_dagster.levanter.model import Params, forward


@functools.lru_cache(maxsize=8)
def _next_token_fn(config: LlamaConfig, dtype_name: str, greedy: bool):
    dtype = jnp.dtype(dtype_name)

    def next_token(
        params: Params, window: jax.Array, pos: jax.Array, key: jax.Array, temperature: jax.Array
    ) -> jax.Array:
        logits = forward(params, window, config, dtype)[0, pos - 1]
        if greedy:
            return jnp.argmax(logits).astype(jnp.int32)
        return jax.random.categorical(key, logits / temperature).astype(jnp.int32)

    return jax.jit(next_token)


def generate(
    params: Params,
    config: LlamaConfig,
    prompt: list[int],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    compute_dtype: str = "float32",
    stop_id: int | None = None,
) -> list[int]:
    """The prompt's continuation (new token ids only); greedy when temperature is 0."""
    if not prompt:
        raise ValueError("generate: prompt must hold at least one token id")
    window_len = min(config.seq_len, len(prompt) + max_new_tokens)
    prompt = list(prompt)[-(window_len - 1) :] if len(prompt) >= window_len else list(prompt)
    fn = _next_token_fn(config, compute_dtype, temperature <= 0)
    window = np.zeros((1, window_len), np.int32)
    window[0, : len(prompt)] = prompt
    pos = len(prompt)
    key = jax.random.PRNGKey(seed)
    out: list[int] = []
    temp = jnp.float32(max(temperature, 1e-6))
    while len(out) < max_new_tokens and pos < window_len:
        key, sub = jax.random.split(key)
        tok = int(fn(params, jnp.asarray(window), jnp.int32(pos), sub, temp))
        if stop_id is not None and tok == stop_id:
            break
        window[0, pos] = tok
        out.append(tok)
        pos += 1
    return out
