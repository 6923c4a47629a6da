"""`marin sql --serve` as a person runs it: started as a console script, asked over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from tests.conftest import free_port
from tests.ui.dagster_process import dagster_process, log_tail

MARIN = os.path.join(os.path.dirname(sys.executable), "marin")


@contextlib.contextmanager
def sql_server(args: list[str], log: str, cwd: str, **env: str) -> Iterator[str]:
    """`marin sql --serve --port P *args`, up and answering /health; yields its URL."""
    port = free_port()
    with dagster_process(
        [MARIN, "sql", "--serve", "--port", str(port), *args], log, cwd=cwd, **env
    ) as proc:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, log_tail(log)
                time.sleep(0.3)
        yield url


def post_sql(url: str, sql: str) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{url}/query", data=sql.encode(), headers={"Content-Type": "text/plain"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
