"""StorageResource: where step outputs live (local disk, memory://, gs://) and how leases behave."""

from __future__ import annotations

import os
import uuid

import dagster as dg

from marin_dagster import fs
from marin_dagster.execution.lease import LeaseSettings

DEFAULT_PREFIX = "./data"


def default_prefix() -> str:
    return os.environ.get("MARIN_PREFIX") or DEFAULT_PREFIX


class StorageError(RuntimeError):
    pass


def prefix_problem(prefix: str) -> str | None:
    """For what only reads the prefix (a dry run, `marin status`): StorageError where a local
    prefix is a file, under which nothing can be read; why a run could not write it, or None.
    A run checks more (`check_writable`)."""
    path = fs.local_path(prefix)
    if path is None:
        return None
    if os.path.exists(path) and not os.path.isdir(path):
        raise StorageError(
            f"storage prefix {prefix!r} is a file, not a folder: give MARIN_PREFIX (a script's "
            "--prefix) a folder"
        )
    existing = path
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"storage prefix {prefix!r} is not writable ({existing} is not)"
    return None


class StorageResource(dg.ConfigurableResource):
    """Every step writes `{prefix}/{name}-{version}`; set `prefix` with MARIN_PREFIX."""

    prefix: str = DEFAULT_PREFIX
    heartbeat_s: float = 30.0
    stale_after_s: float = 90.0
    lease_wait_s: float = 3600.0
    downloads: str = ""
    """Where fetched sources (sdists, archives) are cached; default `{prefix}/downloads`."""

    @property
    def root(self) -> str:
        return fs.normalize(self.prefix)

    def output_path(self, name: str, version: str) -> str:
        return fs.join(self.root, f"{name}-{version}")

    def path(self, *parts: str) -> str:
        return fs.join(self.root, *parts)

    @property
    def downloads_root(self) -> str:
        return fs.normalize(self.downloads) if self.downloads else self.path("downloads")

    def lease_settings(self) -> LeaseSettings:
        return LeaseSettings(
            heartbeat_s=self.heartbeat_s,
            stale_after_s=self.stale_after_s,
            wait_s=self.lease_wait_s,
        )

    def check_writable(self) -> None:
        """Fail before any work when the prefix cannot be written."""
        if self.stale_after_s <= self.heartbeat_s:
            raise StorageError(
                f"StorageResource.stale_after_s ({self.stale_after_s}) must exceed heartbeat_s "
                f"({self.heartbeat_s}), or live leases would be taken over"
            )
        probe = fs.join(self.root, f".marin-write-probe-{uuid.uuid4().hex[:8]}")
        try:
            fs.makedirs(self.root)
            fs.write_bytes(probe, b"ok")
            fs.remove(probe)
        except Exception as e:
            raise StorageError(
                f"storage prefix {self.root!r} is not writable ({type(e).__name__}: {e}). "
                "Set MARIN_PREFIX (a script's --prefix, StorageResource.prefix) to a folder or "
                "bucket you can write."
            ) from e

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self.check_writable()
