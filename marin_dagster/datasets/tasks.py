"""The work a `dataset` step sends to Zephyr workers: fetch one file, check it, count it.

It lives here, not beside the asset in `assets/`: a worker imports a task's module to
unpickle it, and importing `assets` loads Dagster, DuckDB and the factories, seconds of a
fresh worker's start.
"""

from __future__ import annotations

import dataclasses

from marin_dagster.datasets.sources import (
    FileFetch,
    check_text_field,
    count_records,
    fetch_file,
)
from marin_dagster.zephyr import get_shared

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


def fetch_one(job: FetchJob) -> tuple[FileFetch, int, int | None]:
    resolved = get_shared(RESOLVED)
    done = fetch_file(resolved, resolved.files[job.index], job.output_path)
    checked = check_text_field([done.path], job.text_key, source=job.source, allow_empty=True)
    return done, checked, count_records(done.path) if job.count else None
