"""Step subprocesses in their own process groups, so a step and all it spawned stop together."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

PREEMPTION_SIGNALS = (signal.SIGTERM,)
# The pid of the process that started a step worker (the run's process, which runs the
# executor); the worker leaves with its whole group when that process is gone.
RUN_PID_ENV = "MARIN_IRIS_RUN_PID"


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


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] == "Z"  # dead, not yet reaped
    except (OSError, IndexError):
        return False


def die_with_run_process(run_pid: int, poll_seconds: float = 0.5) -> threading.Thread:
    """Kill this process's group as soon as `run_pid`, the run's process, is gone.

    A step worker runs in its own session, so `kill -9` of the run's process group (or the OOM
    killer taking the run's process) does not reach it: it would finish its step and write
    SUCCESS for a run that stays STARTED forever. The run's process is normally the parent,
    and a dead parent's children are reparented at once, so a changed `getppid()` tells;
    the pid itself is watched too, for an interpreter wrapper that forks between the two.
    PR_SET_PDEATHSIG would not do: it reaches this process only, not the Zephyr workers it
    started, and it fires when the parent *thread* that spawned us exits.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent and not _gone(run_pid):
            time.sleep(poll_seconds)
        sys.stderr.write(
            f"marin iris: the run's process (pid {run_pid}) is gone; stopping step worker "
            f"{os.getpid()} and its process group\n"
        )
        sys.stderr.flush()
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpgrp(), signal.SIGKILL)
        # Not a group leader (started by hand, not by Iris): the group is not ours to kill.
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="marin-iris-run-watch", daemon=True)
    thread.start()
    return thread
