"""sha256 of local files, remembered across processes by (size, mtime, inode).

A local source is versioned by its content, so a file copied or touched without changing
(`cp` without `-p`, `git checkout`, `rsync`) keeps its version and everything built on
it. Every run worker and step process loads the code location and so resolves the source
again; the cache makes that a `stat` per file once a file has been read. Each entry is a
small file written atomically, so concurrent processes need no lock: the worst they do is
hash the same file twice.

Entries are one per path ever hashed (every file dropped in a watched inbox), so once a day
a process that writes one first removes those whose file is gone, and any temporary file
a killed writer left: the folder grows with the files that exist, not with every file that
ever did.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time

_CHUNK = 1 << 20
PRUNE_EVERY_S = 24 * 3600


def cache_dir() -> str:
    """`MARIN_CACHE_DIR`, else `$XDG_CACHE_HOME/marin-dagster` (`~/.cache/marin-dagster`)."""
    if os.environ.get("MARIN_CACHE_DIR"):
        return os.environ["MARIN_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "marin-dagster")


def _entry_path(path: str) -> str:
    key = hashlib.sha256(os.path.abspath(path).encode("utf-8", "surrogateescape")).hexdigest()
    return os.path.join(cache_dir(), "digests", key[:2], key[2:] + ".json")


def _stamp(st: os.stat_result) -> list[int]:
    # ctime too: a write that restores size and mtime (`touch -r`) still moves it
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def file_sha256(path: str) -> str:
    """The hex sha256 of `path`'s bytes, from the cache when the file's stat is unchanged."""
    entry = _entry_path(path)
    stamp = _stamp(os.stat(path))
    try:
        with open(entry) as f:
            cached = json.load(f)
        if cached.get("stamp") == stamp:
            return cached["sha256"]
    except (OSError, ValueError, AttributeError, KeyError):
        pass  # no entry, or one from an interrupted or older writer: hash again
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    digest = h.hexdigest()
    if _stamp(os.stat(path)) == stamp:  # not while it was being written to
        try:
            prune()
            os.makedirs(os.path.dirname(entry), exist_ok=True)
            tmp = f"{entry}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump({"path": os.path.abspath(path), "stamp": stamp, "sha256": digest}, f)
            os.replace(tmp, entry)
        except OSError:
            pass  # a read-only home: correct, only slower
    return digest


def prune(every_s: float = PRUNE_EVERY_S) -> int:
    """Remove the entries of files that are gone, at most once per `every_s` (a marker
    file's age says when it last ran, across processes); returns how many went."""
    root = os.path.join(cache_dir(), "digests")
    marker = os.path.join(root, ".pruned")
    now = time.time()
    try:
        if now - os.stat(marker).st_mtime < every_s:
            return 0
    except FileNotFoundError:
        pass
    try:
        os.makedirs(root, exist_ok=True)
        with open(marker, "w"):
            pass  # claimed first: concurrent processes find it fresh and do not prune too
    except OSError:
        return 0
    removed = 0
    for folder in os.scandir(root):
        if not folder.is_dir():
            continue
        for item in os.scandir(folder.path):
            if item.name.endswith(".tmp"):
                # a killed writer's; a live one renames its file within microseconds
                try:
                    gone = now - item.stat().st_mtime > 3600
                except FileNotFoundError:
                    continue
            else:
                try:
                    with open(item.path) as f:
                        gone = not os.path.exists(json.load(f)["path"])
                except (OSError, ValueError, KeyError, TypeError):
                    gone = True  # unreadable: a lookup would hash the file again anyway
            if gone:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(item.path)
                    removed += 1
    return removed
