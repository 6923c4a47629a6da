"""Local worker processes: the default backend.

Each worker is a long-lived, freshly started Python process (no inherited
threads or locks; the driver's __main__ is not re-imported) that runs one
task at a time, so a shared object is loaded once per worker. The driver
holds one end of a socket pair per worker: a worker that dies (SIGKILL, the
OOM killer) closes its end, the driver sees EOF at once, replaces the worker
and reports that one task lost, to be rerun.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.connection
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from marin_dagster.zephyr.backends.base import WorkerLost, dumps_task, loads_result
from marin_dagster.zephyr.runtime import Task, TaskResult

logger = logging.getLogger(__name__)


def _worker_env(workers: int) -> dict[str, str]:
    env = dict(os.environ)
    # The driver's import path, so modules that functions were pickled by reference
    # from (experiment files, tests) import in the worker too.
    paths = [p if p else os.getcwd() for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    # Arrow's (and BLAS's) thread pool is as large as the machine in every worker: with
    # as many workers as cores, each worker's pool threads only contend with the others.
    # A share of the cores each, unless the user chose a size.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    return env


@dataclass
class _Worker:
    process: subprocess.Popen
    conn: multiprocessing.connection.Connection
    key: Any = None


class LocalBackend:
    def __init__(self, max_workers: int):
        self.capacity = max(1, max_workers)
        self._workers: list[_Worker] = []
        self.workers_started = 0

    def _start_worker(self) -> _Worker:
        parent, child = socket.socketpair()
        proc = subprocess.Popen(
            [sys.executable, "-m", "marin_dagster.zephyr.backends.worker", str(child.fileno())],
            pass_fds=(child.fileno(),),
            env=_worker_env(self.capacity),
            stdin=subprocess.DEVNULL,
        )
        child.close()
        worker = _Worker(proc, multiprocessing.connection.Connection(parent.detach()))
        self._workers.append(worker)
        self.workers_started += 1
        return worker

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def submit(self, key: Any, task: Task, resources: dict[str, Any]) -> None:
        worker = next((w for w in self._workers if w.key is None), None)
        if worker is None:
            worker = self._start_worker()
        worker.key = key
        try:
            worker.conn.send_bytes(dumps_task(task))
        except OSError:
            pass  # a dead worker; poll() sees the closed socket and reports the task lost

    def _lost(self, worker: _Worker) -> tuple[Any, WorkerLost]:
        with contextlib.suppress(Exception):
            worker.conn.close()
        try:
            code = worker.process.wait(5)
        except subprocess.TimeoutExpired:
            worker.process.kill()
            code = worker.process.wait()
        self._workers.remove(worker)
        reason = (
            f"worker process {worker.process.pid} died with signal {-code}"
            if code < 0
            else f"worker process {worker.process.pid} exited with code {code}"
        )
        logger.warning("%s; its shard will be rerun in a new worker", reason)
        return worker.key, WorkerLost(reason)

    def poll(self, timeout: float) -> list[tuple[Any, TaskResult | WorkerLost]]:
        busy = [w for w in self._workers if w.key is not None]
        if not busy:
            return []
        ready = set(multiprocessing.connection.wait([w.conn for w in busy], timeout))
        out: list[tuple[Any, TaskResult | WorkerLost]] = []
        for w in busy:
            if w.conn not in ready:
                continue
            try:
                payload = w.conn.recv_bytes()
            except (EOFError, OSError):
                out.append(self._lost(w))
                continue
            out.append((w.key, loads_result(payload)))
            w.key = None
        return out

    def shutdown(self) -> None:
        for w in self._workers:
            with contextlib.suppress(Exception):
                w.conn.close()  # the worker exits on EOF
        for w in self._workers:
            try:
                w.process.wait(5)
            except subprocess.TimeoutExpired:
                w.process.kill()
                w.process.wait(5)
        self._workers = []

    def __del__(self) -> None:
        if getattr(self, "_workers", None):
            with contextlib.suppress(Exception):
                self.shutdown()
