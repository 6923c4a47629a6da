"""Zephyr's scratch folders (shuffle spills, materialized shards, shared-object pickles).

Each ZephyrContext makes a `zephyr-*` folder under the temporary folder and removes it at
shutdown. A driver killed outright (kill -9, the OOM killer, Iris stopping a step whose
run died) removes nothing, and its folder can hold several times the dataset it was
shuffling, left there until the machine reboots. So each folder holds an exclusive
`flock` on its owner file for as long as its context lives: the kernel drops the lock when
the process dies, however it dies, and the next context removes the folders whose lock it
can take. A lock, not a pid: pids are reused, and a process in another pid namespace that
shares /tmp (a container) is invisible to a pid check but holds its lock all the same.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile

PREFIX = "zephyr-"
OWNER = ".owner.lock"


def claim(parent: str | None = None) -> tuple[str, int]:
    """A new scratch folder under `parent` (the temporary folder), and the descriptor whose
    lock marks it as in use: close it after removing the folder."""
    root = tempfile.mkdtemp(prefix=PREFIX, dir=parent)
    pending = os.path.join(root, OWNER + ".new")
    fd = os.open(pending, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    # Locked before it takes the name another context looks for, so no context ever sees
    # an owner file that is not locked yet.
    os.rename(pending, os.path.join(root, OWNER))
    return root, fd


def remove_abandoned(parent: str | None = None) -> list[str]:
    """Remove the scratch folders under `parent` whose context's process is gone; returns them.

    A folder without an owner file (being made, or made by an older version) is left alone.
    """
    parent = parent or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(PREFIX):
            continue
        folder = os.path.join(parent, name)
        try:
            fd = os.open(os.path.join(folder, OWNER), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its context is alive
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        finally:
            os.close(fd)
    return removed


def release(root: str, fd: int | None) -> None:
    """Remove a folder from `claim`, then give up its lock."""
    shutil.rmtree(root, ignore_errors=True)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
