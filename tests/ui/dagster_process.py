"""Start `dagster dev` / `dagster-daemon run` the way a person would, and stop them cleanly.

Each process gets its own session (so its webserver, daemon and code servers
form one process group), stdin from /dev/null, and a log file; stopping sends
SIGTERM to the group, then SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence

from tests.conftest import subprocess_env


@contextlib.contextmanager
def dagster_process(
    args: Sequence[str], log_path: str, cwd: str, **env: str
) -> Iterator[subprocess.Popen]:
    with open(log_path, "wb") as log, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(
            list(args),
            cwd=cwd,
            env=subprocess_env(**env),
            stdin=devnull,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        stop_group(proc)


def stop_group(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.time() + grace_s
    while proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def log_tail(log_path: str, n: int = 4000) -> str:
    with open(log_path, "rb") as f:
        return f.read().decode(errors="replace")[-n:]
