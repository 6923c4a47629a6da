"""A small read-only HTTP SQL service over the dataset views.

    POST /query   body: the SQL (text/plain) or {"sql": "...", "limit": N} (JSON: a body opening
                  with "{", whatever its Content-Type)
                  200 {"columns", "types", "rows", "row_count", "truncated", "cached", "elapsed_ms",
                  "notes"}; a note for each view read that shows an older config's output
                  400 the SQL does not parse (with a hint where a view name holding "/" is not
                  double-quoted) or fails, a bad `limit`, a JSON body of another shape, or a
                  view that is unavailable or whose asset has no output yet (saying why);
                  403 refused (not one SELECT, or a file outside the prefix); 408 past the timeout;
                  413 the result is over the caps per response (rows or bytes)
    GET  /tables  the views: name, version, path, format, current (and a note when not); those
                  unavailable, with why; the assets with no output yet (not_built); and
                  those built with no table in their output, a tokenizer's (no_table)
    GET  /health  {"ok": true}

Caps per response: at most `max_rows` rows (default 10,000) and `max_bytes`
bytes of rows as JSON (default 16 MiB). A result over either is a 413 that
says how to narrow the query (LIMIT, aggregate, fewer columns); with a
`limit` (0 to max_rows) the first `limit` rows come back instead, with
`truncated` true when there were more. The result is never materialized
whole: the query runs as `SELECT * FROM (<query>) LIMIT cap + 1` (DuckDB turns
ORDER BY + LIMIT into a top-N) and rows are fetched in batches, converted and
counted until a cap is passed.

Read-only in depth: `guard.check_read_only` lets only one SELECT through;
the connection is locked down after the views are made (no file access outside
the prefix, no extensions, configuration locked). Queries run one at a time
on one connection; a timer interrupts a query past its timeout. Results are
cached by SQL text and row limit (at most `cache_size` results and
`cache_bytes` bytes) until the catalog changes (it is re-resolved at most
every `refresh_s`). A view that cannot be made is left out with a logged
warning; querying it answers why.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import datetime
import decimal
import difflib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import duckdb

from marin_dagster.ducky.catalog import Dataset, NoView, Unavailable
from marin_dagster.ducky.connection import connect, lock_down, quote_ident
from marin_dagster.ducky.guard import QueryRefused, check_read_only

logger = logging.getLogger(__name__)

MAX_BODY = 1 << 20
DEFAULT_MAX_ROWS = 10_000
DEFAULT_MAX_BYTES = 16 << 20
_BATCH_ROWS = 256

# DuckDB numbers an error's line in the statement it ran, which wraps the user's in one line
# of `SELECT * FROM (`: LINE 2 is the user's first.
_WRAPPED_LINE = re.compile(r"^LINE (\d+):", re.MULTILINE)
_MISSING_TABLE = re.compile(r"Table with name (.+?) does not exist!")
_DID_YOU_MEAN = re.compile(r'^Did you mean "[^\n]*"\?$', re.MULTILINE)


def _as_written(message: str) -> str:
    """`message` with its line numbers counted in the user's statement; the width of each
    `LINE n:` is kept, so the caret under it still points at the same column."""
    return _WRAPPED_LINE.sub(
        lambda m: f"LINE {int(m.group(1)) - 1}:".ljust(len(m.group(0))), message
    )


class QueryTimeout(RuntimeError):
    pass


class QueryFailed(ValueError):
    pass


class ResultTooLarge(ValueError):
    """The result is over a cap per response; the message says how to narrow the query."""


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def check_limit(limit: Any, max_rows: int) -> int | None:
    """A request's `limit`: None, or a whole number from 0 to `max_rows`; QueryFailed otherwise."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise QueryFailed(
            f'"limit" must be a whole number of rows from 0 to {max_rows}, got {limit!r}; '
            "leave it out for the whole result"
        )
    if not 0 <= limit <= max_rows:
        raise QueryFailed(
            f'"limit" {limit} is not from 0 to {max_rows} (the most rows this service '
            "returns per response); ask for fewer rows, or aggregate the query"
        )
    return limit


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
    """Read-only SQL over `catalog()`'s datasets under `prefix`.

    `catalog()` returns Datasets, and Unavailable entries for assets whose
    output cannot be read (`catalog.resolve_views`).
    """

    prefix: str
    catalog: Callable[[], Sequence[Dataset | Unavailable | NoView]]
    max_rows: int = DEFAULT_MAX_ROWS
    max_bytes: int = DEFAULT_MAX_BYTES
    timeout_s: float = 30.0
    cache_size: int = 256
    cache_bytes: int = 64 << 20
    refresh_s: float = 30.0

    def __post_init__(self) -> None:
        for field in ("max_rows", "max_bytes", "cache_size", "cache_bytes"):
            value = getattr(self, field)
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < (0 if "cache" in field else 1)
            ):
                raise ValueError(
                    f"SqlService: {field} must be a whole number >= "
                    f"{0 if 'cache' in field else 1}, got {value!r}"
                )
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[tuple[str, int | None], tuple[dict[str, Any], int]] = (
            collections.OrderedDict()
        )
        self._cached_bytes = 0
        self._con: duckdb.DuckDBPyConnection | None = None
        self._datasets: list[Dataset] = []
        self._keys: list[Any] = []
        self._unavailable: dict[str, str] = {}
        self._no_view: dict[str, NoView] = {}
        self._refreshed = 0.0
        self.executed = 0
        """Queries that reached DuckDB (cache misses), for tests and /health."""
        self.running = 0
        """Queries running now, for tests and /health."""

    # -- catalog --------------------------------------------------------------
    def _refresh(self, force: bool = False) -> None:
        if (
            not force
            and self._con is not None
            and time.monotonic() - self._refreshed < self.refresh_s
        ):
            return
        items = list(self.catalog())
        self._refreshed = time.monotonic()
        keys = [d.key if isinstance(d, Dataset) else (d.name, d.reason) for d in items]
        if self._con is not None and keys == self._keys:
            return
        self._no_view = {n.name: n for n in items if isinstance(n, NoView)}
        unavailable = {u.name: u.reason for u in items if isinstance(u, Unavailable)}
        datasets = [d for d in items if isinstance(d, Dataset)]
        con = connect(datasets, self.prefix, unavailable)
        lock_down(con, self.prefix)
        # The old connection is not closed here: a query may still be running on a cursor of
        # it (queries run outside the lock). It closes when its last query lets go of it.
        self._con, self._keys, self._unavailable = con, keys, unavailable
        self._datasets = [d for d in datasets if d.name not in unavailable]
        self._cache.clear()
        self._cached_bytes = 0
        logger.info(
            f"ducky: {len(self._datasets)} views: {', '.join(d.name for d in self._datasets)}"
            + (f"; unavailable: {', '.join(unavailable)}" if unavailable else "")
        )

    def tables(self) -> list[dict[str, Any]]:
        with self._lock:
            self._refresh()
            return [
                {
                    "name": d.name,
                    "version": d.version,
                    "path": d.path,
                    "format": d.format,
                    "current": d.current,
                    **({"note": d.note} if d.note else {}),
                    "files": len(d.files),
                }
                for d in self._datasets
            ]

    def no_view(self) -> dict[str, NoView]:
        """Assets with no output to query (not built yet, or built with no table): name ->
        where they stand, and what to do."""
        with self._lock:
            self._refresh()
            return dict(self._no_view)

    def unavailable(self) -> dict[str, str]:
        """Views that could not be made: name -> why, and what to do."""
        with self._lock:
            self._refresh()
            return dict(self._unavailable)

    # -- queries --------------------------------------------------------------
    def query(self, sql: str, limit: Any = None) -> dict[str, Any]:
        """Run one SELECT; raises QueryRefused, QueryTimeout, ResultTooLarge or QueryFailed.

        Without `limit` the whole result comes back, or ResultTooLarge when it is
        over `max_rows` rows or `max_bytes` bytes; with `limit` (0 to max_rows)
        its first `limit` rows, `truncated` when there were more.
        """
        limit = check_limit(limit, self.max_rows)
        if not isinstance(sql, str):
            raise QueryFailed(f"the SQL must be a string, got {type(sql).__name__}")
        if not sql.strip():  # a malformed request (400), not a refused statement (403)
            raise QueryFailed('the SQL is empty: send one SELECT, e.g. {"sql": "SELECT 1"}')
        try:
            statement = check_read_only(sql)
        except duckdb.Error as e:
            raise QueryFailed(f"the SQL does not parse: {e}{self._quoting_hint(sql)}") from e
        key = (statement.strip(), limit)
        with self._lock:
            self._refresh()
            if any(name in statement for name, n in self._no_view.items() if not n.built):
                # Built since the last look, perhaps (the catalog is read every refresh_s):
                # look again rather than answer "not materialized" for up to refresh_s.
                self._refresh(force=True)
            if key in self._cache:
                self._cache.move_to_end(key)
                return {**self._cache[key][0], "cached": True}
            con = self._con
        # Outside the lock, on a cursor of its own: one slow query held every other request
        # (and /tables) until it ended or timed out.
        result, size = self._execute(con, statement, limit)
        with self._lock:
            if con is self._con and key not in self._cache and size <= self.cache_bytes:
                self._cache[key] = (result, size)
                self._cached_bytes += size
                while len(self._cache) > self.cache_size or self._cached_bytes > self.cache_bytes:
                    self._cached_bytes -= self._cache.popitem(last=False)[1][1]
        return {**result, "cached": False}

    def _quoting_hint(self, sql: str) -> str:
        """Where `sql` names a view holding "/" without double quotes, how to write it.

        A bare raw/notes parses as a division, and DuckDB's own error says only that "/" is
        a syntax error.
        """
        with self._lock:
            self._refresh()
            names = [d.name for d in self._datasets] + list(self._unavailable)
        # Not part of a longer name, not already quoted.
        bare = [
            n
            for n in names
            if "/" in n and re.search(rf'(?<![\w"./-]){re.escape(n)}(?![\w"./-])', sql)
        ]
        if not bare:
            return ""
        quoted = ", ".join(f"{quote_ident(n)} for {n}" for n in bare)
        return f'\nview names holding "/" must be in double quotes: write {quoted}'

    def _views_meant(self, message: str) -> str:
        """A catalog error's "Did you mean" told in views: DuckDB offers its own tables
        (`notes` -> "pg_namespace") where the user left out the view's folder."""
        missing = _MISSING_TABLE.search(message)
        if missing is None:
            return message
        name = missing.group(1)
        views = [d.name for d in self._datasets]
        # every view of that last part: raw/notes, dedup/notes and tokenized/notes alike
        meant = [v for v in views if v.rsplit("/", 1)[-1].lower() == name.lower()]
        meant = meant or difflib.get_close_matches(name, views, n=3, cutoff=0.6)
        if meant:
            hint = "did you mean " + " or ".join(quote_ident(v) for v in meant) + "?"
        else:
            hint = "the views: " + (", ".join(quote_ident(v) for v in views[:10]) or "none")
            hint += f" (and {len(views) - 10} more)" if len(views) > 10 else ""
        ours = f'there is no view "{name}"; {hint}'
        theirs = _DID_YOU_MEAN.search(message)
        if theirs is None:
            return message.replace(missing.group(0), f"{missing.group(0)}\n{ours}", 1)
        return message[: theirs.start()] + ours + message[theirs.end() :]

    def _tables_read(self, statement: str) -> set[str] | None:
        """The names `statement` reads from, or None where it cannot tell.

        From DuckDB's parse tree: `get_table_names` binds the query, which expands a view
        into what it reads, so it never names the views themselves.
        """
        assert self._con is not None
        try:
            row = self._con.execute("SELECT json_serialize_sql(?)", [statement]).fetchone()
            tree = json.loads(row[0]) if row else {"error": True}
        except (duckdb.Error, ValueError):
            return None
        if tree.get("error"):
            return None
        names: set[str] = set()
        stack: list[Any] = [tree]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                if node.get("type") == "BASE_TABLE" and isinstance(node.get("table_name"), str):
                    names.add(node["table_name"])
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
        return names

    def _unavailable_in(self, statement: str) -> str | None:
        read = self._tables_read(statement)

        def reads(name: str) -> bool:
            if read is not None:
                return name in read
            return quote_ident(name) in statement or name in statement

        for name, reason in self._unavailable.items():
            if reads(name):
                return f'the view "{name}" is unavailable: {reason}'
        for name, no_view in self._no_view.items():
            if reads(name):
                yet = "" if no_view.built else " yet"
                return f'there is no view "{name}"{yet}: {no_view.reason}'
        return None

    def _notes(self, statement: str) -> list[str]:
        """The notes of the views `statement` reads (those showing an older config's output)."""
        read = self._tables_read(statement)
        return [d.note for d in self._datasets if d.note and (read is None or d.name in read)]

    def _too_many_rows(self) -> ResultTooLarge:
        return ResultTooLarge(
            f"the result has more than {self.max_rows:,} rows, the most this service returns per response; "
            "narrow the query: add LIMIT (e.g. LIMIT 100), aggregate (count(*), GROUP BY), filter with "
            'WHERE, or send "limit": N for the first N rows'
        )

    def _too_many_bytes(self, rows: int) -> ResultTooLarge:
        return ResultTooLarge(
            f"the result is over {human_bytes(self.max_bytes)} as JSON after {rows:,} rows, the most this "
            "service returns per response; narrow the query: select fewer or shorter columns "
            "(e.g. left(text, 200) instead of text), aggregate (count(*), GROUP BY), or add LIMIT"
        )

    def _execute(
        self, connection: duckdb.DuckDBPyConnection | None, statement: str, limit: int | None
    ) -> tuple[dict[str, Any], int]:
        """The result and its rows' size as JSON; fetches at most `cap + 1` rows, in batches."""
        assert connection is not None
        con = connection.cursor()  # its own connection to the views, for this thread
        with self._lock:
            self.running += 1
        cap = self.max_rows if limit is None else limit
        timer = threading.Timer(self.timeout_s, con.interrupt)
        started = time.monotonic()
        rows: list[list[Any]] = []
        size = 0
        more = False
        timer.start()
        try:
            # The newline ends a trailing -- comment; DuckDB makes ORDER BY + LIMIT a top-N.
            cursor = con.execute(f"SELECT * FROM (\n{statement}\n) LIMIT {cap + 1}")
            description = cursor.description or []
            while not more:
                batch = cursor.fetchmany(_BATCH_ROWS)
                if not batch:
                    break
                for row in batch:
                    if len(rows) == cap:
                        more = True
                        break
                    values = [jsonable(v) for v in row]
                    size += len(json.dumps(values).encode("utf-8")) + 2
                    if size > self.max_bytes:
                        raise self._too_many_bytes(len(rows))
                    rows.append(values)
        except duckdb.InterruptException as e:
            raise QueryTimeout(
                f"the query ran past the {self.timeout_s:g} s timeout and was stopped"
            ) from e
        except duckdb.PermissionException as e:
            raise QueryRefused(
                f"refused: {e}; only the dataset views under {self.prefix} can be read"
            ) from e
        except duckdb.Error as e:
            if time.monotonic() - started >= self.timeout_s:
                raise QueryTimeout(
                    f"the query ran past the {self.timeout_s:g} s timeout and was stopped"
                ) from e
            message = _as_written(str(e))
            if isinstance(e, duckdb.CatalogException):
                why = self._unavailable_in(statement)
                if why:
                    raise QueryFailed(why) from e
                message = self._views_meant(message)
            raise QueryFailed(message) from e
        finally:
            timer.cancel()
            con.close()
            with self._lock:
                self.running -= 1
        self.executed += 1
        if more and limit is None:
            raise self._too_many_rows()
        return {
            "columns": [d[0] for d in description],
            "types": [str(d[1]) for d in description],
            "rows": rows,
            "row_count": len(rows),
            "truncated": more,
            "elapsed_ms": round((time.monotonic() - started) * 1000, 1),
            "notes": self._notes(statement),
        }, size

    # -- HTTP -----------------------------------------------------------------
    def make_server(self, host: str = "127.0.0.1", port: int = 8765) -> ThreadingHTTPServer:
        with self._lock:
            self._refresh(force=True)
        return ThreadingHTTPServer((host, port), _handler_for(self))


REQUEST_FIELDS = ("sql", "limit")


def parse_json_request(body: str) -> tuple[str, Any]:
    """The SQL and the `limit` (unchecked) of a JSON request body; QueryFailed saying what the
    body must be otherwise."""
    shape = (
        'the body must be a JSON object with "sql" (a string: one SELECT) and optionally '
        '"limit" (a whole number of rows), e.g. {"sql": "SELECT 1", "limit": 10}'
    )
    try:
        request = json.loads(body)
    except ValueError as e:
        raise QueryFailed(f"{shape}; it is not JSON ({e})") from None
    if not isinstance(request, dict):
        raise QueryFailed(f"{shape}; got {_json_kind(request)}")
    unknown = sorted(set(request) - set(REQUEST_FIELDS))
    if unknown:
        raise QueryFailed(f"{shape}; unknown key(s) {', '.join(map(json.dumps, unknown))}")
    if not isinstance(request.get("sql"), str):
        got = "missing" if "sql" not in request else _json_kind(request["sql"])
        raise QueryFailed(f'{shape}; "sql" is {got}')
    return request["sql"], request.get("limit")


def _json_kind(value: Any) -> str:
    """What a JSON value is, for messages: "an array", "null", ..."""
    if isinstance(value, bool):
        return "a boolean"
    kinds = {dict: "an object", list: "an array", str: "a string", type(None): "null"}
    return kinds.get(type(value), "a number")


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
                self._send(
                    200, {"ok": True, "executed": service.executed, "running": service.running}
                )
            elif self.path == "/tables":
                tables = service.tables()
                unavailable = [{"name": n, "reason": r} for n, r in service.unavailable().items()]
                no_view = service.no_view().values()
                self._send(
                    200,
                    {
                        "tables": tables,
                        "unavailable": unavailable,
                        "not_built": [
                            {"name": n.name, "reason": n.reason} for n in no_view if not n.built
                        ],
                        "no_table": [
                            {"name": n.name, "reason": n.reason} for n in no_view if n.built
                        ],
                    },
                )
            else:
                self._send(
                    404, {"error": f"no route GET {self.path}; use POST /query, GET /tables"}
                )

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/query":
                self._send(404, {"error": f"no route POST {self.path}; use POST /query"})
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                self._send(400, {"error": "the Content-Length header is not a number"})
                return
            if length > MAX_BODY:
                self._send(413, {"error": f"the body is over {MAX_BODY} bytes; send one SELECT"})
                return
            body = self.rfile.read(length).decode("utf-8", errors="replace")
            limit = None
            # A body opening with "{" is the JSON request whatever its Content-Type: `curl -d`
            # sends JSON as a form, and no SQL statement starts with "{".
            is_json = "json" in (self.headers.get("Content-Type") or "")
            if is_json or body.lstrip().startswith("{"):
                try:
                    sql, limit = parse_json_request(body)
                except QueryFailed as e:
                    self._send(400, {"error": str(e)})
                    return
            else:
                sql = body
            try:
                self._send(200, service.query(sql, limit))
            except QueryRefused as e:
                self._send(403, {"error": str(e)})
            except QueryTimeout as e:
                self._send(408, {"error": str(e)})
            except ResultTooLarge as e:
                self._send(
                    413,
                    {"error": str(e), "max_rows": service.max_rows, "max_bytes": service.max_bytes},
                )
            except (QueryFailed, ValueError) as e:
                self._send(400, {"error": str(e)})

    return Handler
