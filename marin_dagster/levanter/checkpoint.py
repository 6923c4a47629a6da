"""Saving and loading parameters: orbax checkpoints of the train state, and the final
parameters as one `.npz`.

A checkpoint is `{output}/checkpoints/{step}/` with the state (params, optimizer
state, step) and a small JSON of metadata. Orbax writes each step to a temporary
directory and renames it when complete, so a killed save leaves no step that
looks finished; `cleanup_tmp_directories` clears such leftovers on the next open.
`params.npz` holds the final parameters by path ("layers/q_proj", ...), float32.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from marin_dagster import fs
from marin_dagster.levanter.model import Params

logger = logging.getLogger(__name__)


class Checkpointer:
    def __init__(
        self,
        directory: str,
        *,
        keep: int | None,
        checkpoint_every_steps: int | None,
        checkpoint_every_minutes: float | None,
    ) -> None:
        self.directory = fs.normalize(directory)  # orbax wants absolute paths
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be at least 1 (or None for all), got {keep}")
        if checkpoint_every_steps is not None and checkpoint_every_steps < 1:
            raise ValueError(
                f"checkpoint_every_steps must be positive, got {checkpoint_every_steps}"
            )
        self.every_steps = checkpoint_every_steps
        self.every_seconds = (
            None if checkpoint_every_minutes is None else checkpoint_every_minutes * 60.0
        )
        self._last_save_time = time.monotonic()
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep,
                create=True,
                enable_async_checkpointing=True,
                cleanup_tmp_directories=True,
            ),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def should_save(self, step: int) -> bool:
        if self.every_steps is not None and step % self.every_steps == 0:
            return True
        return (
            self.every_seconds is not None
            and time.monotonic() - self._last_save_time >= self.every_seconds
        )

    def save(self, step: int, state: Any, metadata: dict[str, Any]) -> bool:
        """Start an asynchronous save; False (logged) when `step` is already saved."""
        # Orbax returns False without a word for a step it already holds
        # (a rerun reaching a step the killed run had saved): say so here.
        if step in self.manager.all_steps():
            logger.info(
                "checkpoint for step %d already exists in %s; not saved again", step, self.directory
            )
            return False
        saved = self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), metadata=ocp.args.JsonSave(metadata)
            ),
        )
        if not saved:
            logger.warning("orbax declined to save step %d in %s", step, self.directory)
        self._last_save_time = time.monotonic()
        return bool(saved)

    def restore(self, step: int, like: Any) -> tuple[Any, dict[str, Any]]:
        """The state saved at `step`, placed with the shardings of `like` (arrays or ShapeDtypeStructs)."""
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like
        )
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), metadata=ocp.args.JsonRestore()
            ),
        )
        return restored["state"], dict(restored["metadata"] or {})

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()

    def step_path(self, step: int) -> str:
        return fs.join(self.directory, str(step))


def flatten_params(params: Params) -> dict[str, np.ndarray]:
    flat = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        flat["/".join(str(getattr(k, "key", k)) for k in path)] = np.asarray(jax.device_get(leaf))
    return flat


def unflatten_params(flat: Mapping[str, np.ndarray]) -> Params:
    params: dict[str, Any] = {}
    for key, value in flat.items():
        node = params
        parts = key.split("/")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = jnp.asarray(value)
    return params


def save_params(path: str, params: Params) -> None:
    buf = io.BytesIO()
    np.savez(buf, **flatten_params(params))
    fs.write_bytes(path, buf.getvalue())


def load_params(path: str) -> Params:
    with np.load(io.BytesIO(fs.read_bytes(path))) as z:
        return unflatten_params({k: z[k] for k in z.files})
