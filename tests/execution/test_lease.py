"""The lease on a step output, on local disk and on gs:// (the GCS emulator)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from marin_dagster import fs
from marin_dagster.execution.lease import Lease, LeaseHeldError, LeaseLostError, LeaseSettings
from marin_dagster.execution.status import LOCK_FILE

FAST = LeaseSettings(heartbeat_s=0.2, stale_after_s=2.0, wait_s=0.5, poll_s=0.05, settle_s=0.1)


def test_second_holder_fails_naming_the_first(prefix):
    out = fs.join(prefix, "step-1234")
    with Lease(out, FAST, run_id="run-one"):
        with pytest.raises(LeaseHeldError, match=r"being written by run run-one \(pid \d+"):
            Lease(out, FAST, run_id="run-two").acquire()
    assert not fs.exists(fs.join(out, LOCK_FILE)), "release removes the lease"


def test_waiter_gets_the_lease_once_released(prefix):
    out = fs.join(prefix, "step-1234")
    first = Lease(out, FAST, run_id="one")
    first.acquire()
    waiter = Lease(
        out,
        LeaseSettings(heartbeat_s=0.2, stale_after_s=2.0, wait_s=30, poll_s=0.05, settle_s=0.1),
        run_id="two",
    )
    import threading

    threading.Timer(0.5, first.release).start()
    waiter.acquire()
    assert fs.read_json(fs.join(out, LOCK_FILE))["run_id"] == "two"
    waiter.release()


def test_heartbeat_keeps_a_live_lease_fresh(prefix):
    out = fs.join(prefix, "step-1234")
    with Lease(out, FAST, run_id="one"):
        first = fs.read_json(fs.join(out, LOCK_FILE))["heartbeat_at"]
        time.sleep(2.5)  # longer than stale_after_s: without heartbeats it would be stale
        lock = fs.read_json(fs.join(out, LOCK_FILE))
        assert lock["heartbeat_at"] > first
        with pytest.raises(LeaseHeldError):
            Lease(out, FAST, run_id="two").acquire()


def test_stale_lease_from_another_host_is_taken_over(prefix):
    out = fs.join(prefix, "step-1234")
    fs.write_json(
        fs.join(out, LOCK_FILE),
        {
            "token": "old",
            "run_id": "crashed",
            "host": "some-other-host",
            "pid": 1,
            "heartbeat_at": time.time() - 10,
        },
    )
    with Lease(out, FAST, run_id="new") as lease:
        assert fs.read_json(fs.join(out, LOCK_FILE))["token"] == lease.token


def test_live_lease_from_another_host_is_respected(prefix):
    out = fs.join(prefix, "step-1234")
    fs.write_json(
        fs.join(out, LOCK_FILE),
        {
            "token": "old",
            "run_id": "elsewhere",
            "host": "some-other-host",
            "pid": 1,
            "heartbeat_at": time.time() + 60,
        },
    )
    with pytest.raises(LeaseHeldError, match="elsewhere"):
        Lease(out, FAST).acquire()


def test_a_holder_is_judged_by_the_stale_limit_it_runs_with(prefix):
    """Runs may be configured with different heartbeats: a waiter with the default 90 s
    limit must not break the live lease of a holder that beats every 2 minutes."""
    out = fs.join(prefix, "step-1234")
    slow = LeaseSettings(heartbeat_s=120, stale_after_s=400, wait_s=0.5, poll_s=0.05, settle_s=0.1)
    holder = Lease(out, slow, run_id="slow")
    holder.acquire()
    try:
        lock = fs.read_json(fs.join(out, LOCK_FILE))
        assert lock["stale_after_s"] == 400
        fs.write_json(fs.join(out, LOCK_FILE), {**lock, "heartbeat_at": time.time() - 200})
        waiter = Lease(out, LeaseSettings(wait_s=0.5, poll_s=0.05, settle_s=0.1), run_id="w")
        with pytest.raises(LeaseHeldError, match=r"slow .*wait 400s for its lease"):
            waiter.acquire()
        assert holder.holds()
    finally:
        holder.release()


def test_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(prefix):
    out = fs.join(prefix, "step-1234")
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    import socket

    fs.write_json(
        fs.join(out, LOCK_FILE),
        {
            "token": "old",
            "run_id": "killed",
            "host": socket.gethostname(),
            "pid": int(proc.stdout),
            "heartbeat_at": time.time(),
        },
    )
    slow_to_stale = LeaseSettings(
        heartbeat_s=0.2, stale_after_s=3600, wait_s=0.5, poll_s=0.05, settle_s=0.1
    )
    with Lease(out, slow_to_stale, run_id="new") as lease:
        assert lease.holds()


def test_lease_of_a_killed_process_not_yet_reaped_is_taken_over_at_once(prefix):
    """A holder SIGKILLed while its parent (a run worker, `dagster dev`) has not reaped it
    is a zombie: its pid still answers kill(0), but it will never heartbeat again."""
    import signal
    import socket

    out = fs.join(prefix, "step-zombie")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        lock = {
            "token": "old",
            "run_id": "killed",
            "host": socket.gethostname(),
            "pid": proc.pid,
            "heartbeat_at": time.time(),
        }
        fs.write_json(fs.join(out, LOCK_FILE), lock)
        slow_to_stale = LeaseSettings(
            heartbeat_s=0.2, stale_after_s=3600, wait_s=0.5, poll_s=0.05, settle_s=0.1
        )
        lease = Lease(out, slow_to_stale, run_id="new")
        assert not lease.is_stale(lock)  # alive: respected
        proc.send_signal(signal.SIGKILL)
        while True:  # dead but not reaped (no wait() yet): a zombie
            with open(f"/proc/{proc.pid}/stat") as f:
                if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        with lease:
            assert lease.holds()
    finally:
        proc.kill()
        proc.wait()


def test_a_taken_over_lease_is_noticed(prefix):
    out = fs.join(prefix, "step-1234")
    lease = Lease(out, FAST, run_id="one")
    lease.acquire()
    fs.write_bytes(
        fs.join(out, LOCK_FILE),
        json.dumps(
            {
                "token": "thief",
                "run_id": "two",
                "host": "h",
                "pid": 1,
                "heartbeat_at": time.time(),
            }
        ).encode(),
    )
    with pytest.raises(LeaseLostError, match="run two"):
        lease.check()
    lease.release()
    assert fs.read_json(fs.join(out, LOCK_FILE))["token"] == "thief", (
        "release leaves others' leases"
    )


def test_a_lease_read_while_its_holder_rewrites_it_is_never_torn(prefix):
    """The heartbeat replaces the lock object; a reader that asked for its size and
    then a byte range saw half of one version and half of another on gs://, took
    it for a crashed writer's torn file, and broke a live lease."""
    import threading

    path = fs.join(prefix, "step-1234", LOCK_FILE)
    fs.write_bytes(path, b"{}")
    stop = threading.Event()

    def rewrite() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            fs.write_bytes(path, json.dumps({"pad": "x" * (i % 50), "i": i}).encode())

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        torn = 0
        for _ in range(300):
            try:
                json.loads(fs.read_bytes(path))
            except ValueError:
                torn += 1
    finally:
        stop.set()
        writer.join()
    assert torn == 0
