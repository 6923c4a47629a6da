"""The status file, the manifest and the data version of a step's output.

Layout inside every step output:
  .status.json    RUNNING | SUCCESS | FAILED, the version, the data version; written last
  .manifest.json  every output file with its size and checksum (SUCCESS only)
  .lock.json      the lease (see lease.py)
The data version is the hash of the manifest: the same bytes give the same
data version, so Dagster's staleness follows the data, not the run.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import time
from typing import Any

from marin_dagster import fs

STATUS_FILE = ".status.json"
# A FAILED step's error when its run was stopped (Ctrl-C, Terminate): nothing to fix.
RUN_STOPPED = "the run was stopped (Ctrl-C, or Terminate)"
MANIFEST_FILE = ".manifest.json"
LOCK_FILE = ".lock.json"
PREVIOUS_DIR = ".previous"
"""The output a rebuild replaces, until it succeeds (`execution/previous.py`)."""
EXECUTOR_FILES = frozenset({STATUS_FILE, MANIFEST_FILE, LOCK_FILE})
EXECUTOR_INFO_FILE = ".executor_info"
"""A Marin step's record of what ran: its config (plain values too), function, description."""
ORIGINS_FILE = ".origins.json"
"""Where a step's copied files came from (`execution/origins.py`)."""
# Files that say how an output was made, not what it holds: in its manifest, out of its data
# version. A plain config value, the command that ran the step (its function is
# `__main__.f` under `python exp.py`, `exp.f` under `dagster`) or a moved source changed the
# data version, and the steps after it were rebuilt for the same data.
PROVENANCE_FILES = frozenset({EXECUTOR_INFO_FILE, ORIGINS_FILE})


class StepStatus(enum.StrEnum):
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"


@dataclasses.dataclass(frozen=True)
class StatusRecord:
    status: StepStatus
    version: str
    data_version: str | None = None
    run_id: str | None = None
    error: str | None = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    updated_at: float = 0.0
    inputs: dict[str, str] | None = None
    """What a SUCCESS was built from (each input's data version, a watched folder's content
    hash); None in outputs written before it was recorded."""

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["status"] = self.status.value
        return out


def read_status(output_path: str) -> StatusRecord | None:
    raw = fs.read_json_or_none(fs.join(output_path, STATUS_FILE))
    if raw is None:
        return None
    try:
        return StatusRecord(
            status=StepStatus(raw["status"]),
            version=raw["version"],
            data_version=raw.get("data_version"),
            run_id=raw.get("run_id"),
            error=raw.get("error"),
            metadata=raw.get("metadata") or {},
            updated_at=raw.get("updated_at", 0.0),
            inputs=raw.get("inputs"),
        )
    except (KeyError, ValueError) as e:
        raise ValueError(
            f"{fs.join(output_path, STATUS_FILE)} is not a valid status file ({e}); "
            "delete it to rerun the step"
        ) from e


def write_status(output_path: str, record: StatusRecord) -> None:
    record = dataclasses.replace(record, updated_at=time.time())
    fs.write_json(fs.join(output_path, STATUS_FILE), record.to_json())


def _checksum(fsys: Any, path: str) -> str:
    # Object stores already hold a content checksum; reading the bytes back
    # would double the I/O of every large output.
    info = fsys.info(path)
    for key in ("crc32c", "md5Hash", "ETag"):
        if info.get(key):
            return f"{key}:{info[key]}"
    h = hashlib.sha256()
    with fsys.open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return f"sha256:{h.hexdigest()}"


def build_manifest(output_path: str) -> dict[str, Any]:
    """Every finished file under the output, with size and checksum, sorted."""
    fsys, root = fs.url_to_fs(output_path)
    root = root.rstrip("/")
    files = {}
    for path in sorted(fsys.find(root)):
        rel = path[len(root) + 1 :] if path.startswith(root + "/") else path
        if rel in EXECUTOR_FILES or rel.startswith(f"{PREVIOUS_DIR}/") or fs.is_temp_name(rel):
            continue
        files[rel] = {"size": fsys.size(path), "checksum": _checksum(fsys, path)}
    return {"files": files}


def data_version_of(manifest: dict[str, Any], data_folder: str | None = None) -> str:
    """A digest of the output's files, or of those under `data_folder` alone: what the steps
    after it read (a dedup's documents/, not its attributes and counts)."""
    files = {rel: f for rel, f in manifest["files"].items() if rel not in PROVENANCE_FILES}
    if data_folder is not None:
        files = {rel: f for rel, f in files.items() if rel.startswith(data_folder + "/")}
    manifest = {"files": files}
    payload = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
