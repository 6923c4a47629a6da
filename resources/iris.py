"""IrisResource: where accelerator steps run, and the executor configured from the same settings.

    iris = IrisResource(launcher="local", inventory=IrisInventory(gpus=["0", "1"]))
    defs = dg.Definitions(assets=..., resources={"iris": iris}, executor=iris.executor())

Its fields are derived from `marin_dagster.iris.settings` (as the executor's config schema
is), so every Iris setting can be set here, with the same name, default and description.
Assets add `iris_placement_metadata()` (or `iris.placement_metadata()`) to their metadata to
record what they asked for, what they were given and where they ran.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from typing import Any

import dagster as dg
import pydantic

from marin_dagster.iris.executor import iris_executor
from marin_dagster.iris.placement import iris_placement_metadata
from marin_dagster.iris.settings import (
    InventorySettings,
    IrisSettings,
    KubernetesSettings,
    field_default,
    settings_fields,
    unwrap_optional,
)


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
            value = pydantic.Field(default_factory=lambda d=default, p=plain: p(d),
                                   description=description)
        else:
            value = pydantic.Field(default, description=description)
        fields[f.name] = (annotation, value)
    return fields


def _config_class(name: str, cls: type, base: type, nested: Mapping[type, type]) -> type:
    return pydantic.create_model(name, __base__=base, __doc__=cls.__doc__,
                                 __module__=__name__, **_config_fields(cls, nested))


IrisInventory = _config_class("IrisInventory", InventorySettings, dg.Config, {})
IrisKubernetes = _config_class("IrisKubernetes", KubernetesSettings, dg.Config, {})
_IrisFields = _config_class("_IrisFields", IrisSettings, dg.ConfigurableResource,
                            {InventorySettings: IrisInventory, KubernetesSettings: IrisKubernetes})


class IrisResource(_IrisFields):
    """Iris settings: launcher ("local" | "kubernetes"), local inventory, k8s, retry limits."""

    @staticmethod
    def from_env() -> IrisResource:
        """MARIN_IRIS_LAUNCHER / _IMAGE / _NAMESPACE / _SERVICE_ACCOUNT / _GPUS (comma list)."""
        gpus = os.environ.get("MARIN_IRIS_GPUS")
        return IrisResource(
            launcher=os.environ.get("MARIN_IRIS_LAUNCHER", "local"),
            inventory=IrisInventory(gpus=[g for g in gpus.split(",") if g] if gpus is not None else None),
            kubernetes=IrisKubernetes(
                image=os.environ.get("MARIN_IRIS_IMAGE") or None,
                namespace=os.environ.get("MARIN_IRIS_NAMESPACE", "default"),
                service_account_name=os.environ.get("MARIN_IRIS_SERVICE_ACCOUNT") or None,
            ),
        )

    def settings(self) -> IrisSettings:
        return IrisSettings.from_dict(self._settings_dict())

    def _settings_dict(self) -> dict[str, Any]:
        return {f.name: _dump(getattr(self, f.name)) for f in dataclasses.fields(IrisSettings)}

    def executor_config(self) -> dict[str, Any]:
        """This resource as `iris_executor` config (the `execution: config:` block)."""
        # Fails here, with the field named, rather than at the first run.
        return self.settings().to_dict()

    def executor(self) -> dg.ExecutorDefinition:
        """`iris_executor` configured with these settings, for `Definitions(executor=...)`."""
        return iris_executor.configured(self.executor_config(), name="iris")

    def placement_metadata(self) -> dict[str, str]:
        return iris_placement_metadata()


def _dump(value: Any) -> Any:
    return value.model_dump() if isinstance(value, pydantic.BaseModel) else value
