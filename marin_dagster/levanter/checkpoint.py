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
import os
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


def tensorstore_to_gcs_emulator() -> None:
    """Point tensorstore (orbax's writer) at the GCS emulator that gcsfs is pointed at.

    gcsfs and the Google client read STORAGE_EMULATOR_HOST; tensorstore does not, and asks
    the real GCS for credentials the emulator never needs, waiting without end for its
    first checkpoint. Only an emulator sets that variable, so no real bucket is affected.
    """
    host = os.environ.get("STORAGE_EMULATOR_HOST")
    if host:
        os.environ.setdefault(
            "TENSORSTORE_GCS_HTTP_URL", host if "://" in host else f"http://{host}"
        )
        os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")


# How long tensorstore may take to write one small object where the checkpoints go.
PROBE_TIMEOUT_S = 60.0
_PROBE_KEY = ".marin-tensorstore-probe"


class CheckpointStorageError(RuntimeError):
    """Orbax's writer (tensorstore) cannot write where the checkpoints go."""


def _probe_tensorstore(directory: str) -> None:
    """Write and delete one small object under `directory` through tensorstore, in bounded
    time. gcsfs may be authorised where tensorstore is not (it asks for Application Default
    Credentials), and then orbax's first save waits without end."""
    import tensorstore as ts

    bucket, _, path = directory.removeprefix("gs://").partition("/")
    spec = {"driver": "gcs", "bucket": bucket, "path": path.rstrip("/") + "/"}
    try:
        store = ts.KvStore.open(spec).result(timeout=PROBE_TIMEOUT_S)
        store.write(_PROBE_KEY, b"ok").result(timeout=PROBE_TIMEOUT_S)
        # One key's delete, not delete_range: tensorstore deletes a range by listing it with
        # start and end offsets, which the GCS emulator ignores, and so it deleted every
        # object in the bucket, the user's input data with the rest.
        store.write(_PROBE_KEY, None).result(timeout=PROBE_TIMEOUT_S)
    except Exception as e:  # TimeoutError, or tensorstore's ValueError with GCS's answer
        what = "no answer" if isinstance(e, TimeoutError) else f"{type(e).__name__}: {e}"
        raise CheckpointStorageError(
            f"orbax's checkpoint writer (tensorstore) cannot write to {directory} ({what} "
            f"within {PROBE_TIMEOUT_S:.0f} s). It authenticates with Application Default "
            "Credentials, not gcsfs's token: run `gcloud auth application-default login` or "
            "set GOOGLE_APPLICATION_CREDENTIALS to a service account key that may write there"
        ) from None


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
        if not (fs.is_local(self.directory) or self.directory.startswith("gs://")):
            # orbax resolves paths with etils, which knows local folders and gs:// only:
            # memory:// failed with a bare KeyError: 'memory://'.
            raise CheckpointStorageError(
                f"checkpoints cannot be written to {directory}: orbax writes to a local folder "
                "or gs:// only; give the run a storage prefix of either kind "
                "(--prefix / MARIN_PREFIX)"
            )
        if self.directory.startswith("gs://"):
            tensorstore_to_gcs_emulator()
            _probe_tensorstore(self.directory)
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
