"""The local worker process: `python -m marin_dagster.zephyr.backends.worker FD`.

A fresh interpreter (like multiprocessing's spawn, but without re-importing
the driver's __main__, so a pipeline run from an unguarded script cannot
recurse). It reads task bytes from the socket FD and answers with result
bytes until the driver closes the socket.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import signal
import socket
import sys

from marin_dagster.zephyr.backends.base import run_task_bytes


def serve(conn: multiprocessing.connection.Connection) -> None:
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            return
        conn.send_bytes(run_task_bytes(payload))


def main() -> None:
    # Ctrl-C goes to the driver, which stops the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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
