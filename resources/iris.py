"""IrisResource: where accelerator steps run, and the executor configured from the same settings.

    iris = IrisResource(launcher="local", inventory=IrisInventory(gpus=["0", "1"]))
    defs = dg.Definitions(assets=..., resources={"iris": iris}, executor=iris.executor())

Its fields are derived from `marin_dagster.iris.settings` (as the executor's config schema
is), so every Iris setting can be set here, with the same name, default and description.
Assets add `iris_placement_metadata()` (or `iris.placement_metadata()`) to their metadata to
record what they asked for, what they were given and where they ran.
"""

from __future__ import annotations

import os
from typing import Any

import dagster as dg

from marin_dagster.iris.executor import iris_executor
from marin_dagster.iris.placement import iris_placement_metadata
from marin_dagster.iris.settings import InventorySettings, IrisSettings, KubernetesSettings
from resources.derive import config_class, settings_dict

IrisInventory = config_class("IrisInventory", InventorySettings, dg.Config, {})
IrisKubernetes = config_class("IrisKubernetes", KubernetesSettings, dg.Config, {})
_IrisFields = config_class(
    "_IrisFields",
    IrisSettings,
    dg.ConfigurableResource,
    {InventorySettings: IrisInventory, KubernetesSettings: IrisKubernetes},
)


class IrisResource(_IrisFields):
    """Iris settings: launcher ("local" | "kubernetes"), local inventory, k8s, retry limits."""

    @staticmethod
    def from_env() -> IrisResource:
        """MARIN_IRIS_LAUNCHER / _IMAGE / _NAMESPACE / _SERVICE_ACCOUNT / _GPUS (comma list) /
        _GPU_TYPE (of the listed GPUs: a step asking for another type is refused)."""
        gpus = os.environ.get("MARIN_IRIS_GPUS")
        return IrisResource(
            launcher=os.environ.get("MARIN_IRIS_LAUNCHER", "local"),
            inventory=IrisInventory(
                gpus=[g for g in gpus.split(",") if g] if gpus is not None else None,
                gpu_type=os.environ.get("MARIN_IRIS_GPU_TYPE") or None,
            ),
            kubernetes=IrisKubernetes(
                image=os.environ.get("MARIN_IRIS_IMAGE") or None,
                namespace=os.environ.get("MARIN_IRIS_NAMESPACE", "default"),
                service_account_name=os.environ.get("MARIN_IRIS_SERVICE_ACCOUNT") or None,
            ),
        )

    def settings(self) -> IrisSettings:
        return IrisSettings.from_dict(settings_dict(self, IrisSettings))

    def executor_config(self) -> dict[str, Any]:
        """This resource as `iris_executor` config (the `execution: config:` block)."""
        # Fails here, with the field named, rather than at the first run.
        return self.settings().to_dict()

    def executor(self) -> dg.ExecutorDefinition:
        """`iris_executor` configured with these settings, for `Definitions(executor=...)`."""
        return iris_executor.configured(self.executor_config(), name="iris")

    def placement_metadata(self) -> dict[str, str]:
        return iris_placement_metadata()
