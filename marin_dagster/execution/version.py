"""A step's version: a short hash of its config and its upstream steps' versions.

Marin hashes only what changes a step's output. Here every config field
counts unless declared otherwise with `unversioned(...)` (worker counts,
resources, logging), so forgetting a declaration costs a rerun, never a
wrong skip.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import pathlib
from collections.abc import Mapping
from typing import Any

import pydantic
import pydantic_core

VERSION_LENGTH = 8
_UNVERSIONED = "marin_unversioned"


class StepConfig(pydantic.BaseModel):
    """Base for step configs: frozen, and unknown or mistyped fields are errors."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid", strict=True)


def unversioned(default: Any = pydantic_core.PydanticUndefined, **kwargs: Any) -> Any:
    """A `StepConfig` field that does not change the step's output, so not in its version."""
    return pydantic.Field(default, json_schema_extra={_UNVERSIONED: True}, **kwargs)


# The same declaration for a dataclass field: `field(default=None, metadata=UNVERSIONED)`.
UNVERSIONED: Mapping[str, bool] = {_UNVERSIONED: True}

_ADDED_LATER = "marin_added_later"


def added_later(default: Any, **kwargs: Any) -> Any:
    """A `StepConfig` field added after steps were built with the config: at `default` (which
    must do what the config did without the field) it stays out of the version, so those
    steps keep theirs and are not redone; any other value enters it."""
    return pydantic.Field(default, json_schema_extra={_ADDED_LATER: True}, **kwargs)


# The same declaration for a dataclass field: `field(default=..., metadata=ADDED_LATER)`.
ADDED_LATER: Mapping[str, bool] = {_ADDED_LATER: True}


def _marked(field: pydantic.fields.FieldInfo, mark: str) -> bool:
    extra = field.json_schema_extra
    return isinstance(extra, dict) and bool(extra.get(mark))


def versioned_fields(config: Any) -> dict[str, Any]:
    """The config as a plain dict holding only the fields that shape the output."""
    if isinstance(config, pydantic.BaseModel):
        fields = type(config).model_fields
        return {
            name: canonical(getattr(config, name))
            for name, field in fields.items()
            if not _marked(field, _UNVERSIONED)
            and not (_marked(field, _ADDED_LATER) and getattr(config, name) == field.default)
        }
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {
            f.name: canonical(getattr(config, f.name))
            for f in dataclasses.fields(config)
            if not f.metadata.get(_UNVERSIONED, False)
            and not (f.metadata.get(_ADDED_LATER, False) and getattr(config, f.name) == f.default)
        }
    if isinstance(config, Mapping):
        return {str(k): canonical(v) for k, v in config.items()}
    raise TypeError(
        f"a step config must be a pydantic model, a dataclass or a mapping, not {type(config).__name__}"
    )


def canonical(value: Any) -> Any:
    """A JSON-ready form of `value` that is equal exactly when the values are."""
    if isinstance(value, pydantic.BaseModel) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    ):
        return {"__type__": type(value).__name__, **versioned_fields(value)}
    if isinstance(value, enum.Enum):
        return canonical(value.value)
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return repr(value)
        return value
    if isinstance(value, pathlib.PurePath):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    if isinstance(value, set | frozenset):
        try:
            return sorted(canonical(v) for v in value)
        except TypeError:  # mixed types ({1, "a"}) have no order to hash them in
            raise TypeError(
                f"cannot version the set {value!r}: its members are of mixed types, which "
                "have no stable order; use a list"
            ) from None
    raise TypeError(
        f"cannot version a value of type {type(value).__name__}: {value!r}; versioned "
        "values are JSON-like (str, int, float, bool, None, lists, dicts, dataclasses, "
        "pydantic models)"
    )


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def compute_version(
    kind: str,
    config: Any,
    upstream_versions: Mapping[str, str] | None = None,
    label: str | None = None,
) -> str:
    """sha256 of the step kind, its versioned config fields, its inputs' versions and the
    user's label if any; 8 hex."""
    payload: dict[str, Any] = {
        "kind": kind,
        "config": versioned_fields(config),
        "upstream": dict(sorted((upstream_versions or {}).items())),
    }
    if label is not None:  # absent, not null, so steps without a label keep their versions
        payload["label"] = label
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()[:VERSION_LENGTH]
