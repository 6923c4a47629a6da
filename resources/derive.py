"""Dagster config classes derived from the engines' settings dataclasses.

A resource whose fields mirror an engine's settings (`IrisSettings`, `TrainerSettings`) is
generated from them, field by field (name, type, default, the description in the field's
metadata), so the two cannot drift and each setting is declared once, without Dagster.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

import pydantic

from marin_dagster.settings import field_default, settings_fields, unwrap_optional


def _config_type(tp: Any, nested: Mapping[type, type]) -> Any:
    inner, optional = unwrap_optional(tp)
    if dataclasses.is_dataclass(inner):
        converted: Any = nested[inner]
    elif typing.get_origin(inner) is tuple:
        converted = list[_config_type(typing.get_args(inner)[0], nested)]
    elif typing.get_origin(inner) in (Mapping, dict):
        converted = dict[typing.get_args(inner)]
    else:
        converted = inner
    return converted | None if optional else converted


def _config_fields(cls: type, nested: Mapping[type, type]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for f, tp in settings_fields(cls):
        annotation = _config_type(tp, nested)
        description = f.metadata.get("description") or None
        default = field_default(f)
        if dataclasses.is_dataclass(default):
            value = pydantic.Field(default_factory=nested[type(default)], description=description)
        elif isinstance(default, Mapping | tuple):  # mutable in a Config: a fresh one per instance
            plain = dict if isinstance(default, Mapping) else list
            value = pydantic.Field(
                default_factory=lambda d=default, p=plain: p(d), description=description
            )
        else:
            value = pydantic.Field(default, description=description)
        fields[f.name] = (annotation, value)
    return fields


def config_class(name: str, cls: type, base: type, nested: Mapping[type, type]) -> type:
    return pydantic.create_model(
        name, __base__=base, __doc__=cls.__doc__, __module__=__name__, **_config_fields(cls, nested)
    )


def settings_dict(config: pydantic.BaseModel, settings: type) -> dict[str, Any]:
    """The fields of `settings` read off a derived config object, nested ones as dicts."""
    return {f.name: _dump(getattr(config, f.name)) for f in dataclasses.fields(settings)}


def _dump(value: Any) -> Any:
    return value.model_dump() if isinstance(value, pydantic.BaseModel) else value
