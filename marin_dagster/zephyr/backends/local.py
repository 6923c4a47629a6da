"""Local worker processes: the default backend.

Each worker is a long-lived, freshly started Python process (no inherited
threads or locks; the driver's __main__ is not re-imported) that runs one
task at a time, so a shared object is loaded once per worker. The driver
holds one end of a socket pair per worker: a worker that dies (SIGKILL, the
OOM killer) closes its end, the driver sees EOF at once, replaces the worker
and reports that one task lost, to be rerun. A driver that dies (kill -9 included)
takes its workers with it: each watches its parent and exits, mid-task too.

Resources: a task that asks for CPUs runs pinned to that many cores (the
driver hands out cores so concurrent tasks do not share them); a task that asks
for memory is watched by a driver thread that reads its worker's resident size
from /proc and kills the worker when it goes over. The driver's thread is not
held up by the worker's GIL, so a task stuck in one large C call is caught too.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from marin_dagster.zephyr.backends.base import (
    WorkerLost,
    dumps_task,
    loads_result,
    share_as_file,
)
from marin_dagster.zephyr.resources import TaskResources, format_bytes
from marin_dagster.zephyr.runtime import Task, TaskResult

logger = logging.getLogger(__name__)

MEMORY_POLL_S = 0.02
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _worker_env(workers: int, tmpdir: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if tmpdir is not None:
        # The task's temporary files (a gs:// write's local spool, a token shard's) in the
        # context's scratch folder: a worker killed with its driver cannot remove them, and
        # the scratch folder is removed even then (zephyr/scratch.py).
        env["TMPDIR"] = tmpdir
    # The driver's import path, so modules that functions were pickled by reference
    # from (experiment files, tests) import in the worker too.
    paths = [p if p else os.getcwd() for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    # Arrow's (and BLAS's) thread pool is as large as the machine in every worker: with
    # as many workers as cores, each worker's pool threads only contend with the others.
    # A share of the cores each, unless the user chose a size.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    # Workers share the machine's GPU (dupekit signs on it): JAX's default grabs 75% of
    # its memory in the first process that touches it and leaves the others none.
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return env


def resident_bytes(pid: int) -> int | None:
    """A process's resident set size, or None when it is gone (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class _Worker:
    process: subprocess.Popen
    conn: multiprocessing.connection.Connection
    key: Any = None
    cores: tuple[int, ...] = ()
    memory_limit: int | None = None
    over_memory: str | None = None  # why the memory watch killed it, for the task it ran
    stage_name: str = ""
    shard: int = 0


@dataclass
class _MemoryWatch:
    """A driver thread that kills workers over their task's memory limit."""

    backend: LocalBackend
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="zephyr-memory", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(MEMORY_POLL_S):
            for w in list(self.backend._workers):
                limit, key = w.memory_limit, w.key
                if limit is None or key is None or w.over_memory:
                    continue
                rss = resident_bytes(w.process.pid)
                if rss is not None and rss > limit:
                    w.over_memory = (
                        f"{w.stage_name}, shard {w.shard}: the worker's resident memory reached "
                        f"{format_bytes(rss)}, over the task's memory limit of "
                        f"{format_bytes(limit)}, so the worker was killed"
                    )
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(w.process.pid, signal.SIGKILL)


class LocalBackend:
    def __init__(self, max_workers: int, tmpdir: str | None = None):
        self.capacity = max(1, max_workers)
        self.tmpdir = tmpdir
        if tmpdir is not None:
            os.makedirs(tmpdir, exist_ok=True)
        self._workers: list[_Worker] = []
        self.workers_started = 0
        self.tasks_sent = 0
        self.bytes_sent = 0  # task bytes sent to workers (tests check shared objects stay out)
        try:
            self._cores = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self._cores = []
        self._core_load: collections.Counter[int] = collections.Counter()
        self._watch = _MemoryWatch(self)

    def _start_worker(self) -> _Worker:
        parent, child = socket.socketpair()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "marin_dagster.zephyr.backends.worker",
                str(child.fileno()),
                str(os.getpid()),
            ],
            pass_fds=(child.fileno(),),
            env=_worker_env(self.capacity, self.tmpdir),
            stdin=subprocess.DEVNULL,
        )
        child.close()
        worker = _Worker(proc, multiprocessing.connection.Connection(parent.detach()))
        self._workers.append(worker)
        self.workers_started += 1
        return worker

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def share(self, obj: Any, folder: str) -> Any:
        return share_as_file(obj, folder)

    def _take_cores(self, n: int) -> tuple[int, ...]:
        if not self._cores:
            return ()
        n = min(n, len(self._cores))
        chosen = sorted(self._cores, key=lambda c: (self._core_load[c], c))[:n]
        self._core_load.update(chosen)
        return tuple(sorted(chosen))

    def _release(self, worker: _Worker) -> None:
        self._core_load.subtract(worker.cores)
        worker.cores = ()
        worker.memory_limit = None
        worker.key = None

    def submit(self, key: Any, task: Task, resources: TaskResources | None = None) -> None:
        resources = resources or TaskResources()
        worker = next((w for w in self._workers if w.key is None), None)
        if worker is None:
            worker = self._start_worker()
        worker.key = key
        worker.stage_name, worker.shard = task.stage_name, task.shard_idx
        if resources.cpus is not None:
            worker.cores = self._take_cores(resources.cpu_slots)
        task.cpu_set = worker.cores or None
        if resources.memory is not None:
            worker.memory_limit = resources.memory
            self._watch.start()
        payload = dumps_task(task)
        self.tasks_sent += 1
        self.bytes_sent += len(payload)
        try:
            worker.conn.send_bytes(payload)
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
        key = worker.key
        over = worker.over_memory
        self._release(worker)
        if over:
            logger.warning("%s; the task will be retried in a new worker", over)
            return key, WorkerLost(over, over_memory=True)
        reason = (
            f"worker process {worker.process.pid} died with signal {-code}"
            if code < 0
            else f"worker process {worker.process.pid} exited with code {code}"
        )
        logger.warning("%s; its shard will be rerun in a new worker", reason)
        return key, WorkerLost(reason, exit_code=code)

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
            self._release(w)
            if w.over_memory:
                # Killed just after it answered: the answer stands, the worker is replaced.
                self._workers.remove(w)
                with contextlib.suppress(Exception):
                    w.conn.close()
                w.process.wait()
        return out

    def shutdown(self) -> None:
        self._watch.stop.set()
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
        self._core_load.clear()

    def __del__(self) -> None:
        if getattr(self, "_workers", None):
            with contextlib.suppress(Exception):
                self.shutdown()
