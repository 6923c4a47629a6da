"""Whether a process recorded by pid (a lease holder, a run's driver) still runs (Linux /proc)."""

from __future__ import annotations

import os


def process_start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot, /proc/PID/stat), or None where unknown.

    Together with the pid it names one process: a pid alone may have been reused since.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name, in parentheses, may itself hold spaces and parentheses.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def process_gone(pid: int, started: int | None = None) -> bool:
    """Whether `pid` (started at `started`, where known) has exited: gone, a zombie, or its
    pid now another process's."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # someone else's process: alive, though not necessarily ours (checked below)
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                return True  # killed, not yet reaped by its parent
    except (OSError, IndexError):
        pass
    now = process_start_time(pid)
    return started is not None and now is not None and now != started
