"""Where a dataset step keeps its documents.

A dataset output holds its documents as JSONL (plain, .gz, .zst, ...), Parquet or CSV files:
generated outputs (raw corpora, dedup results) as `part-*` shards at their top level or, when
they have side outputs (dedup attributes, signatures), under `documents/`; fetched datasets
(`dataset(...)`) under the source's own relative names, in folders as the source had them.
"""

from __future__ import annotations

from marin_dagster import fs
from marin_dagster.datasets.sources import format_of

DATA_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet", ".csv")
"""The common cases, for messages; `format_of` decides (compressions, .json, .ndjson)."""


def _is_data(rel: str) -> bool:
    parts = rel.split("/")
    # dot- and underscore-files (status, manifest, lease, _SUCCESS markers) and temporary
    # files of interrupted writes are not documents
    return (
        format_of(rel) is not None
        and not any(p.startswith((".", "_")) for p in parts)
        and not fs.is_temp_name(rel)
    )


def dataset_files(output_path: str) -> list[str]:
    """The document files of a dataset output, sorted (full URLs for remote stores)."""
    fsys, root = fs.url_to_fs(output_path)
    root = root.rstrip("/")
    protocol = output_path.split("://", 1)[0] + "://" if "://" in output_path else ""
    found: list[str] = []
    for folder in (f"{root}/documents", root):
        found = sorted(p for p in fsys.glob(f"{folder}/part-*") if _is_data(p[len(folder) + 1 :]))
        if found:
            break
    # Files under the source's own names: a dedup of a fetched dataset keeps them under
    # documents/ (its attributes/ beside it are not documents), a fetched dataset anywhere.
    for folder in (f"{root}/documents", root):
        if found or not fsys.isdir(folder):
            continue
        found = sorted(
            p
            for p in fsys.find(folder)
            if p.startswith(folder + "/") and _is_data(p[len(folder) + 1 :])
        )
    if not found:
        raise FileNotFoundError(
            f"{output_path} holds no document files (JSONL, Parquet or CSV, e.g. "
            f"part-*{'|'.join(DATA_SUFFIXES)}); is it a dataset output?"
        )
    return [protocol + p if protocol and not p.startswith(protocol) else p for p in found]
