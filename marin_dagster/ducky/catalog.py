"""Which output each asset name points at, and what format its files have.

A view points at the asset's *current* version (the code location's
`code_version`) when that output holds SUCCESS; otherwise at the newest
SUCCESS among the other versions of the same name under the prefix
(`{prefix}/{name}-XXXXXXXX/.status.json`, newest `updated_at`), marked
`current=False` so a reader knows the data is from an older config.

Formats come from the output's manifest, so a new dataset factory needs no
registration: JSONL (`.jsonl`, `.jsonl.gz`, `.jsonl.zst`, `.json`), Parquet,
CSV, or a token cache (`*/offsets.npy`, see docs/formats.md). A factory may
override with asset metadata `marin/format` and restrict the files with a
glob `marin/files` (relative to the output), or declare both for its kind
with `register_kind`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from marin_dagster import fs
from marin_dagster.execution.status import MANIFEST_FILE, StatusRecord, StepStatus, read_status

logger = logging.getLogger(__name__)

JSONL, PARQUET, CSV, TOKEN_CACHE = "jsonl", "parquet", "csv", "token_cache"
FORMATS = (JSONL, PARQUET, CSV, TOKEN_CACHE)

_SUFFIXES = {
    JSONL: (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".json.gz", ".json.zst", ".ndjson"),
    PARQUET: (".parquet",),
    CSV: (".csv", ".csv.gz", ".csv.zst", ".tsv"),
}
_VERSION = re.compile(r"^[0-9a-f]{8}$")


@dataclasses.dataclass(frozen=True)
class AssetEntry:
    """What the code location says about one asset: its name, kind and current version."""

    name: str
    kind: str
    version: str
    format: str | None = None
    files: str | None = None


@dataclasses.dataclass(frozen=True)
class ReaderHint:
    """How to read outputs of one kind when the manifest alone is ambiguous."""

    format: str | None = None
    files: str | None = None


# Kinds whose outputs hold several tables pick the one their view shows.
_KIND_HINTS: dict[str, ReaderHint] = {}


def register_kind(kind: str, *, format: str | None = None, files: str | None = None) -> None:
    """Declare the format and/or a file glob for the outputs of factories of `kind`."""
    if format is not None and format not in FORMATS:
        raise ValueError(f"register_kind({kind!r}): format {format!r} is not one of {', '.join(FORMATS)}")
    _KIND_HINTS[kind] = ReaderHint(format, files)


def hint_for(kind: str) -> ReaderHint:
    return _KIND_HINTS.get(kind, ReaderHint())


@dataclasses.dataclass(frozen=True)
class Dataset:
    """One queryable output: a view named `name` over `files` read as `format`."""

    name: str
    kind: str
    version: str
    path: str
    format: str
    files: tuple[str, ...]
    current: bool
    updated_at: float
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.name, self.version, self.path)


def format_of(rel_path: str) -> str | None:
    """The format of one output file by its name, or None for side files."""
    base = rel_path.rsplit("/", 1)[-1]
    if base.startswith(".") or any(part.startswith(".") for part in rel_path.split("/")[:-1]):
        return None
    if base == "offsets.npy":
        return TOKEN_CACHE
    for fmt, suffixes in _SUFFIXES.items():
        if base.endswith(suffixes):
            return fmt
    return None


def detect_format(rel_paths: Iterable[str]) -> str | None:
    """The format most of an output's data files share (a token cache wins: its .npy are the data)."""
    counts = Counter(f for f in (format_of(p) for p in rel_paths) if f is not None)
    if not counts:
        return None
    if TOKEN_CACHE in counts:
        return TOKEN_CACHE
    return counts.most_common(1)[0][0]


def _data_files(path: str, manifest: Mapping[str, Any], fmt: str, pattern: str | None) -> tuple[str, ...]:
    rels = sorted(manifest.get("files", {}))
    if pattern:
        rels = [r for r in rels if fnmatch.fnmatch(r, pattern)]
    return tuple(fs.join(path, r) for r in rels if format_of(r) == fmt)


def load_output(entry: AssetEntry, path: str, record: StatusRecord, current: bool) -> Dataset | None:
    """The Dataset of one SUCCESS output, or None when it holds no readable data files."""
    manifest = fs.read_json_or_none(fs.join(path, MANIFEST_FILE)) or {"files": {}}
    hint = hint_for(entry.kind)
    pattern = entry.files or hint.files
    rels = list(manifest.get("files", {}))
    if pattern:
        rels = [r for r in rels if fnmatch.fnmatch(r, pattern)]
    fmt = entry.format or hint.format or detect_format(rels)
    if fmt is None:
        logger.info(f"{entry.name}: {path} has no JSONL, Parquet, CSV or token-cache files; no view")
        return None
    if fmt not in FORMATS:
        raise ValueError(f"{entry.name}: marin/format {fmt!r} is not one of {', '.join(FORMATS)}")
    files = _data_files(path, manifest, fmt, pattern)
    if not files:
        return None
    return Dataset(entry.name, entry.kind, record.version, path, fmt, files, current,
                   record.updated_at, record.metadata)


def _other_versions(prefix: str, name: str) -> list[str]:
    parent, _, base = fs.join(prefix, name).rpartition("/")
    fsys, root = fs.url_to_fs(parent)
    try:
        entries = fsys.ls(root, detail=False)
    except FileNotFoundError:
        return []
    out = []
    for entry in entries:
        leaf = fs.basename(entry)
        if leaf.startswith(base + "-") and _VERSION.match(leaf[len(base) + 1 :]):
            out.append(fs.join(parent, leaf))
    return sorted(out)


def resolve_dataset(prefix: str, entry: AssetEntry) -> Dataset | None:
    """The output a view of `entry` should read: current version, else newest other SUCCESS."""
    current_path = fs.join(prefix, f"{entry.name}-{entry.version}")
    record = read_status(current_path)
    if record is not None and record.status == StepStatus.SUCCESS:
        return load_output(entry, current_path, record, current=True)
    older: list[tuple[float, str, StatusRecord]] = []
    for path in _other_versions(prefix, entry.name):
        if path == current_path:
            continue
        try:
            rec = read_status(path)
        except ValueError as e:
            logger.warning(f"{entry.name}: skipping {path}: {e}")
            continue
        if rec is not None and rec.status == StepStatus.SUCCESS:
            older.append((rec.updated_at, path, rec))
    if not older:
        return None
    _, path, rec = max(older, key=lambda t: (t[0], t[1]))
    return load_output(entry, path, rec, current=False)


def resolve_catalog(prefix: str, entries: Iterable[AssetEntry]) -> list[Dataset]:
    """Every entry that has a readable SUCCESS output, in the entries' order."""
    out = []
    for entry in entries:
        dataset = resolve_dataset(prefix, entry)
        if dataset is not None:
            out.append(dataset)
    return out
