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


# What a multi-process step's processes are told (read by marin_dagster.levanter.distributed).
COORDINATOR_ENV = "MARIN_COORDINATOR_ADDRESS"
NUM_PROCESSES_ENV = "MARIN_NUM_PROCESSES"
PROCESS_ID_ENV = "MARIN_PROCESS_ID"


def free_port() -> int:
    """A TCP port free on this host now (for process 0's coordination service)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gang_env(num_processes: int, process_id: int, coordinator_address: str) -> dict[str, str]:
    return {
        COORDINATOR_ENV: coordinator_address,
        NUM_PROCESSES_ENV: str(num_processes),
        PROCESS_ID_ENV: str(process_id),
    }


class ProcessGang:
    """The processes of one step, one per host (a single one for most steps), each in its own
    process group: they live and die together.

    Process 0 is the leader (the step itself, which reports to Dagster). The gang has ended when
    the leader exits (the others are stopped: whatever they still do is the leader's to
    decide), or when any other process dies with a non-zero code or a signal (a lost host, a
    preemption): the rest are killed at once, since a collective would wait for the dead one
    forever, and the gang's exit code is the dead process's. A follower that exits 0 has
    finished its part; the gang waits for the leader.
    """

    def __init__(self, procs: Sequence[subprocess.Popen]) -> None:
        self.procs = list(procs)
        self.returncode: int | None = None
        self.failed_process: int | None = None
        # (process index, exit code) in the order the processes ended: when a host dies, the
        # others fail in their collectives a moment later, and the first death is the cause.
        self._ended: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        if len(self.procs) > 1:
            for i, p in enumerate(self.procs):
                threading.Thread(
                    target=self._watch, args=(i, p), name=f"marin-iris-gang-{p.pid}", daemon=True
                ).start()

    def _watch(self, index: int, proc: subprocess.Popen) -> None:
        rc = proc.wait()
        with self._lock:
            self._ended.append((index, rc))

    @classmethod
    def start(
        cls, commands: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]]
    ) -> ProcessGang:
        procs: list[subprocess.Popen] = []
        try:
            for command, env in zip(commands, envs, strict=True):
                procs.append(start_process_group(command, env))
        except OSError:
            for p in procs:
                signal_group(p, signal.SIGKILL)
                p.wait()
            raise
        return cls(procs)

    @property
    def pid(self) -> int:
        return self.procs[0].pid

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def poll(self) -> int | None:
        """None while the gang runs; then its exit code (the leader's, or the first casualty's)."""
        if self.returncode is not None:
            return self.returncode
        if len(self.procs) == 1:
            rc = self.procs[0].poll()
            if rc is not None:
                self.returncode, self.failed_process = rc, (0 if rc else None)
        else:
            with self._lock:
                ended = list(self._ended)
            for i, rc in ended:  # the first to end with a failure, or the leader
                if rc != 0 or i == 0:
                    self.returncode, self.failed_process = rc, (i if rc else None)
                    break
        if self.returncode is not None:
            self.reap()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (rc := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired([str(p) for p in self.pids], timeout or 0)
            time.sleep(0.05)
        return rc

    def reap(self) -> None:
        """Kill every process group of the gang (what an ended leader left behind included)."""
        for p in self.procs:
            signal_group(p, signal.SIGKILL)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def stop(self, grace_seconds: float) -> int | None:
        """Stop the gang: the leader as `stop_process_group` does (Dagster records the
        interrupt), the others killed after it."""
        rc = stop_process_group(self.procs[0], grace_seconds)
        self.reap()
        if self.returncode is None:
            self.returncode = rc
        return rc
