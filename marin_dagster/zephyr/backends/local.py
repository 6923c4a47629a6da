"""Local worker processes: the default backend.

Each worker is a long-lived process (spawned: no inherited threads or locks)
that runs one task at a time, so a shared object is loaded once per worker.
The driver watches each worker's pipe and its process sentinel: a worker that
dies (SIGKILL, the OOM killer) is noticed at once, replaced, and its task
alone is reported lost, to be rerun.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
from dataclasses import dataclass
from typing import Any

from marin_dagster.zephyr.backends.base import WorkerLost, dumps_task, loads_result, run_task_bytes
from marin_dagster.zephyr.runtime import Task, TaskResult

logger = logging.getLogger(__name__)


def _worker_main(conn: multiprocessing.connection.Connection) -> None:
    # Ctrl-C goes to the driver, which stops the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            return
        conn.send_bytes(run_task_bytes(payload))


@dataclass
class _Worker:
    process: Any
    conn: multiprocessing.connection.Connection
    key: Any = None


class LocalBackend:
    def __init__(self, max_workers: int, mp_context: str = "spawn"):
        self.capacity = max(1, max_workers)
        self._ctx = multiprocessing.get_context(mp_context)
        self._workers: list[_Worker] = []
        self.workers_started = 0

    def _start_worker(self) -> _Worker:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=_worker_main, args=(child,), name="zephyr-worker",
                                 daemon=False)
        proc.start()
        child.close()
        worker = _Worker(proc, parent)
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
        worker.conn.send_bytes(dumps_task(task))

    def _lost(self, worker: _Worker) -> tuple[Any, WorkerLost]:
        worker.process.join(1)
        code = worker.process.exitcode
        with contextlib.suppress(Exception):
            worker.conn.close()
        self._workers.remove(worker)
        reason = (f"worker process {worker.process.pid} died with signal {-code}"
                  if code is not None and code < 0 else
                  f"worker process {worker.process.pid} exited with code {code}")
        logger.warning("%s; its shard will be rerun in a new worker", reason)
        return worker.key, WorkerLost(reason)

    def poll(self, timeout: float) -> list[tuple[Any, TaskResult | WorkerLost]]:
        busy = [w for w in self._workers if w.key is not None]
        if not busy:
            return []
        waitables: list[Any] = [w.conn for w in busy] + [w.process.sentinel for w in busy]
        ready = set(multiprocessing.connection.wait(waitables, timeout))
        out: list[tuple[Any, TaskResult | WorkerLost]] = []
        for w in busy:
            if w.conn in ready:
                try:
                    payload = w.conn.recv_bytes()
                except (EOFError, OSError):
                    out.append(self._lost(w))
                    continue
                out.append((w.key, loads_result(payload)))
                w.key = None
            elif w.process.sentinel in ready:
                out.append(self._lost(w))
        return out

    def shutdown(self) -> None:
        for w in self._workers:
            with contextlib.suppress(Exception):
                w.conn.close()
        for w in self._workers:
            w.process.join(5)
            if w.process.is_alive():
                w.process.kill()
                w.process.join(5)
        self._workers = []

    def __del__(self) -> None:
        if self._workers and os is not None:
            with contextlib.suppress(Exception):
                self.shutdown()
