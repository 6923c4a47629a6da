"""One writer at a time for a DuckDB database file, across processes.

DuckDB allows one writer per database file; a second process that opens it
for writing fails on the file lock. Writers take an exclusive `flock` on
`{database}.lock` first, so they queue instead of failing. (Local files only:
DuckDB writes databases only to local disks.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator


@contextlib.contextmanager
def writer_lock(database: str) -> Iterator[None]:
    """Hold the database's writer lock; blocks while another writer holds it."""
    os.makedirs(os.path.dirname(os.path.abspath(database)), exist_ok=True)
    with open(f"{database}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
