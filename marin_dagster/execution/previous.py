"""The output a rebuild replaces, kept until the rebuild succeeds.

A forced rebuild, or one whose inputs changed, writes at the same path as the output it
replaces (the path holds the version, which did not change). Clearing that output first
would leave nothing when the rebuild fails (a bad file landed in a watched folder, a
killed worker): the output was usable, and it is what `marin sql` and the steps after it
read. So its files move to `.previous/` inside the output (a rename on a local disk; on
an object store a server-side copy per object), are put back when the rebuild fails, and
are removed once the rebuild's SUCCESS is written.

The status file moves first and comes back last, so the output never reads SUCCESS
while its files are elsewhere. A run killed mid-rebuild leaves `.previous/` beside the
partial output: the next run resumes the rebuild, and `.previous/` is still what a
failure puts back.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from marin_dagster import fs
from marin_dagster.execution.status import (
    LOCK_FILE,
    MANIFEST_FILE,
    PREVIOUS_DIR,
    STATUS_FILE,
    StepStatus,
    read_status,
)

logger = logging.getLogger(__name__)


def _entries(fsys: Any, root: str) -> list[str]:
    """The output's entries, less the lease and `.previous/`; status, then manifest, last."""
    if not fsys.exists(root):
        return []
    keep = (LOCK_FILE, PREVIOUS_DIR)
    found = [e for e in fsys.ls(root, detail=False) if fs.basename(e) not in keep]
    order = {MANIFEST_FILE: 1, STATUS_FILE: 2}
    return sorted(found, key=lambda e: order.get(fs.basename(e), 0))


def clear(output_path: str) -> None:
    """Remove what the output holds, but its lease and `.previous/`."""
    fsys, root = fs.url_to_fs(output_path)
    for entry in reversed(_entries(fsys, root)):  # the status first
        fsys.rm(entry, recursive=True)


def _move_all(fsys: Any, entries: list[str], to: str) -> None:
    fsys.makedirs(to, exist_ok=True)
    for entry in entries:
        target = f"{to}/{fs.basename(entry)}"
        if "file" in fsys.protocol:  # a rename, whatever the output's size
            os.rename(entry, target)
        else:  # gcsfs's mv tries a move API first that most buckets refuse, and warns
            fsys.copy(entry, target, recursive=True)
            fsys.rm(entry, recursive=True)


def set_aside(output_path: str) -> None:
    """Before a rebuild: a finished output moves to `.previous/`; anything else is cleared
    (a killed rebuild's partial files, `.previous/` keeping the output it replaced)."""
    record = read_status(output_path)
    if record is None or record.status != StepStatus.SUCCESS:
        clear(output_path)
        return
    fsys, root = fs.url_to_fs(output_path)
    previous = f"{root.rstrip('/')}/{PREVIOUS_DIR}"
    if fsys.exists(previous):  # a rebuild killed after its SUCCESS: older than this one
        fsys.rm(previous, recursive=True)
    _move_all(fsys, list(reversed(_entries(fsys, root))), previous)  # the status first


def discard(output_path: str) -> None:
    """After the rebuild's SUCCESS: the output it replaced is no longer needed."""
    fs.remove(fs.join(output_path, PREVIOUS_DIR), recursive=True)


def restore(output_path: str, log: logging.Logger | Any = logger) -> bool:
    """After a failed rebuild: put the output it replaced back. False when there is none,
    or when what `.previous/` holds is not all of it (its manifest names missing files)."""
    fsys, root = fs.url_to_fs(output_path)
    previous = f"{root.rstrip('/')}/{PREVIOUS_DIR}"
    record = read_status(fs.join(output_path, PREVIOUS_DIR))
    if record is None or record.status != StepStatus.SUCCESS:
        return False
    manifest = fs.read_json_or_none(fs.join(output_path, PREVIOUS_DIR, MANIFEST_FILE))
    present = {p[len(previous) + 1 :] for p in fsys.find(previous)}
    missing = sorted(set((manifest or {}).get("files", {})) - present)
    if manifest is None or missing:
        log.warning(
            f"{output_path}: the output this rebuild replaced cannot be put back "
            f"({'no manifest' if manifest is None else f'{len(missing)} file(s) missing'})"
        )
        return False
    clear(output_path)
    _move_all(fsys, _entries(fsys, previous), root)  # the status last
    discard(output_path)
    return True
