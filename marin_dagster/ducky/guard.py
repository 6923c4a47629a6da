"""Refuse every statement but one SELECT, with DuckDB's own parser.

Statement types come from `duckdb.extract_statements`: COPY, ATTACH, INSTALL/
LOAD, SET, PRAGMA, CALL, EXPLAIN (EXPLAIN ANALYZE runs its statement), and
every DDL/DML statement are refused. File reads from inside a SELECT
(`read_csv('/etc/passwd')`) are stopped by the connection's lock-down
(`connection.lock_down`), not here.
"""

from __future__ import annotations

import duckdb

ALLOWED = frozenset({duckdb.StatementType.SELECT})


class QueryRefused(ValueError):
    """The SQL service is read-only; the message says which statement was refused and why."""


def check_read_only(sql: str) -> str:
    """The one SELECT statement in `sql`; raises QueryRefused otherwise, duckdb.Error if it does not parse."""
    statements = duckdb.extract_statements(sql)
    if not statements:
        raise QueryRefused("no SQL statement given; send one SELECT")
    if len(statements) > 1:
        raise QueryRefused(f"{len(statements)} statements given; send exactly one SELECT")
    statement = statements[0]
    if statement.type not in ALLOWED:
        words = statement.query.split()
        keyword = words[0].upper() if words else statement.type.name
        kind = keyword if keyword == statement.type.name else f"{keyword} ({statement.type.name})"
        raise QueryRefused(
            f"{kind} statements are refused: the SQL service is read-only; "
            "send one SELECT (DESCRIBE, SHOW, SUMMARIZE and FROM ... are SELECTs too)"
        )
    return statement.query
