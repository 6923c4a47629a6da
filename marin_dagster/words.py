"""Words for messages."""

from __future__ import annotations

from typing import Any


def a_type(value: Any) -> str:
    """`value`'s type with its article: "an int", "a list"."""
    name = type(value).__name__
    return ("an " if name[0].lower() in "aeiou" else "a ") + name
