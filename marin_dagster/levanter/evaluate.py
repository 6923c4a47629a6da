"""`evaluate(checkpoint_path, datasets)`: loss, perplexity and bits per byte of any trained model.

`checkpoint_path` is a train output (its exported params.npz and
model_config.json), or one orbax step directory `{output}/checkpoints/{step}`
(its model config is read from `{output}/config.json`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from marin_dagster import fs
from marin_dagster.levanter.config import LlamaConfig
from marin_dagster.levanter.data import TrainInputError, open_eval_sets
from marin_dagster.levanter.mesh import batch_sharding, make_mesh, replicated
from marin_dagster.levanter.model import Params, token_losses
from marin_dagster.levanter.trainer import EvalResult, load_params, run_eval


def load_model(checkpoint_path: str) -> tuple[LlamaConfig, Params]:
    path = fs.normalize(checkpoint_path)
    if fs.exists(fs.join(path, "params.npz")):
        config = LlamaConfig.from_dict(fs.read_json(fs.join(path, "model_config.json")))
        return config, load_params(fs.join(path, "params.npz"))
    run_dir = path.rstrip("/").rsplit("/", 2)[0]
    state_dir = fs.join(path, "state")
    run_config = fs.read_json_or_none(fs.join(run_dir, "config.json"))
    if not fs.exists(state_dir) or run_config is None:
        raise FileNotFoundError(
            f"{checkpoint_path} is neither a train output (params.npz + model_config.json) nor an "
            "orbax step directory {output}/checkpoints/{step} (state/ and the run's config.json)")
    import orbax.checkpoint as ocp

    config = LlamaConfig.from_dict(run_config["model"])
    checkpointer = ocp.StandardCheckpointer()
    # Target every array at the first local device, whatever mesh saved it.
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                          checkpointer.metadata(state_dir).item_metadata.tree)
    restored = checkpointer.restore(state_dir, target)
    return config, restored["params"]


@functools.lru_cache(maxsize=8)
def _eval_step(config: LlamaConfig, dtype_name: str, mesh: jax.sharding.Mesh):
    dtype = jnp.dtype(dtype_name)

    def eval_step(params: Params, tokens: jax.Array, row_mask: jax.Array):
        losses = token_losses(params, tokens, config, dtype)
        weights = jnp.broadcast_to(row_mask[:, None], losses.shape)
        return jnp.sum(losses * weights), jnp.sum(weights)

    rep = replicated(mesh)
    return jax.jit(eval_step, in_shardings=(rep, batch_sharding(mesh), rep), out_shardings=(rep, rep))


def evaluate(checkpoint_path: str, datasets: Mapping[str, str] | Sequence[str], *,
             split: str = "validation", seq_len: int | None = None, batch_size: int = 8,
             max_batches: int | None = None, bytes_per_token: Mapping[str, float] | None = None,
             compute_dtype: str = "float32", num_devices: int | None = None) -> dict[str, EvalResult]:
    """Eval loss, perplexity and bits per byte on each dataset ({name: cache path} or paths).

    Bits per byte needs the source bytes per token: taken from the cache's stats,
    or `bytes_per_token[name]`; it is None when neither is known.
    """
    if not isinstance(datasets, Mapping):
        datasets = {fs.basename(p): p for p in datasets}
    if not datasets:
        raise TrainInputError("datasets: no evaluation dataset given")
    config, params = load_model(checkpoint_path)
    seq_len = seq_len or config.seq_len
    if seq_len > config.seq_len:
        raise TrainInputError(f"seq_len={seq_len} is above the model's maximum (model.seq_len={config.seq_len})")
    mesh = make_mesh(num_devices)
    if batch_size % mesh.devices.size:
        raise TrainInputError(f"batch_size={batch_size} is not divisible by the {mesh.devices.size} devices")
    eval_sets = open_eval_sets(datasets, seq_len, split, bytes_per_token)
    params = jax.device_put(params, replicated(mesh))
    return run_eval(_eval_step(config, compute_dtype, mesh), params, eval_sets, seq_len, batch_size,
                    max_batches, batch_sharding(mesh), config.vocab_size)


def evaluate_to_dict(results: Mapping[str, EvalResult]) -> dict[str, Any]:
    return {name: r.to_dict() for name, r in results.items()}
