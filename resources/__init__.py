"""Dagster resources exposing the engines, one module per resource."""

from resources.environments import local_resources
from resources.storage import StorageResource

__all__ = ["StorageResource", "local_resources"]
