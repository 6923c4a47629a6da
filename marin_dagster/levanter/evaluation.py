"""Evaluation: loss, perplexity and bits per byte, during training (`run_eval`) and of any
trained model afterwards (`evaluate(checkpoint_path, datasets)`).

`checkpoint_path` is a train output (its exported params.npz and
model_config.json), or one orbax step directory `{output}/checkpoints/{step}`
(its model config is read from `{output}/config.json`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from marin_dagster import fs
from marin_dagster.levanter.checkpoint import load_params
from marin_dagster.levanter.config import LlamaConfig
from marin_dagster.levanter.data import (
    EvalSet,
    TrainInputError,
    check_token_ids,
    eval_batches,
    open_eval_sets,
)
from marin_dagster.levanter.mesh import batch_sharding, global_array, make_mesh, replicated
from marin_dagster.levanter.model import Params, token_losses


@dataclass
class EvalResult:
    name: str
    loss: float
    perplexity: float
    bits_per_byte: float | None
    num_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run_eval(
    eval_step: Callable,
    params: Params,
    eval_sets: list[EvalSet],
    seq_len: int,
    batch_size: int,
    max_batches: int | None,
    tokens_sharding: Any,
    vocab_size: int,
    token_bytes: np.ndarray | None = None,
) -> dict[str, EvalResult]:
    """Each eval set's mean token loss under `eval_step(params, tokens, row_mask)`.

    `token_bytes` (source bytes per token id, `token_byte_lengths`): bits per byte over the
    bytes of the very tokens scored. Without it, the split's average bytes per token, which
    is off when `max_batches` scores only the first sequences (6-10% on Shakespeare).
    """
    results = {}
    multi_process = jax.process_count() > 1
    for es in eval_sets:
        total, count, num_bytes = 0.0, 0.0, 0
        for tokens, mask in eval_batches(es, seq_len, batch_size, max_batches):
            check_token_ids(tokens, vocab_size, f"validation[{es.name!r}]")
            if token_bytes is not None:  # the bytes of the targets, positions 1..T-1
                num_bytes += int(token_bytes[tokens[:, 1:]].sum(axis=1) @ mask.astype(np.int64))
            if multi_process:  # every process reads the (small) eval batch whole
                row_mask = global_array(mask, replicated(tokens_sharding.mesh))
                s, c = eval_step(params, global_array(tokens, tokens_sharding), row_mask)
            else:
                s, c = eval_step(params, jax.device_put(tokens, tokens_sharding), jnp.asarray(mask))
            total += float(s)
            count += float(c)
        loss = total / count
        if token_bytes is not None and num_bytes:
            bpb = total / math.log(2) / num_bytes
        elif es.bytes_per_token is not None:
            bpb = loss / math.log(2) / es.bytes_per_token
        else:
            bpb = None
        results[es.name] = EvalResult(es.name, loss, math.exp(min(loss, 700.0)), bpb, int(count))
    return results


def mean_eval_loss(results: Mapping[str, EvalResult]) -> float | None:
    """The token-weighted mean loss over the eval sets (None without any)."""
    n = sum(r.num_tokens for r in results.values())
    return None if not n else sum(r.loss * r.num_tokens for r in results.values()) / n


def trained_seq_len(checkpoint_path: str) -> int | None:
    """The sequence length the model was trained at, from its run's config.json: a train
    output's own, or a step directory's run's. None when there is none (an import-hf output)."""
    path = fs.normalize(checkpoint_path).rstrip("/")
    run_dir = path if fs.exists(fs.join(path, "params.npz")) else path.rsplit("/", 2)[0]
    run_config = fs.read_json_or_none(fs.join(run_dir, "config.json"))
    if run_config is None or "train" not in run_config:
        return None
    return run_config["train"].get("seq_len") or run_config["model"]["seq_len"]


def _saved_steps(path: str) -> str:
    """For an unfinished train output (stopped, or still running): the steps it saved."""
    filesystem, folder = fs.url_to_fs(fs.join(path, "checkpoints"))
    try:
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in filesystem.ls(folder, detail=False)]
    except OSError:  # no checkpoints folder: not a train output at all
        return ""
    steps = sorted(int(name) for name in names if name.isdigit())
    if not steps:
        return ""
    return (
        f"; it looks like a train output that has not finished: its saved steps are "
        f"{', '.join(map(str, steps[-5:]))}, e.g. {fs.join(path, 'checkpoints', str(steps[-1]))}"
        " (a rerun of its step resumes from the last)"
    )


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
            "orbax step directory {output}/checkpoints/{step} (state/ and the run's config.json)"
            + _saved_steps(path)
        )
    import orbax.checkpoint as ocp

    from marin_dagster.levanter.checkpoint import tensorstore_to_gcs_emulator

    tensorstore_to_gcs_emulator()
    config = LlamaConfig.from_dict(run_config["model"])
    checkpointer = ocp.StandardCheckpointer()
    # Target every array at the first local device, whatever mesh saved it.
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
        checkpointer.metadata(state_dir).item_metadata.tree,
    )
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
    return jax.jit(
        eval_step, in_shardings=(rep, batch_sharding(mesh), rep), out_shardings=(rep, rep)
    )


def evaluate(
    checkpoint_path: str,
    datasets: Mapping[str, str] | Sequence[str],
    *,
    split: str = "validation",
    seq_len: int | None = None,
    batch_size: int = 8,
    max_batches: int | None = None,
    bytes_per_token: Mapping[str, float] | None = None,
    compute_dtype: str = "float32",
    num_devices: int | None = None,
    token_bytes: np.ndarray | None = None,
) -> dict[str, EvalResult]:
    """Eval loss, perplexity and bits per byte on each dataset ({name: cache path} or paths).

    `seq_len` defaults to the length the model was trained at (`trained_seq_len`), else the
    model's maximum: the training's own eval figures are at that length.
    Bits per byte counts the source bytes of the tokens scored when `token_bytes` (bytes per
    token id, `token_byte_lengths` of the model's tokenizer) is given; else it takes the
    split's average bytes per token, from the cache's stats or `bytes_per_token[name]`; it is
    None when none of these is known.
    """
    if not isinstance(datasets, Mapping):
        datasets = {fs.basename(p): p for p in datasets}
    if not datasets:
        raise TrainInputError("datasets: no evaluation dataset given")
    config, params = load_model(checkpoint_path)
    # Not the model's maximum when the run trained shorter (train_lm's seq_len): positions past
    # the trained length give another loss than the training's eval of the same checkpoint.
    seq_len = seq_len or trained_seq_len(checkpoint_path) or config.seq_len
    if seq_len > config.seq_len:
        raise TrainInputError(
            f"seq_len={seq_len} is above the model's maximum (model.seq_len={config.seq_len})"
        )
    mesh = make_mesh(num_devices)
    if batch_size % mesh.devices.size:
        raise TrainInputError(
            f"batch_size={batch_size} is not divisible by the {mesh.devices.size} devices"
        )
    eval_sets = open_eval_sets(datasets, seq_len, split, bytes_per_token)
    params = jax.device_put(params, replicated(mesh))
    return run_eval(
        _eval_step(config, compute_dtype, mesh),
        params,
        eval_sets,
        seq_len,
        batch_size,
        max_batches,
        batch_sharding(mesh),
        config.vocab_size,
        token_bytes,
    )


def evaluate_to_dict(results: Mapping[str, EvalResult]) -> dict[str, Any]:
    return {name: r.to_dict() for name, r in results.items()}
