"""Step subprocesses in their own process groups, so a step and all it spawned stop together."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

PREEMPTION_SIGNALS = (signal.SIGTERM,)


def start_process_group(command: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen:
    # A new session: signals to the group reach the step's own children (Zephyr workers, ...).
    return subprocess.Popen(list(command), env=dict(env), start_new_session=True)


def was_preempted(returncode: int | None) -> bool:
    """Killed by SIGTERM (a scheduler's "please leave"), as a signal or as a shell's 128+15."""
    if returncode is None:
        return False
    return any(returncode in (-sig, 128 + sig) for sig in PREEMPTION_SIGNALS)


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_process_group(proc: subprocess.Popen, grace_seconds: float) -> int | None:
    """SIGINT (Dagster records the interrupt), then SIGKILL the whole group after the grace."""
    if proc.poll() is None:
        signal_group(proc, signal.SIGINT)
        deadline = time.monotonic() + grace_seconds
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    # The leader may be gone while its children live on in the group.
    signal_group(proc, signal.SIGKILL)
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return None


def reap_group(proc: subprocess.Popen) -> None:
    """After the leader exited on its own: kill what it left behind in its group."""
    signal_group(proc, signal.SIGKILL)


def exit_as_preempted() -> None:
    """End this process the way a preempted one ends (killed by SIGTERM), so Iris retries it.

    For a step that installs its own SIGTERM handler (to save a checkpoint first): finish the
    handler with this instead of `sys.exit`, which Dagster would record as the step's failure.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    # The signal is delivered before os.kill returns on Linux; this is not reached.
    time.sleep(60)
