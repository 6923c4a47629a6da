"""The work a `dataset` step sends to Zephyr workers: fetch one file, check it, count it.

It lives here, not beside the asset in `assets/`: a worker imports a task's module to
unpickle it, and importing `assets` loads Dagster, DuckDB and the factories, seconds of a
fresh worker's start.
"""

from __future__ import annotations

import dataclasses

from marin_dagster.datasets.sources import (
    FileFetch,
    SourceError,
    check_text_field,
    count_records,
    fetch_file,
)
from marin_dagster.zephyr import InputError, get_shared

RESOLVED = "datasets.tasks/resolved"
"""The shared object holding the ResolvedSource: one copy per worker, not one per file."""


@dataclasses.dataclass(frozen=True)
class FetchJob:
    """One Zephyr task: fetch one file, check its text field, count its records."""

    index: int
    output_path: str
    text_key: str
    count: bool
    source: str  # as the user gave it, for errors


@dataclasses.dataclass(frozen=True)
class Fetched:
    """One file's answer: where it went, records checked, the broken lines among them
    (naming the original's lines), and its record count where counted."""

    fetch: FileFetch
    checked: int
    broken: list[str]
    records: int | None


def fetch_one(job: FetchJob) -> Fetched:
    resolved = get_shared(RESOLVED)
    f = resolved.files[job.index]
    done = fetch_file(resolved, f, job.output_path)
    # The copy holds the original's bytes, so its lines are the original's: name the file
    # the user can fix, not the copy (editing the copy would change nothing).
    original = resolved.origin(f)
    try:
        check = check_text_field([done.path], job.text_key, source=job.source, allow_empty=True)
        return Fetched(
            done,
            check.records,
            [b.replace(done.path, original) for b in check.broken],
            count_records(done.path) if job.count else None,
        )
    except (SourceError, InputError) as e:
        if isinstance(e, SourceError):
            raise SourceError(
                e.source, e.detail.replace(done.path, original), factory=e.factory
            ) from None
        raise InputError(str(e).replace(done.path, original)) from None
