"""Dagster resources exposing the engines, one module per resource."""

from resources.environments import local_resources
from resources.iris import IrisResource
from resources.levanter import LevanterResource
from resources.storage import StorageResource
from resources.zephyr import ZephyrResource

__all__ = [
    "IrisResource",
    "LevanterResource",
    "StorageResource",
    "ZephyrResource",
    "local_resources",
]
