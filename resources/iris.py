"""IrisResource: where accelerator steps run, and the executor configured from the same settings.

    iris = IrisResource(launcher="local", inventory=IrisInventory(gpus=["0", "1"]))
    defs = dg.Definitions(assets=..., resources={"iris": iris}, executor=iris.executor())

Assets add `iris_placement_metadata()` (or `iris.placement_metadata()`) to their metadata to
record what they asked for, what they were given and where they ran.
"""

from __future__ import annotations

import os
from typing import Any

import dagster as dg
from pydantic import Field

from marin_dagster.iris.executor import IrisSettings, iris_executor
from marin_dagster.iris.placement import iris_placement_metadata


class IrisInventory(dg.Config):
    """The local launcher's devices. Leave both lists unset to detect them (nvidia-smi -L)."""

    gpus: list[str] | None = None
    gpu_type: str | None = None
    tpu_chips: list[str] | None = None
    tpu_type: str | None = None


class IrisKubernetes(dg.Config):
    """Step Jobs on Kubernetes (GKE); see docs/operations.md."""

    image: str | None = None
    namespace: str = "default"
    service_account_name: str | None = None
    image_pull_policy: str = "IfNotPresent"
    env_config_maps: list[str] = Field(default_factory=list)
    env_secrets: list[str] = Field(default_factory=list)
    secret_env: dict[str, str] = Field(
        default_factory=dict, description="ENV_NAME -> 'secret-name:key' (secretKeyRef)"
    )
    env: dict[str, str] = Field(default_factory=dict, description="plain, non-secret values")
    volumes: list[dict[str, Any]] = Field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    ttl_seconds_after_finished: int = 600
    dagster_home: str = "/opt/dagster/dagster_home"
    postgres_password_secret: str | None = "dagster-postgresql-secret"
    load_incluster_config: bool = True
    kubeconfig_file: str | None = None
    require_shared_instance: bool = True


class IrisResource(dg.ConfigurableResource):
    """Iris settings: launcher ("local" | "kubernetes"), local inventory, k8s, retry limits."""

    launcher: str = "local"
    max_concurrent: int | None = None
    inventory: IrisInventory = Field(default_factory=IrisInventory)
    lease_dir: str | None = None
    max_retries_preemption: int = 10
    max_retries_failure: int = 0
    termination_grace_seconds: float = 10.0
    check_step_health_interval_seconds: int = 1
    kubernetes: IrisKubernetes = Field(default_factory=IrisKubernetes)

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

    def executor_config(self) -> dict[str, Any]:
        """This resource as `iris_executor` config (the `execution: config:` block)."""
        config: dict[str, Any] = {
            "launcher": self.launcher,
            "max_concurrent": self.max_concurrent,
            "inventory": {
                "gpus": self.inventory.gpus,
                "gpu_type": self.inventory.gpu_type,
                "tpu_chips": self.inventory.tpu_chips,
                "tpu_type": self.inventory.tpu_type,
            },
            "lease_dir": self.lease_dir,
            "max_retries_preemption": self.max_retries_preemption,
            "max_retries_failure": self.max_retries_failure,
            "termination_grace_seconds": float(self.termination_grace_seconds),
            "check_step_health_interval_seconds": self.check_step_health_interval_seconds,
            "kubernetes": self.kubernetes.model_dump(),
        }
        # Fails here, with the field named, rather than at the first run.
        IrisSettings.from_config(config)
        return config

    def settings(self) -> IrisSettings:
        return IrisSettings.from_config(self.executor_config())

    def executor(self) -> dg.ExecutorDefinition:
        """`iris_executor` configured with these settings, for `Definitions(executor=...)`."""
        return iris_executor.configured(self.executor_config(), name="iris")

    def placement_metadata(self) -> dict[str, str]:
        return iris_placement_metadata()
