"""Storage helpers shared by every engine: fsspec paths and atomic writes.

No Dagster here: Zephyr workers, training processes and k8s pods import it.

Atomicity: on a local disk a file is written beside its target under a
temporary name and renamed into place. Object stores (gs://, memory://)
have no rename, but an object only appears once its upload completes, so
the bytes are spooled to a local temporary file and uploaded in one call.
Either way a reader never sees a half-written file under the final name.

Local paths bypass fsspec (imported on the first remote URL): a Zephyr worker
that reads and writes the local disk starts without it, a fifth of its start-up.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import tempfile
import uuid
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import fsspec

_TEMP_MARK = ".tmp-"

# Errors that only a write raises. The OS reports them when a buffered file is flushed or
# closed, where Python has no file name to give: "[Errno 28] No space left on device" alone
# would leave the user to guess which disk filled up.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


def _name_target(e: OSError, path: str) -> None:
    if e.filename is None and e.errno in WRITE_ERRNOS:
        e.filename = path


def local_path(path: str) -> str | None:
    """The OS path that a local path or file:// (local://) URL names; None for any other URL."""
    if "::" in path:  # fsspec's chained URLs (simplecache::gs://...)
        return None
    if "://" not in path:
        return os.path.expanduser(path)
    for prefix in ("file://", "local://"):
        if path.startswith(prefix):
            return path[len(prefix) :]
    return None


def url_to_fs(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem for `path` and the path as that filesystem names it.

    Listings are never cached: status files, leases and outputs are rewritten by other
    processes, and gcsfs would answer `exists`, `info` and reads (their size) from a stale
    listing of the folder.
    """
    import fsspec

    try:
        fs, fs_path = fsspec.core.url_to_fs(path, use_listings_cache=False)
    except ImportError as e:
        if path.startswith(("gs://", "gcs://")):
            raise ImportError(
                f"{path}: gs:// storage needs gcsfs; install it with "
                "pip install 'marin-dagster[gcs]'"
            ) from e
        raise
    return fs, fs_path


def is_local(path: str) -> bool:
    return local_path(path) is not None


def join(base: str, *parts: str) -> str:
    out = base.rstrip("/")
    for part in parts:
        if part:
            out = f"{out}/{part.strip('/')}"
    return out


def normalize(path: str) -> str:
    """Absolute local paths (so subprocesses and orbax agree); URLs unchanged."""
    if "://" in path:
        return path.rstrip("/")
    return os.path.abspath(os.path.expanduser(path))


def basename(path: str) -> str:
    """The last part of a local path or URL (`gs://b/data/x-1234/` -> `x-1234`)."""
    return normalize(path).rstrip("/").rsplit("/", 1)[-1]


def is_temp_name(path: str) -> bool:
    """True for the leftovers of an interrupted atomic write."""
    return _TEMP_MARK in os.path.basename(path)


_ATOMIC_TEMP = re.compile(r"(.+)\.tmp-[0-9a-f]{8}")


def atomic_temp_target(name: str) -> str | None:
    """The file name that `atomic_path`'s temporary file `name` was to become, else None."""
    m = _ATOMIC_TEMP.fullmatch(name)
    return m.group(1) if m else None


def exists(path: str) -> bool:
    local = local_path(path)
    if local is not None:
        return os.path.exists(local)
    fs, p = url_to_fs(path)
    return fs.exists(p)


def open_read(path: str) -> IO[bytes]:
    """A binary file object reading `path` (local, or any fsspec URL)."""
    local = local_path(path)
    if local is not None:
        return open(local, "rb")
    fs, p = url_to_fs(path)
    return fs.open(p, "rb")


def makedirs(path: str) -> None:
    fs, p = url_to_fs(path)
    fs.makedirs(p, exist_ok=True)


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A local file to write `path` through (for writers that need a file name, such
    as Parquet's): `path` appears only when the block ends without an error.

    For a local target the file lies beside it, so nothing is copied: it is synced
    and renamed into place. For a URL it is a local temporary file, uploaded at the
    end. Either way it is removed on failure."""
    local = local_path(path)
    if local is not None:
        directory = os.path.dirname(local) or "."
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(
            directory, f"{os.path.basename(local)}{_TEMP_MARK}{uuid.uuid4().hex[:8]}"
        )
        try:
            yield tmp
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, local)
        except BaseException as e:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
            if isinstance(e, OSError):
                _name_target(e, local)
            raise
        return
    fs, fs_path = url_to_fs(path)
    fd, tmp = tempfile.mkstemp(suffix=_TEMP_MARK.rstrip("-"))
    os.close(fd)
    try:
        yield tmp
        parent = fs_path.rsplit("/", 1)[0]
        if parent:
            fs.makedirs(parent, exist_ok=True)
        fs.put_file(tmp, fs_path)
    except OSError as e:
        # the spool file under the local temporary folder is what could not be written
        _name_target(e, tmp)
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "wb") -> Iterator[IO[Any]]:
    """Open `path` for writing; it appears under its name only on success."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_write supports modes 'wb' and 'w', not {mode!r}")
    with (
        atomic_path(path) as tmp,
        open(tmp, mode, **({"encoding": "utf-8"} if mode == "w" else {})) as f,
    ):
        yield f


def write_bytes(path: str, data: bytes) -> None:
    with atomic_write(path, "wb") as f:
        f.write(data)


def write_text(path: str, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_bytes(path: str) -> bytes:
    # One whole-object GET: open() + read() on gcsfs asks for the size first and
    # then a byte range, which tears when the object is replaced in between.
    fs, p = url_to_fs(path)
    return fs.cat_file(p)


def read_json(path: str) -> Any:
    return json.loads(read_bytes(path).decode("utf-8"))


def read_json_or_none(path: str) -> Any | None:
    try:
        return read_json(path)
    except FileNotFoundError:
        return None


def remove(path: str, recursive: bool = False) -> None:
    fs, p = url_to_fs(path)
    with contextlib.suppress(FileNotFoundError):
        fs.rm(p, recursive=recursive)


def file_checksum(path: str) -> str:
    """sha256 of a file's bytes, streamed."""
    fs, p = url_to_fs(path)
    h = hashlib.sha256()
    with fs.open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def unreachable(error: BaseException) -> bool:
    """Whether `error` is storage that could not be reached (its server or emulator down, no
    network), not a problem with a file: the fix is the connection, not the data."""
    if isinstance(error, ConnectionError | TimeoutError):
        return True
    try:
        import aiohttp
    except ImportError:  # pragma: no cover - gcsfs brings it
        return False
    return isinstance(error, aiohttp.ClientConnectionError)
