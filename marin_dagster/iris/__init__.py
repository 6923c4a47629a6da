"""Iris: resource requests on assets and the launchers that place steps on hardware.

Nothing here imports Dagster; the executor lives in `marin_dagster.iris.executor`.
"""

from marin_dagster.iris.placement import iris_placement_metadata
from marin_dagster.iris.processes import exit_as_preempted
from marin_dagster.iris.resource_config import (
    GPU_TYPES,
    K8S_CONFIG_TAG,
    RESOURCES_TAG,
    TPU_GENERATIONS,
    CpuConfig,
    DeviceConfig,
    GpuConfig,
    ResourceConfig,
    ResourceConfigError,
    TpuConfig,
)

__all__ = [
    "GPU_TYPES",
    "K8S_CONFIG_TAG",
    "RESOURCES_TAG",
    "TPU_GENERATIONS",
    "CpuConfig",
    "DeviceConfig",
    "GpuConfig",
    "ResourceConfig",
    "ResourceConfigError",
    "TpuConfig",
    "exit_as_preempted",
    "iris_placement_metadata",
]
