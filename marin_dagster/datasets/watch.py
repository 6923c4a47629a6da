"""Watching a local folder for content changes (no Dagster here).

`FolderState` keeps a stat cache of a folder (path -> size, mtime, content
digest), so a scan hashes only files whose (size, mtime) changed. A watchdog
observer records which paths changed, so between full scans a snapshot looks
only at those; a full scan (polling) runs on the first snapshot in a process,
every `full_scan_s`, and whenever the observer is not running, so a change
made while nothing watched is found by the first snapshot after.

`content_hash` of a folder's files is what `assets/watched.py` uses as the
watched folder's data version, and what `assets/sensors.py` compares between
ticks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from marin_dagster import fs

logger = logging.getLogger(__name__)

_IGNORED_EVENTS = frozenset({"opened", "closed_no_write"})


def ignored(rel: str) -> bool:
    """Editors' swap and backup files, dotfiles and interrupted atomic writes: not content.

    One rule for the watcher and for `folder_corpus`, so that a file the sensor does not
    see is not read into the corpus either."""
    return any(
        part.startswith(".") or part.endswith("~") for part in rel.split("/")
    ) or fs.is_temp_name(rel)


def file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def content_hash(digests: dict[str, str]) -> str:
    """The folder's data version: a hash of every (relative path, file digest), sorted."""
    h = hashlib.sha256()
    for rel in sorted(digests):
        h.update(f"{rel}\0{digests[rel]}\n".encode())
    return h.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class FolderSnapshot:
    path: str
    content_hash: str
    files: int
    bytes: int
    last_change: float
    """Newest mtime of a file or folder, or the newest watchdog event (epoch seconds)."""
    hashed: int
    """Files read and hashed by this snapshot (stat-cache misses)."""
    statted: int
    full_scan: bool
    digests: dict[str, str] = dataclasses.field(repr=False)
    """Each file's (relative path) content digest: what `content_hash` hashes."""


class FolderState:
    """The stat cache of one folder, fed by a full scan or by watchdog's changed paths."""

    def __init__(self, path: str, *, watch: bool = True, full_scan_s: float = 300.0) -> None:
        self.path = os.path.abspath(path)
        self.full_scan_s = full_scan_s
        self._files: dict[str, tuple[int, int, str]] = {}
        self._dirs: dict[str, int] = {}
        self._dirty: dict[str, bool] = {}
        self._last_event = 0.0
        self._last_full: float | None = None
        self._lock = threading.Lock()
        self._events = threading.Lock()
        self._observer: Any = None
        if watch:
            self._start_observer()

    # -- watchdog -------------------------------------------------------------
    def _start_observer(self) -> None:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        state = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                if event.event_type in _IGNORED_EVENTS:
                    return
                # A folder created or moved in is scanned whole (its files may predate
                # the watch); a folder's own "modified" only means an entry changed.
                tree = event.is_directory and event.event_type in ("created", "moved")
                with state._events:
                    src = os.fsdecode(event.src_path)
                    state._dirty[src] = state._dirty.get(src, False) or (
                        tree and event.event_type == "created"
                    )
                    if getattr(event, "dest_path", ""):
                        dest = os.fsdecode(event.dest_path)
                        state._dirty[dest] = state._dirty.get(dest, False) or tree
                    state._last_event = time.time()

        try:
            os.makedirs(self.path, exist_ok=True)
            observer = Observer()
            observer.schedule(Handler(), self.path, recursive=True)
            observer.daemon = True
            observer.start()
        except OSError as e:  # e.g. the inotify watch limit: polling still finds every change
            logger.warning(f"watchdog cannot watch {self.path} ({e}); falling back to polling")
            return
        self._observer = observer

    @property
    def watching(self) -> bool:
        return self._observer is not None and self._observer.is_alive()

    def close(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None

    # -- scans ----------------------------------------------------------------
    def _rel(self, path: str) -> str:
        return os.path.relpath(path, self.path).replace(os.sep, "/")

    def _walk(self, top: str) -> Iterator[tuple[str, os.stat_result, bool]]:
        stack = [top]
        while stack:
            folder = stack.pop()
            try:
                with os.scandir(folder) as entries:
                    for entry in entries:
                        try:
                            is_dir = entry.is_dir(follow_symlinks=False)
                            yield entry.path, entry.stat(), is_dir
                        except FileNotFoundError:  # deleted while scanning; the next tick sees it
                            continue
                        if is_dir:
                            stack.append(entry.path)
            except (FileNotFoundError, NotADirectoryError):
                continue

    def _update_file(self, rel: str, path: str, st: os.stat_result, counts: list[int]) -> None:
        counts[1] += 1
        cached = self._files.get(rel)
        if cached is not None and cached[0] == st.st_size and cached[1] == st.st_mtime_ns:
            return
        try:
            digest = file_digest(path)
        except FileNotFoundError:
            self._files.pop(rel, None)
            return
        counts[0] += 1
        self._files[rel] = (st.st_size, st.st_mtime_ns, digest)

    def _scan_tree(self, top: str, counts: list[int]) -> None:
        """Bring the cache in line with the subtree at `top` (the whole folder or a changed one)."""
        top_rel = "" if top == self.path else self._rel(top)
        under = top_rel + "/" if top_rel else ""
        seen_files, seen_dirs = set(), set()
        if top_rel:
            try:
                self._dirs[top_rel] = os.stat(top).st_mtime_ns
                seen_dirs.add(top_rel)
            except FileNotFoundError:
                pass
        for path, st, is_dir in self._walk(top):
            rel = self._rel(path)
            if ignored(rel):
                continue
            if is_dir:
                self._dirs[rel] = st.st_mtime_ns
                seen_dirs.add(rel)
            else:
                self._update_file(rel, path, st, counts)
                seen_files.add(rel)
        for rel in [r for r in self._files if r.startswith(under) and r not in seen_files]:
            del self._files[rel]
        for rel in [
            r for r in self._dirs if (r == top_rel or r.startswith(under)) and r not in seen_dirs
        ]:
            del self._dirs[rel]

    def _scan_path(self, path: str, tree: bool, counts: list[int]) -> None:
        if path != self.path and not path.startswith(self.path + os.sep):
            return
        rel = self._rel(path) if path != self.path else ""
        if rel and ignored(rel):
            return
        try:
            st = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            for r in [r for r in self._files if r == rel or r.startswith(rel + "/")]:
                del self._files[r]
            for r in [r for r in self._dirs if r == rel or r.startswith(rel + "/")]:
                del self._dirs[r]
            return
        if not os.path.isdir(path):
            self._update_file(rel, path, st, counts)
        elif tree:
            self._scan_tree(path, counts)
        elif rel:
            self._dirs[rel] = st.st_mtime_ns

    def snapshot(self) -> FolderSnapshot:
        """The folder's content hash now; hashes only files whose (size, mtime) changed."""
        with self._lock:
            now = time.monotonic()
            full = (
                self._last_full is None
                or not self.watching
                or now - self._last_full >= self.full_scan_s
            )
            with self._events:
                dirty, self._dirty = self._dirty, {}
            counts = [0, 0]
            if full:
                self._scan_tree(self.path, counts)
                self._last_full = now
            else:
                for path in sorted(dirty):
                    self._scan_path(path, dirty[path], counts)
            newest = max([v[1] for v in self._files.values()] + list(self._dirs.values()) + [0])
            try:
                newest = max(newest, os.stat(self.path).st_mtime_ns)
            except FileNotFoundError:
                pass
            digests = {rel: v[2] for rel, v in self._files.items()}
            return FolderSnapshot(
                path=self.path,
                content_hash=content_hash(digests),
                files=len(self._files),
                bytes=sum(v[0] for v in self._files.values()),
                last_change=max(newest / 1e9, self._last_event),
                hashed=counts[0],
                statted=counts[1],
                full_scan=full,
                digests=digests,
            )

    def digests(self) -> dict[str, str]:
        with self._lock:
            return {rel: v[2] for rel, v in self._files.items()}


# One state per folder and code-server process: the stat cache and observer live between ticks.
_STATES: dict[tuple[str, bool], FolderState] = {}
_STATES_LOCK = threading.Lock()


def folder_state(path: str, *, watch: bool = True, full_scan_s: float = 300.0) -> FolderState:
    key = (os.path.abspath(path), watch)
    with _STATES_LOCK:
        state = _STATES.get(key)
        if state is None:
            state = _STATES[key] = FolderState(path, watch=watch, full_scan_s=full_scan_s)
        return state


def forget_folder_states() -> None:
    """Drop every stat cache and observer, as a code-server restart does."""
    with _STATES_LOCK:
        for state in _STATES.values():
            state.close()
        _STATES.clear()
