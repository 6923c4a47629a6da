"""Iris's settings, declared once (no Dagster here).

The executor's config schema (`iris/executor.py`) and `IrisResource` (`resources/iris.py`)
are both derived from these dataclasses (`marin_dagster/settings.py`), field by field, so a setting added here is
reachable from either and the two cannot drift. A field's description is its `metadata`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marin_dagster.iris.inventory import LocalInventory
from marin_dagster.iris.resource_config import ResourceConfigError
from marin_dagster.settings import setting, settings_fields, unwrap_optional

LAUNCHERS = ("local", "kubernetes")


@dataclass(frozen=True)
class InventorySettings:
    """The local launcher's devices. Leave both lists unset to detect them."""

    gpus: tuple[str, ...] | None = setting(
        None, "GPU ids (CUDA_VISIBLE_DEVICES values); unset: detected with nvidia-smi -L"
    )
    gpu_type: str | None = setting(None, "GPU type of the listed GPUs, e.g. 'h100'")
    tpu_chips: tuple[str, ...] | None = setting(
        None, "TPU chip ids (/dev/accelN); unset: detected from /dev/accel*"
    )
    tpu_type: str | None = setting(None, "TPU generation of the listed chips, e.g. 'v5e'")

    def local_inventory(self) -> LocalInventory:
        return LocalInventory.from_config(
            gpus=None if self.gpus is None else list(self.gpus),
            gpu_type=self.gpu_type,
            tpu_chips=None if self.tpu_chips is None else list(self.tpu_chips),
            tpu_type=self.tpu_type,
        )


@dataclass(frozen=True)
class KubernetesSettings:
    """Where and how accelerator step Jobs run (used when the instance has no K8sRunLauncher)."""

    image: str | None = setting(
        None, "Image of step pods; default: the run launcher's / code location's image"
    )
    namespace: str = setting("default", "Namespace of step Jobs")
    service_account_name: str | None = setting(
        None, "Kubernetes service account (bind it to a GCP one with Workload Identity)"
    )
    image_pull_policy: str = setting("IfNotPresent", "imagePullPolicy of step pods")
    env_config_maps: tuple[str, ...] = setting(
        (), "ConfigMaps whose keys all become env vars (envFrom)"
    )
    env_secrets: tuple[str, ...] = setting((), "Secrets whose keys all become env vars (envFrom)")
    secret_env: Mapping[str, str] = setting(
        description="ENV_NAME -> 'secret-name:key' (valueFrom.secretKeyRef)", default_factory=dict
    )
    env: Mapping[str, str] = setting(
        description="Plain, non-secret env values for step pods", default_factory=dict
    )
    volumes: tuple[Mapping[str, Any], ...] = setting((), "Pod volumes (Kubernetes volume specs)")
    volume_mounts: tuple[Mapping[str, Any], ...] = setting((), "Container volume mounts")
    labels: Mapping[str, str] = setting(
        description="Extra labels on step Jobs and pods", default_factory=dict
    )
    ttl_seconds_after_finished: int = setting(600, "How long finished step Jobs are kept")
    dagster_home: str = setting(
        "/opt/dagster/dagster_home", "DAGSTER_HOME of step pods (the Dagster Helm chart's default)"
    )
    postgres_password_secret: str | None = setting(
        "dagster-postgresql-secret", "Secret holding the run storage's Postgres password"
    )
    load_incluster_config: bool = setting(True, "Use the pod's service account to reach the API")
    kubeconfig_file: str | None = setting(None, "kubeconfig to use when not in the cluster")
    require_shared_instance: bool = setting(
        True, "Refuse an instance only this host can read (step pods write events to it)"
    )
    coordinator_port: int = setting(
        8476, "Port of process 0's jax.distributed coordinator in a multi-host step's Job"
    )
    step_k8s_config: Mapping[str, Any] = setting(
        description="Raw dagster-k8s config merged into every step Job "
        "(UserDefinedDagsterK8sConfig fields)",
        default_factory=dict,
    )

    def secret_env_vars(self) -> list[dict[str, Any]]:
        env = []
        for name, ref in sorted(self.secret_env.items()):
            secret, sep, key = ref.partition(":")
            if not sep or not secret or not key:
                raise ResourceConfigError(
                    f"kubernetes.secret_env[{name!r}]={ref!r}: write 'secret-name:key' "
                    f"(the Kubernetes Secret and the key inside it)"
                )
            env.append(
                {"name": name, "value_from": {"secret_key_ref": {"name": secret, "key": key}}}
            )
        return env


@dataclass(frozen=True)
class IrisSettings:
    """Everything the Iris executor is configured with."""

    launcher: str = setting("local", "Where accelerator steps run: 'local' or 'kubernetes'")
    max_concurrent: int | None = setting(None, "CPU step subprocesses at once (default: CPU count)")
    inventory: InventorySettings = setting(
        description="Local devices; detected (nvidia-smi -L, /dev/accel*) when none are listed",
        default_factory=InventorySettings,
    )
    lease_dir: str | None = setting(
        None, "Directory of device lease files shared by the host's runs"
    )
    max_retries_preemption: int = setting(
        10, "Retries of a step whose process was preempted (SIGTERM, eviction, node lost)"
    )
    max_retries_failure: int = setting(
        0, "Retries of a step whose process died without reporting for another reason"
    )
    termination_grace_seconds: float = setting(
        10.0, "Seconds between SIGINT and SIGKILL when a run is terminated"
    )
    check_step_health_interval_seconds: int = setting(
        1, "How often step processes are checked (and queued steps started)"
    )
    sleep_seconds: float = setting(0.5, "How long the executor sleeps between event polls")
    kubernetes: KubernetesSettings = setting(
        description="Step Jobs on Kubernetes (GKE); see docs/operations.md",
        default_factory=KubernetesSettings,
    )

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ResourceConfigError(
                f"Iris launcher={self.launcher!r}; choose one of {', '.join(LAUNCHERS)}"
            )
        for name in ("max_retries_preemption", "max_retries_failure"):
            if getattr(self, name) < 0:
                raise ResourceConfigError(f"Iris {name}={getattr(self, name)} must be >= 0")
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ResourceConfigError(f"Iris max_concurrent={self.max_concurrent} must be >= 1")

    @property
    def cpu_slots(self) -> int:
        return self.max_concurrent or os.cpu_count() or 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (lists, dicts): the executor's config block for these settings."""
        return _plain(self)

    @staticmethod
    def from_dict(config: Mapping[str, Any]) -> IrisSettings:
        """From a (possibly partial) config dict; an unknown key is an error naming it."""
        return settings_from_dict(IrisSettings, config)


def settings_from_dict(cls: type, data: Mapping[str, Any], where: str = "") -> Any:
    known = {f.name: tp for f, tp in settings_fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ResourceConfigError(
            f"unknown Iris setting(s) {[where + k for k in unknown]}; known: {sorted(known)}"
        )
    values = {}
    for name, value in data.items():
        tp, _ = unwrap_optional(known[name])
        if value is not None and dataclasses.is_dataclass(tp):
            value = settings_from_dict(tp, value, f"{where}{name}.")
        elif isinstance(value, list):
            value = tuple(value)
        values[name] = value
    return cls(**values)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value
