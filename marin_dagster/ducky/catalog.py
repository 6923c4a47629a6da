"""Which output each asset name points at, and what format its files have.

A view points at the asset's *current* version (the code location's
`code_version`) when that output holds SUCCESS; otherwise at the newest
SUCCESS among the other versions of the same name under the prefix
(`{prefix}/{name}-XXXXXXXX/.status.json`, newest `updated_at`), marked
`current=False` so a reader knows the data is from an older config.

Formats come from the output's manifest, so a new dataset factory needs no
registration: JSONL (`.jsonl`, `.ndjson`, `.json.gz`, with `.gz`/`.zst`),
Parquet, CSV, or a token cache (`*/offsets.npy`, see docs/formats.md). Files
of several of the first three are one table all the same (`mixed`: each read
by its own reader, columns matched by name). A
factory may override with asset metadata `marin/format` and restrict the files
with a glob `marin/files` (relative to the output), or declare both for its
kind with `register_kind`.

Which files a view reads, without `marin/files`:

- never side files: names or folders starting with `.` or `_` (`.status.json`,
  `.manifest.json`, `_work/`) and uncompressed `.json` files, which are single
  JSON documents (`counts.json`, `eval.json`, `tokenizer.json`, ledgers), not
  JSON lines; a factory whose shards really are `*.json` names them in
  `marin/files`;
- a token cache: every `offsets.npy` (its splits are one table);
- otherwise one table, at the right depth: the data files at the output's top
  level when there are any (the shards next to side files); else the
  `documents/` folder when there is one (a dedup output: `documents/` is the
  dataset, `attributes/`, `signatures/` and `links/` describe it); else every
  data file (splits in folders: `train/`, `validation/`). `dataset()`'s copy of a
  user's folder is every data file at any depth (`register_kind("dataset")`).

Resolving never fails as a whole: an output that cannot be read is reported
as `Unavailable` (with why and what to do) by `resolve_views`, and left out,
with a logged warning, by `resolve_catalog`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from marin_dagster import fs
from marin_dagster.execution.status import (
    MANIFEST_FILE,
    PREVIOUS_DIR,
    RUN_STOPPED,
    STATUS_FILE,
    StatusRecord,
    StepStatus,
    read_status,
)

logger = logging.getLogger(__name__)

JSONL, PARQUET, CSV, TOKEN_CACHE = "jsonl", "parquet", "csv", "token_cache"
FORMATS = (JSONL, PARQUET, CSV, TOKEN_CACHE)
MIXED = "mixed"
"""Data files of several of JSONL, Parquet and CSV: each read by its own reader, one table."""

_SUFFIXES = {
    JSONL: (
        ".jsonl",
        ".jsonl.gz",
        ".jsonl.zst",
        ".json",
        ".json.gz",
        ".json.zst",
        ".ndjson",
        ".ndjson.gz",
        ".ndjson.zst",
    ),
    PARQUET: (".parquet",),
    CSV: (".csv", ".csv.gz", ".csv.zst", ".tsv", ".tsv.gz", ".tsv.zst"),
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
        raise ValueError(
            f"register_kind({kind!r}): format {format!r} is not one of {', '.join(FORMATS)}"
        )
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
    note: str = ""
    """Set when the view is not the current version's output: which output it shows, and why."""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.name, self.version, self.path)


def format_of(rel_path: str, *, plain_json: bool = False) -> str | None:
    """The format of one output file by its name, or None for side files.

    Uncompressed `.json` files are single JSON documents (counts, configs,
    ledgers) unless `plain_json` (the factory named them in `marin/files`).
    """
    parts = rel_path.split("/")
    if any(part.startswith((".", "_")) for part in parts):
        return None
    base = parts[-1]
    if base == "offsets.npy":
        return TOKEN_CACHE
    if base.endswith(".json") and not plain_json:
        return None
    for fmt, suffixes in _SUFFIXES.items():
        if base.endswith(suffixes):
            return fmt
    return None


def detect_format(rel_paths: Iterable[str], *, plain_json: bool = False) -> str | None:
    """The format an output's data files share, or MIXED where they differ (a folder of
    JSONL and CSV files copied by `dataset()`: one table still). A token cache wins: its
    .npy are the data."""
    formats = {format_of(p, plain_json=plain_json) for p in rel_paths} - {None}
    if not formats:
        return None
    if TOKEN_CACHE in formats:
        return TOKEN_CACHE
    return formats.pop() if len(formats) == 1 else MIXED


DOCUMENTS_FOLDER = "documents"


def main_table(rel_paths: Iterable[str]) -> list[str]:
    """The data files one view shows: top-level shards, else `documents/`, else all of them."""
    data = sorted(r for r in rel_paths if format_of(r) is not None)
    if any(format_of(r) == TOKEN_CACHE for r in data):
        return data
    top = [r for r in data if "/" not in r]
    if top:
        return top
    documents = [r for r in data if r.startswith(DOCUMENTS_FOLDER + "/")]
    return documents or data


def load_output(
    entry: AssetEntry, path: str, record: StatusRecord, current: bool
) -> Dataset | None:
    """The Dataset of one SUCCESS output, or None when it holds no readable data files."""
    manifest = _read_manifest(path)
    hint = hint_for(entry.kind)
    pattern = entry.files or hint.files
    rels = sorted(manifest.get("files", {}))
    if pattern:
        chosen = [r for r in rels if fnmatch.fnmatch(r, pattern)]
    else:
        chosen = main_table(rels)
    explicit = bool(pattern)
    fmt = entry.format or hint.format or detect_format(chosen, plain_json=explicit)
    if fmt is None:
        logger.info(
            f"{entry.name}: {path} has no JSONL, Parquet, CSV or token-cache files; no view"
        )
        return None
    if fmt not in (*FORMATS, MIXED):
        raise ValueError(
            f"{entry.name}: marin/format {fmt!r} is not one of {', '.join(FORMATS)}; "
            "fix the asset's metadata"
        )
    readable = (fmt,) if fmt != MIXED else (JSONL, PARQUET, CSV)
    files = tuple(fs.join(path, r) for r in chosen if format_of(r, plain_json=explicit) in readable)
    if not files:
        return None
    return Dataset(
        entry.name,
        entry.kind,
        record.version,
        path,
        fmt,
        files,
        current,
        record.updated_at,
        record.metadata,
    )


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


def _read_status(path: str) -> StatusRecord | None:
    """read_status, with the status file named in its errors."""
    try:
        return read_status(path)
    except ValueError as e:
        where = fs.join(path, STATUS_FILE)
        raise ValueError(str(e) if where in str(e) else f"{where}: {e}") from e


def _read_manifest(path: str) -> dict[str, Any]:
    where = fs.join(path, MANIFEST_FILE)
    try:
        manifest = fs.read_json_or_none(where) or {"files": {}}
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files", {}), dict):
        raise ValueError(f'{where}: not a manifest ({{"files": {{path: {{"size": ...}}}}}})')
    return manifest


def _current_state(path: str, record: StatusRecord | None) -> str:
    if record is None:
        return f"not materialized yet (no output at {path})"
    if record.status == StepStatus.RUNNING:
        return (
            f"being written ({path} is RUNNING; `marin status` says whether its run is alive "
            "or was killed)"
        )
    return f"{record.status.value} ({path})"


def resolve_dataset(prefix: str, entry: AssetEntry) -> Dataset | None:
    """The output a view of `entry` should read: current version, else newest other SUCCESS."""
    current_path = fs.join(prefix, f"{entry.name}-{entry.version}")
    record = _read_status(current_path)
    if record is not None and record.status == StepStatus.SUCCESS:
        return load_output(entry, current_path, record, current=True)
    if record is not None and record.status == StepStatus.RUNNING:
        # A rebuild (forced, or its inputs changed) keeps the output it replaces here until it
        # succeeds; a killed one leaves it there. It is still the asset's last good output.
        previous = fs.join(current_path, PREVIOUS_DIR)
        kept = _read_status(previous)
        dataset = (
            load_output(entry, previous, kept, current=False)
            if kept is not None and kept.status == StepStatus.SUCCESS
            else None
        )
        if dataset is not None:
            note = (
                f'"{entry.name}" shows its output from before the rebuild ({previous}): '
                f"{_current_state(current_path, record)}"
            )
            return dataclasses.replace(dataset, note=note)
    older: list[tuple[float, str, StatusRecord]] = []
    for path in _other_versions(prefix, entry.name):
        if path == current_path:
            continue
        try:
            rec = _read_status(path)
        except ValueError as e:
            logger.warning(f"{entry.name}: skipping {path}: {e}")
            continue
        if rec is not None and rec.status == StepStatus.SUCCESS:
            older.append((rec.updated_at, path, rec))
    if not older:
        return None
    _, path, rec = max(older, key=lambda t: (t[0], t[1]))
    dataset = load_output(entry, path, rec, current=False)
    if dataset is None:
        return None
    # A reader who changed the config must not take the old config's rows for the new one's.
    note = (
        f'"{entry.name}" shows version {rec.version}, the output of an older config ({path}): '
        f"its current version {entry.version} is {_current_state(current_path, record)}; "
        "materialize it to query what the experiment defines now"
    )
    return dataclasses.replace(dataset, note=note)


@dataclasses.dataclass(frozen=True)
class NoView:
    """An asset with no output to query: not built (not materialized, being written,
    failed), or built with no table in its output (a tokenizer). `reason` says which and
    what to do."""

    name: str
    reason: str
    built: bool = False


def _no_view(prefix: str, entry: AssetEntry) -> NoView:
    """Why an asset of the location has no view: not built yet, being built, failed, or empty."""
    current_path = fs.join(prefix, f"{entry.name}-{entry.version}")
    record = _read_status(current_path)
    if record is not None and record.status == StepStatus.SUCCESS:
        return NoView(
            entry.name,
            f"{entry.name}'s output {current_path} holds no JSONL, Parquet, CSV or token-cache "
            "files, so it has no table to query",
            built=True,
        )
    state = _current_state(current_path, record)
    if record is None:
        why = f"{entry.name} is {state}: materialize it, then query it"
    elif record.status == StepStatus.RUNNING:
        why = f"{entry.name} is {state}: query it once its run has succeeded"
    elif record.error and RUN_STOPPED in record.error:  # nothing to fix; a new run resumes
        why = f"{entry.name}'s current version is {state}, its run stopped: materialize it again"
    else:
        why = f"{entry.name}'s current version is {state}: fix what failed and materialize it again"
    return NoView(entry.name, why)


@dataclasses.dataclass(frozen=True)
class Unavailable:
    """An asset with an output but no view: `reason` says why and what to do."""

    name: str
    reason: str


def resolve_views(
    prefix: str, entries: Iterable[AssetEntry]
) -> list[Dataset | Unavailable | NoView]:
    """Every entry with a readable SUCCESS output as a Dataset, every unreadable one as
    Unavailable, every other one as NoView.

    One output that cannot be read (a corrupt status or manifest, a bad
    `marin/format`) never hides the others: it is logged and reported instead.
    """
    out: list[Dataset | Unavailable | NoView] = []
    down: str | None = None  # why the storage did not answer, once it has not
    for entry in entries:
        if down is not None:
            # Every output is on the one storage: asking again cost each view the client's
            # whole retry schedule (35 s with gcsfs), minutes before any answer.
            out.append(Unavailable(entry.name, down))
            continue
        try:
            dataset = resolve_dataset(prefix, entry)
            view = dataset or _no_view(prefix, entry)
        except (ValueError, OSError) as e:
            if fs.unreachable(e):
                down = reason = (
                    f"cannot reach the storage ({type(e).__name__}: {e}); check that it is up "
                    "and reachable, then query again"
                )
            else:
                reason = f"{e}; fix or remove that file, or rematerialize {entry.name}"
            logger.warning(f"ducky: no view {entry.name!r}: {reason}")
            view = Unavailable(entry.name, reason)
        out.append(view)
    if down is not None and len(out) > 1:
        logger.warning(f"ducky: not asked for the other {len(out) - 1} view(s): {down}")
    return out


def resolve_catalog(prefix: str, entries: Iterable[AssetEntry]) -> list[Dataset]:
    """Every entry that has a readable SUCCESS output, in the entries' order (see `resolve_views`)."""
    return [d for d in resolve_views(prefix, entries) if isinstance(d, Dataset)]
