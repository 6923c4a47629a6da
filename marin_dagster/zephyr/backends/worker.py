"""The local worker process: `python -m marin_dagster.zephyr.backends.worker FD DRIVER_PID`.

A fresh interpreter (like multiprocessing's spawn, but without re-importing
the driver's __main__, so a pipeline run from an unguarded script cannot
recurse). It reads task bytes from the socket FD and answers with result
bytes until the driver closes the socket.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator

from marin_dagster.zephyr.backends.base import load_task, run_loaded_task


def _set_affinity(cores: set[int]) -> None:
    # sched_setaffinity(0) pins the calling thread only: pin every thread of the process
    # (Arrow's and BLAS's pools included); threads started later inherit it.
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cores)


@contextlib.contextmanager
def pinned(cores: tuple[int, ...] | None, all_cores: set[int]) -> Iterator[None]:
    """Run on `cores` only (the task's CPU request), then on every core again."""
    if not cores or not hasattr(os, "sched_setaffinity"):
        yield
        return
    import pyarrow as pa

    threads = pa.cpu_count()
    _set_affinity(set(cores))
    pa.set_cpu_count(len(cores))
    try:
        yield
    finally:
        _set_affinity(all_cores)
        pa.set_cpu_count(threads)


def serve(conn: multiprocessing.connection.Connection) -> None:
    all_cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            return
        task = load_task(payload)
        if isinstance(task, bytes):
            answer = task  # why the task could not be loaded
        else:
            with pinned(task.cpu_set, all_cores):
                answer = run_loaded_task(task)
        try:
            conn.send_bytes(answer)
        except OSError:
            # The driver stopped listening (another shard failed, the run was cancelled):
            # nobody wants this answer, and a traceback here would bury the real error.
            return


DRIVER_POLL_S = 0.5


def _die_with_driver(driver: int) -> None:
    """Exit as soon as the driver process is gone.

    A driver killed outright (kill -9, the OOM killer) closes its end of the socket, but a
    worker reads it only between tasks: until then it went on with a task nobody would
    collect, holding its core and memory, minutes for a large shard. Once the driver is
    gone the worker is some other process's child (init's, a subreaper's).
    """

    def watch() -> None:
        while os.getppid() == driver:
            time.sleep(DRIVER_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="zephyr-driver-watch", daemon=True).start()


def main() -> None:
    # Ctrl-C goes to the driver, which stops the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if len(sys.argv) > 2:
        _die_with_driver(int(sys.argv[2]))
    sock = socket.socket(fileno=int(sys.argv[1]))
    conn = multiprocessing.connection.Connection(sock.detach())
    serve(conn)
    # Every task is answered and every output closed: skip the interpreter's teardown
    # (unloading Arrow, JAX), which costs the driver's shutdown ~0.1 s per worker.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
