"""A small read-only HTTP SQL service over the dataset views.

    POST /query   body: the SQL (text/plain) or {"sql": "...", "limit": N} (JSON)
                  200 {"columns", "types", "rows", "row_count", "truncated", "cached", "elapsed_ms"}
                  400 the SQL does not parse or fails; 403 refused (not one SELECT, or a file
                  outside the prefix); 408 past the timeout
    GET  /tables  the views: name, version, path, format, current
    GET  /health  {"ok": true}

Read-only in depth: `guard.check_read_only` lets only one SELECT through;
the connection is locked down after the views are made (no file access outside
the prefix, no extensions, configuration locked). Queries run one at a time
on one connection; a timer interrupts a query past its timeout. Results are
cached by SQL text and row limit until the catalog changes (it is re-resolved
at most every `refresh_s`).
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import datetime
import decimal
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import duckdb

from marin_dagster.ducky.catalog import Dataset
from marin_dagster.ducky.connection import connect, lock_down
from marin_dagster.ducky.guard import QueryRefused, check_read_only

logger = logging.getLogger(__name__)

MAX_BODY = 1 << 20


class QueryTimeout(RuntimeError):
    pass


class QueryFailed(ValueError):
    pass


def jsonable(value: Any) -> Any:
    """DuckDB's Python values as JSON values (dates as ISO strings, blobs as base64)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return str(value)


@dataclasses.dataclass
class SqlService:
    """Read-only SQL over `catalog()`'s datasets under `prefix`."""

    prefix: str
    catalog: Callable[[], Sequence[Dataset]]
    row_limit: int = 1000
    timeout_s: float = 30.0
    cache_size: int = 256
    refresh_s: float = 30.0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[tuple[str, int], dict[str, Any]] = collections.OrderedDict()
        self._con: duckdb.DuckDBPyConnection | None = None
        self._datasets: list[Dataset] = []
        self._refreshed = 0.0
        self.executed = 0
        """Queries that reached DuckDB (cache misses), for tests and /health."""

    # -- catalog --------------------------------------------------------------
    def _refresh(self, force: bool = False) -> None:
        if not force and self._con is not None and time.monotonic() - self._refreshed < self.refresh_s:
            return
        datasets = list(self.catalog())
        self._refreshed = time.monotonic()
        if self._con is not None and [d.key for d in datasets] == [d.key for d in self._datasets]:
            return
        con = connect(datasets, self.prefix)
        lock_down(con, self.prefix)
        if self._con is not None:
            self._con.close()
        self._con, self._datasets = con, datasets
        self._cache.clear()
        logger.info(f"ducky: {len(datasets)} views: {', '.join(d.name for d in datasets)}")

    def tables(self) -> list[dict[str, Any]]:
        with self._lock:
            self._refresh()
            return [{"name": d.name, "version": d.version, "path": d.path, "format": d.format,
                     "current": d.current, "files": len(d.files)} for d in self._datasets]

    # -- queries --------------------------------------------------------------
    def query(self, sql: str, limit: int | None = None) -> dict[str, Any]:
        """Run one SELECT; raises QueryRefused, QueryTimeout or QueryFailed."""
        limit = self.row_limit if limit is None else max(0, min(int(limit), self.row_limit))
        try:
            statement = check_read_only(sql)
        except duckdb.Error as e:
            raise QueryFailed(f"the SQL does not parse: {e}") from e
        key = (statement.strip(), limit)
        with self._lock:
            self._refresh()
            if key in self._cache:
                self._cache.move_to_end(key)
                return {**self._cache[key], "cached": True}
            result = self._execute(statement, limit)
            self._cache[key] = result
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            return {**result, "cached": False}

    def _execute(self, statement: str, limit: int) -> dict[str, Any]:
        assert self._con is not None
        con = self._con
        timer = threading.Timer(self.timeout_s, con.interrupt)
        started = time.monotonic()
        timer.start()
        try:
            cursor = con.execute(statement)
            rows = cursor.fetchmany(limit + 1)
            description = cursor.description or []
        except duckdb.InterruptException as e:
            raise QueryTimeout(f"the query ran past the {self.timeout_s:g} s timeout and was stopped") from e
        except duckdb.PermissionException as e:
            raise QueryRefused(f"refused: {e}; only the dataset views under {self.prefix} can be read") from e
        except duckdb.Error as e:
            if time.monotonic() - started >= self.timeout_s:
                raise QueryTimeout(f"the query ran past the {self.timeout_s:g} s timeout and was stopped") from e
            raise QueryFailed(str(e)) from e
        finally:
            timer.cancel()
        self.executed += 1
        truncated = len(rows) > limit
        rows = rows[:limit]
        return {
            "columns": [d[0] for d in description],
            "types": [str(d[1]) for d in description],
            "rows": [[jsonable(v) for v in row] for row in rows],
            "row_count": len(rows),
            "truncated": truncated,
            "elapsed_ms": round((time.monotonic() - started) * 1000, 1),
        }

    # -- HTTP -----------------------------------------------------------------
    def make_server(self, host: str = "127.0.0.1", port: int = 8765) -> ThreadingHTTPServer:
        with self._lock:
            self._refresh(force=True)
        return ThreadingHTTPServer((host, port), _handler_for(self))


def _handler_for(service: SqlService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "marin-ducky"

        def log_message(self, format: str, *args: Any) -> None:
            logger.info("%s " + format, self.address_string(), *args)

        def _send(self, code: int, body: dict[str, Any]) -> None:
            payload = json.dumps(body).encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path == "/health":
                self._send(200, {"ok": True, "executed": service.executed})
            elif self.path == "/tables":
                self._send(200, {"tables": service.tables()})
            else:
                self._send(404, {"error": f"no route GET {self.path}; use POST /query, GET /tables"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/query":
                self._send(404, {"error": f"no route POST {self.path}; use POST /query"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._send(413, {"error": f"the body is over {MAX_BODY} bytes"})
                return
            body = self.rfile.read(length).decode("utf-8", errors="replace")
            limit = None
            if "json" in (self.headers.get("Content-Type") or ""):
                try:
                    request = json.loads(body)
                    sql, limit = request["sql"], request.get("limit")
                except (ValueError, KeyError, TypeError) as e:
                    self._send(400, {"error": f'the JSON body must be {{"sql": "...", "limit": N}} ({e})'})
                    return
            else:
                sql = body
            try:
                self._send(200, service.query(sql, limit))
            except QueryRefused as e:
                self._send(403, {"error": str(e)})
            except QueryTimeout as e:
                self._send(408, {"error": str(e)})
            except (QueryFailed, ValueError) as e:
                self._send(400, {"error": str(e)})

    return Handler
