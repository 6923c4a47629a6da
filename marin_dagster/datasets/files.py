"""Where a dataset step keeps its documents.

Every dataset output (raw corpora, dedup results) holds its documents as
`part-*` shards in JSONL (plain, .gz, .zst) or Parquet, either at its top
level or, when it has side outputs (dedup attributes, signatures), under
`documents/`.
"""

from __future__ import annotations

from marin_dagster import fs

DATA_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet")


def dataset_files(output_path: str) -> list[str]:
    """The document shards of a dataset output, sorted (full URLs for remote stores)."""
    fsys, root = fs.url_to_fs(output_path)
    protocol = output_path.split("://", 1)[0] + "://" if "://" in output_path else ""
    found: list[str] = []
    for folder in (f"{root.rstrip('/')}/documents", root.rstrip("/")):
        found = sorted(
            p
            for p in fsys.glob(f"{folder}/part-*")
            if p.endswith(DATA_SUFFIXES) and not fs.is_temp_name(p)
        )
        if found:
            break
    if not found:
        raise FileNotFoundError(
            f"{output_path} holds no document shards (part-*{'|'.join(DATA_SUFFIXES)}); "
            "is it a dataset output?"
        )
    return [protocol + p if protocol and not p.startswith(protocol) else p for p in found]
