"""Words for messages."""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def a_type(value: Any) -> str:
    """`value`'s type with its article: "an int", "a list"."""
    name = type(value).__name__
    return ("an " if name[0].lower() in "aeiou" else "a ") + name


def unknown_keyword(keyword: str, keywords: Sequence[str]) -> str:
    """A misspelt keyword, with its likely fix and the keywords there are."""
    close = difflib.get_close_matches(keyword, keywords, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown keyword {keyword!r}{hint} (the keywords: {', '.join(keywords)})"


def checked_keywords(cls: type[T]) -> type[T]:
    """A config dataclass whose misspelt keyword gets a did-you-mean, not Python's bare
    "unexpected keyword argument" (users write these configs in experiment files)."""
    init = cls.__init__
    names = [f.name for f in dataclasses.fields(cls) if f.init]

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for keyword in kwargs:
            if keyword not in names:
                raise TypeError(f"{cls.__name__}: {unknown_keyword(keyword, names)}")
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls
