"""Plain-text tables for the terminal (`marin sql`, `marin status`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _cell(value: Any, width: int) -> str:
    text = "NULL" if value is None else str(value)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], max_width: int = 60) -> str:
    """A header, a rule and one line per row; long cells are cut to `max_width` characters."""
    cells = [[_cell(v, max_width) for v in row] for row in rows]
    widths = [len(c) for c in columns]
    for row in cells:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], len(value))
    numeric = [
        all(isinstance(r[i], int | float) or r[i] is None for r in rows) and bool(rows)
        for i in range(len(columns))
    ]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ).rstrip()

    out = [line(list(columns)), "  ".join("-" * w for w in widths)]
    out.extend(line(row) for row in cells)
    return "\n".join(out) + "\n"
