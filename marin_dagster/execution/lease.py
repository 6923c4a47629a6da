"""A lease on a step's output, so that two runs never write one output.

After Marin's executor: the holder rewrites a heartbeat every
`heartbeat_s`; a lease whose heartbeat is older than `stale_after_s`, or
whose holder process on this host is gone, is taken over. The holder records its own
`stale_after_s` in the lease, and is judged by it: runs may be configured differently. Creation is
exclusive (O_EXCL locally, ifGenerationMatch=0 on GCS); since some object
stores (the GCS emulator among them) ignore preconditions, the winner also
re-reads the lease after `settle_s` and backs off if another token is there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from marin_dagster import fs
from marin_dagster.execution.processes import process_gone
from marin_dagster.execution.status import LOCK_FILE

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LeaseSettings:
    heartbeat_s: float = 30.0
    stale_after_s: float = 90.0
    wait_s: float = 3600.0
    poll_s: float = 1.0
    settle_s: float = 0.5


class LeaseHeldError(RuntimeError):
    """Another live run holds the lease on this output."""


class LeaseLostError(RuntimeError):
    """The lease was taken over while this run held it."""


def describe_holder(lock: dict[str, Any]) -> str:
    age = time.time() - float(lock.get("heartbeat_at", 0))
    return (
        f"run {lock.get('run_id') or '?'} (pid {lock.get('pid')} on {lock.get('host')}, "
        f"last heartbeat {age:.0f}s ago)"
    )


class Lease:
    """Hold with `with Lease(output_path, settings, run_id=...):` around the step's work."""

    def __init__(
        self,
        output_path: str,
        settings: LeaseSettings | None = None,
        run_id: str | None = None,
        log: logging.Logger | Any = None,
    ):
        self.path = fs.join(output_path, LOCK_FILE)
        # The run's own log (Dagster's, in a step), so a takeover shows where the user looks.
        self.log = log or logger
        self.settings = settings or LeaseSettings()
        self.run_id = run_id
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: str | None = None

    # -- reading -----------------------------------------------------------
    def read(self) -> dict[str, Any] | None:
        for attempt in range(3):
            try:
                return fs.read_json(self.path)
            except FileNotFoundError:
                return None
            except (json.JSONDecodeError, UnicodeDecodeError):
                # Read again before judging: a live holder may be rewriting it.
                time.sleep(self.settings.poll_s * (attempt + 1))
        # Torn on every read: a writer crashed mid-write on a store without
        # atomic writes, so the lease is stale.
        return {"heartbeat_at": 0}

    def stale_limit(self, lock: dict[str, Any]) -> float:
        """The holder's own limit: it knows how often it beats (a longer `heartbeat_s` than
        ours must not make its live lease look stale to us, nor to `marin status`)."""
        try:
            return float(lock["stale_after_s"])
        except (KeyError, TypeError, ValueError):
            return self.settings.stale_after_s  # a lease written before holders recorded it

    def is_stale(self, lock: dict[str, Any]) -> bool:
        if time.time() - float(lock.get("heartbeat_at", 0)) > self.stale_limit(lock):
            return True
        return (
            lock.get("host") == socket.gethostname()
            and isinstance(lock.get("pid"), int)
            and process_gone(lock["pid"])
        )

    # -- writing -----------------------------------------------------------
    def _record(self) -> bytes:
        now = time.time()
        return json.dumps(
            {
                "token": self.token,
                "run_id": self.run_id,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "heartbeat_at": now,
                "stale_after_s": self.settings.stale_after_s,
            }
        ).encode()

    def _create(self) -> bool:
        fsys, p = fs.url_to_fs(self.path)
        if isinstance(fsys, LocalFileSystem):
            os.makedirs(os.path.dirname(p), exist_ok=True)
            try:
                fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(self._record())
            return True
        fsys.makedirs(p.rsplit("/", 1)[0], exist_ok=True)
        try:
            fsys.pipe_file(p, self._record(), mode="create")
        except (FileExistsError, OSError) as e:
            if isinstance(e, FileExistsError) or "412" in str(e) or "exists" in str(e).lower():
                return False
            raise
        time.sleep(self.settings.settle_s)
        lock = self.read()
        return bool(lock) and lock.get("token") == self.token

    def _break(self, lock: dict[str, Any]) -> None:
        self.log.warning(f"taking over the stale lease {self.path} held by {describe_holder(lock)}")
        fsys, p = fs.url_to_fs(self.path)
        if isinstance(fsys, LocalFileSystem):
            # rename is atomic: of two runs breaking the same stale lease one wins.
            with contextlib.suppress(FileNotFoundError):
                os.replace(p, f"{p}.stale-{uuid.uuid4().hex[:8]}")
                for name in os.listdir(os.path.dirname(p)):
                    if name.startswith(os.path.basename(p) + ".stale-"):
                        with contextlib.suppress(FileNotFoundError):
                            os.remove(os.path.join(os.path.dirname(p), name))
        else:
            with contextlib.suppress(FileNotFoundError):
                fsys.rm_file(p)

    def acquire(self) -> None:
        deadline = time.time() + self.settings.wait_s
        waited = False
        while True:
            lock = self.read()
            if lock is not None and lock.get("token") == self.token:
                break
            if lock is not None and self.is_stale(lock):
                self._break(lock)
                lock = None
            if lock is None and self._create():
                break
            lock = self.read()
            if lock is not None and lock.get("token") != self.token:
                if time.time() >= deadline:
                    raise LeaseHeldError(
                        f"{self.path.rsplit('/', 1)[0]} is being written by {describe_holder(lock)}. "
                        "Wait for that run to finish, or if it is dead, wait "
                        f"{self.stale_limit(lock):.0f}s for its lease to go stale."
                    )
                if not waited:
                    self.log.info(f"waiting for {self.path} held by {describe_holder(lock)}")
                    waited = True
            time.sleep(self.settings.poll_s)
        self._thread = threading.Thread(target=self._heartbeat, name="marin-lease", daemon=True)
        self._thread.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_s):
            lock = self.read()
            if lock is None or lock.get("token") != self.token:
                self.lost = describe_holder(lock) if lock else "nobody (the lease file was removed)"
                self.log.error(f"lease {self.path} lost to {self.lost}")
                return
            fs.write_bytes(self.path, self._record())

    def holds(self) -> bool:
        lock = self.read()
        return not self.lost and lock is not None and lock.get("token") == self.token

    def check(self) -> None:
        """Fail if the lease was taken over: our output may have been overwritten."""
        lock = self.read()
        if self.lost or lock is None or lock.get("token") != self.token:
            holder = self.lost or (describe_holder(lock) if lock else "nobody")
            raise LeaseLostError(f"lost the lease on {self.path} to {holder}; rerun the step")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        lock = self.read()
        if lock is not None and lock.get("token") == self.token:
            fs.remove(self.path)

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder_gone(output_path: str) -> bool:
    """Whether a RUNNING output's writer is gone: no lease, or a stale one (its process on
    this host ended, or its heartbeat is older than the stale limit). It was killed, and the
    next run takes the output over."""
    lease = Lease(output_path)
    lock = lease.read()
    return lock is None or lease.is_stale(lock)
