"""Settings dataclasses declared once, without Dagster, and read by the layers that need them.

An engine's run settings (`IrisSettings`, `TrainerSettings`) are frozen dataclasses whose
fields carry their description (`setting(default, "...")`). The Dagster side derives its
config schema and resources from them field by field (`resources/derive.py`,
`iris/executor.py`), using the helpers here, so a setting has one name, one default and
one description everywhere.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import field
from typing import Any


def setting(
    default: Any = dataclasses.MISSING,
    description: str = "",
    *,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A settings field with the description the UI and the executor's schema show."""
    return field(
        default=default, default_factory=default_factory, metadata={"description": description}
    )


def parse_bool(text: str) -> bool:
    """A yes/no setting given as text (a flag, a run tag, a resources option)."""
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def settings_fields(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    """`(field, resolved type)` of a settings dataclass, in declaration order."""
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


def field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """`(T, True)` for `T | None`, else `(tp, False)`."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False
