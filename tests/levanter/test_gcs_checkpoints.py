"""Checkpoints into gs:// (the GCS emulator) through orbax's writer, tensorstore.

tensorstore does not read STORAGE_EMULATOR_HOST as gcsfs does, and asks for Application
Default Credentials: a first save waited without end. The checkpointer now points it at
the emulator and probes the store in bounded time, failing with what to do. (A whole
training run on the emulator is out of reach: gcp-storage-emulator serves no object
generation in the headers tensorstore reads, so OCDBT's conditional writes of a second
checkpoint fail with "Malformed StorageGeneration"; real GCS sends them.)
"""

from __future__ import annotations

import pytest

from marin_dagster import fs
from marin_dagster.levanter import checkpoint
from marin_dagster.levanter.checkpoint import Checkpointer, CheckpointStorageError
from tests.conftest import free_port


def _checkpointer(directory: str) -> Checkpointer:
    return Checkpointer(
        directory, keep=None, checkpoint_every_steps=1, checkpoint_every_minutes=None
    )


def test_tensorstore_reaches_the_emulator_gcsfs_uses(gcs_prefix, monkeypatch):
    monkeypatch.delenv("TENSORSTORE_GCS_HTTP_URL", raising=False)
    monkeypatch.delenv("GOOGLE_AUTH_TOKEN_FOR_TESTING", raising=False)
    monkeypatch.setattr(checkpoint, "PROBE_TIMEOUT_S", 30.0)
    directory = f"{gcs_prefix}/run/checkpoints"
    # The user's data beside it: the probe's delete_range deleted the whole bucket on the
    # emulator (it ignores the listing's offsets that bound the range).
    fs.write_bytes(f"{gcs_prefix}/input/notes.jsonl", b'{"text": "keep me"}\n')
    assert _checkpointer(directory).latest_step() is None
    gcs, root = fs.url_to_fs(directory)
    gcs.invalidate_cache()
    assert not gcs.exists(f"{root}/.marin-tensorstore-probe")  # the probe's object is gone
    assert fs.read_bytes(f"{gcs_prefix}/input/notes.jsonl") == b'{"text": "keep me"}\n'


def test_a_store_tensorstore_cannot_write_fails_at_once_saying_what_to_do(gcs_prefix, monkeypatch):
    """As when gcsfs is authorised and tensorstore is not: no answer, within the bound."""
    monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setattr(checkpoint, "PROBE_TIMEOUT_S", 3.0)
    directory = f"{gcs_prefix}/run/checkpoints"
    with pytest.raises(CheckpointStorageError) as err:
        _checkpointer(directory)
    message = str(err.value)
    assert f"cannot write to {directory} (no answer within 3 s)" in message
    assert "gcloud auth application-default login" in message


def test_a_store_orbax_cannot_write_to_is_refused_naming_it():
    """A memory:// prefix (which serves a script's own process) reached orbax, which failed
    with a bare KeyError: 'memory://'."""
    with pytest.raises(
        CheckpointStorageError,
        match=r"^checkpoints cannot be written to memory://x/ckpt: orbax writes to a local folder or gs:// only",
    ):
        _checkpointer("memory://x/ckpt")
