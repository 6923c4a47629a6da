"""What a step asks for: CPU, memory, disk and an optional accelerator (Marin's ResourceConfig).

A `ResourceConfig` is written as a short string on each asset (`resources="gpu:h100x8"`),
travels in the asset's op tags (`marin/resources`, read by the Iris executor and shown in the
UI) and, for Kubernetes, as a `dagster-k8s/config` tag with limits, node selectors and
tolerations. This module has no Dagster import: factories and launchers both use it.

String grammar (a device part, then optional `key=value` options separated by spaces):

    cpu | cpu:4                      CPU only (4 cores)
    gpu | gpu:2                      GPUs of any type (1, 2)
    gpu:h100 | gpu:h100x8            a known GPU type, times a count
    tpu:v5e-8 | tpu:v6e-4 | tpu:v4-8 a TPU slice by Cloud TPU name
    gpu:h100x8 cpu=32 ram=256g disk=200g preemptible=false replicas=1
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from marin_dagster.settings import parse_bool
from marin_dagster.words import checked_keywords

RESOURCES_TAG = "marin/resources"
K8S_CONFIG_TAG = "dagster-k8s/config"

# GKE's `cloud.google.com/gke-accelerator` label value for each GPU type we know.
GPU_TYPES: dict[str, str] = {
    "t4": "nvidia-tesla-t4",
    "v100": "nvidia-tesla-v100",
    "l4": "nvidia-l4",
    "a100": "nvidia-tesla-a100",
    "a100-80gb": "nvidia-a100-80gb",
    "h100": "nvidia-h100-80gb",
    "h100-mega": "nvidia-h100-mega-80gb",
    "h200": "nvidia-h200-141gb",
    "b200": "nvidia-b200",
}
ANY_GPU = "any"

# The most GPUs of a type one host carries (GCE machine types: n1 with 4 T4s, a2-megagpu-16g
# with 16 A100s, 8 on the others). More is several hosts: replicas=.
GPUS_PER_HOST: dict[str, int] = {"t4": 4, "a100": 16, ANY_GPU: 16}
_GPUS_PER_HOST_ELSE = 8


@dataclass(frozen=True)
class TpuGeneration:
    """How one TPU generation is named and packed (Cloud TPU docs, GKE TPU docs)."""

    gke_accelerator: str  # cloud.google.com/gke-tpu-accelerator
    cores_per_chip_in_name: int  # v4-8 counts TensorCores (2 per chip); v5e-8 counts chips
    chips_per_host: int  # hosts in a multi-host slice each carry this many chips
    max_single_host_chips: int
    dims: int  # 3-D torus (v4, v5p) or 2-D (v5e, v6e)


TPU_GENERATIONS: dict[str, TpuGeneration] = {
    "v4": TpuGeneration("tpu-v4-podslice", 2, 4, 4, 3),
    "v5p": TpuGeneration("tpu-v5p-slice", 2, 4, 4, 3),
    "v5e": TpuGeneration("tpu-v5-lite-podslice", 1, 4, 8, 2),
    "v6e": TpuGeneration("tpu-v6e-slice", 1, 4, 8, 2),
}
_TPU_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e"}


class ResourceConfigError(ValueError):
    """A resource string or request that cannot be satisfied as written."""


@dataclass(frozen=True)
class CpuConfig:
    """No accelerator."""

    kind: str = field(default="cpu", init=False)

    @property
    def count(self) -> int:
        return 0

    def spec(self) -> str:
        return "cpu"


@dataclass(frozen=True)
class GpuConfig:
    """`count` GPUs of one type (`variant` "any" accepts whatever the host has)."""

    variant: str = ANY_GPU
    count: int = 1
    kind: str = field(default="gpu", init=False)

    def __post_init__(self) -> None:
        if self.variant != ANY_GPU and self.variant not in GPU_TYPES:
            raise ResourceConfigError(
                f"unknown GPU type {self.variant!r}; known GPU types: {', '.join(GPU_TYPES)} "
                f"(or 'gpu:N' for N GPUs of any type)"
            )
        if self.count < 1:
            raise ResourceConfigError(f"GPU count must be at least 1, got {self.count}")
        most = GPUS_PER_HOST.get(self.variant, _GPUS_PER_HOST_ELSE)
        if self.count > most:
            kind = "GPUs" if self.variant == ANY_GPU else f"{self.variant.upper()} GPUs"
            whole = dataclasses.replace(self, count=most).spec()
            raise ResourceConfigError(
                f"{self.spec()} is more than one host holds (at most {most} {kind}); ask for "
                f"whole hosts with replicas=, e.g. '{whole} replicas={-(-self.count // most)}'"
            )

    def spec(self) -> str:
        if self.variant == ANY_GPU:
            return f"gpu:{self.count}"
        return f"gpu:{self.variant}" + (f"x{self.count}" if self.count != 1 else "")


@dataclass(frozen=True)
class TpuConfig:
    """A TPU slice by its Cloud TPU name, e.g. variant "v5e-8" (8 chips), "v4-8" (4 chips)."""

    variant: str
    kind: str = field(default="tpu", init=False)

    def __post_init__(self) -> None:
        generation, size = _split_tpu(self.variant)
        gen = TPU_GENERATIONS[generation]
        if size < 1:
            raise ResourceConfigError(
                f"TPU {self.variant!r}: a slice has at least one chip; write e.g. "
                f"tpu:{generation}-{gen.cores_per_chip_in_name * 4}"
            )
        if size % gen.cores_per_chip_in_name:
            raise ResourceConfigError(
                f"TPU {self.variant!r}: size must be a multiple of {gen.cores_per_chip_in_name}"
            )
        chips = size // gen.cores_per_chip_in_name
        if chips & (chips - 1):
            raise ResourceConfigError(
                f"TPU {self.variant!r}: {chips} chips is not a power of two; "
                f"valid slices look like tpu:{generation}-{gen.cores_per_chip_in_name * 4}"
            )
        # Canonical name (aliases such as v5litepod-8 become v5e-8).
        object.__setattr__(self, "variant", f"{generation}-{size}")

    @property
    def generation(self) -> str:
        return _split_tpu(self.variant)[0]

    @property
    def chips(self) -> int:
        generation, size = _split_tpu(self.variant)
        return size // TPU_GENERATIONS[generation].cores_per_chip_in_name

    @property
    def count(self) -> int:
        return self.chips

    @property
    def hosts(self) -> int:
        gen = TPU_GENERATIONS[self.generation]
        if self.chips <= gen.max_single_host_chips:
            return 1
        return self.chips // gen.chips_per_host

    @property
    def chips_per_host(self) -> int:
        return self.chips // self.hosts

    @property
    def topology(self) -> str:
        """GKE's `cloud.google.com/gke-tpu-topology` for this slice (e.g. 2x4, 2x2x2)."""
        return "x".join(
            str(d) for d in tpu_topology(self.chips, TPU_GENERATIONS[self.generation].dims)
        )

    def spec(self) -> str:
        return f"tpu:{self.variant}"


DeviceConfig = CpuConfig | GpuConfig | TpuConfig


def tpu_topology(chips: int, dims: int) -> tuple[int, ...]:
    """Chip grid of a slice as Cloud TPU names it: 2x4 (v5e-8), 2x2x1 (v4-8), 2x2x4 (16 chips)."""
    n = chips.bit_length() - 1
    if dims == 2:
        a = 2 ** (n // 2)
        return (a, chips // a)
    if chips == 4:
        return (2, 2, 1)
    base, extra = divmod(n, 3)
    shape = [2**base] * 3
    for axis in range(3 - extra, 3):
        shape[axis] *= 2
    return tuple(shape)


def _split_tpu(variant: str) -> tuple[str, int]:
    m = re.fullmatch(r"([a-z0-9]+)-(\d+)", variant.strip().lower())
    generation = _TPU_ALIASES.get(m.group(1), m.group(1)) if m else None
    if not m or generation not in TPU_GENERATIONS:
        raise ResourceConfigError(
            f"unknown TPU type {variant!r}; known TPU generations: "
            f"{', '.join(TPU_GENERATIONS)} (write e.g. tpu:v5e-8, tpu:v6e-4, tpu:v4-8)"
        )
    return generation, int(m.group(2))


_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}


def parse_bytes(value: str | int, what: str = "size") -> int:
    """ "4g", "512Mi", "16GB", 1024 -> bytes (binary units: Marin's ram="16g" means GiB)."""
    if isinstance(value, int):
        return value
    m = _QUANTITY.match(str(value))
    if not m:
        raise ResourceConfigError(
            f"{what}={value!r} is not a size; write e.g. {what}=16g, {what}=512m or {what}=2Ti"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def k8s_quantity(n_bytes: int) -> str:
    for suffix, unit in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n_bytes % unit == 0 and n_bytes >= unit:
            return f"{n_bytes // unit}{suffix}"
    return str(n_bytes)


def _short_size(n_bytes: int) -> str:
    for suffix, unit in (("t", 2**40), ("g", 2**30), ("m", 2**20), ("k", 2**10)):
        if n_bytes % unit == 0 and n_bytes >= unit:
            return f"{n_bytes // unit}{suffix}"
    # An explicit unit, as a size without one is refused (ResourceConfig round-trips).
    return f"{n_bytes}b"


def _has_unit(value: str | int) -> bool:
    m = _QUANTITY.match(str(value))
    return bool(m and (m.group(2) or m.group(3).lower().endswith("b")))


def _fmt_cpu(cpu: float) -> str:
    return str(int(cpu)) if float(cpu).is_integer() else repr(float(cpu))


@checked_keywords
@dataclass(frozen=True)
class ResourceConfig:
    """What one step needs. `ram`/`disk` accept "16g"-style sizes.

    `replicas` > 1 runs the step as that many processes, each with the device request (one
    host each: `gpu:h100x8 replicas=2` is 2 hosts of 8 GPUs), joined by `jax.distributed`; a
    multi-host TPU slice (`tpu:v5e-16` and up) runs one process per host of the slice.
    """

    cpu: float = 1
    ram: str = "4g"
    disk: str = "10g"
    device: DeviceConfig = field(default_factory=CpuConfig)
    preemptible: bool = True
    replicas: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.device, CpuConfig | GpuConfig | TpuConfig):
            raise ResourceConfigError(
                f"device must be CpuConfig(), GpuConfig(...) or TpuConfig(...), got {self.device!r}"
            )
        if not (isinstance(self.cpu, int | float) and self.cpu > 0 and math.isfinite(self.cpu)):
            raise ResourceConfigError(f"cpu={self.cpu!r} must be a positive number of cores")
        # Normalized so equal requests compare and print equal.
        for what in ("ram", "disk"):
            size = parse_bytes(getattr(self, what), what)
            if size <= 0:
                raise ResourceConfigError(
                    f"{what}={getattr(self, what)!r} must be more than nothing; write e.g. "
                    f"{what}={'4g' if what == 'ram' else '10g'}"
                )
            if not _has_unit(getattr(self, what)):
                # Marin's sizes are "16g"; a bare 16 as bytes gives a pod killed at once.
                raise ResourceConfigError(
                    f"{what}={getattr(self, what)!r} has no unit; give one, e.g. "
                    f"{what}={'16g' if what == 'ram' else '200g'} (units k, m, g, t; b for bytes)"
                )
            object.__setattr__(self, what, _short_size(size))
        if (
            not isinstance(self.replicas, int)
            or isinstance(self.replicas, bool)
            or self.replicas < 1
        ):
            raise ResourceConfigError(f"replicas={self.replicas!r} must be a positive integer")
        if self.replicas > 1 and isinstance(self.device, CpuConfig):
            # Refused here, not at launch: no launcher could ever run it, whatever the machine.
            raise ResourceConfigError(
                f"replicas={self.replicas} asks for {self.replicas} accelerator hosts "
                f"(multi-host), but this step is CPU-only and runs as one process: drop "
                f"replicas=, or ask for more cores with cpu=N"
            )
        if self.replicas > 1 and isinstance(self.device, TpuConfig):
            # Several slices over the data-center network (multislice): no launcher runs it.
            gen = TPU_GENERATIONS[self.device.generation]
            bigger = self.device.chips * self.replicas * gen.cores_per_chip_in_name
            raise ResourceConfigError(
                f"replicas={self.replicas} asks for {self.replicas} TPU slices (multislice), "
                f"which no launcher runs: ask for one bigger slice instead, "
                f"tpu:{self.device.generation}-{bigger} (its hosts run as one step's processes)"
            )

    # -- constructors -------------------------------------------------------------------

    # Marin's spellings, so experiment files written for Marin run unchanged.
    @staticmethod
    def with_cpu(
        cpu: float = 1, ram: str = "4g", disk: str = "10g", preemptible: bool = True
    ) -> ResourceConfig:
        return ResourceConfig(cpu=cpu, ram=ram, disk=disk, preemptible=preemptible)

    @staticmethod
    def with_gpu(
        gpu_type: str = ANY_GPU,
        count: int = 1,
        *,
        cpu: float = 1,
        ram: str = "4g",
        disk: str = "10g",
        preemptible: bool = True,
        replicas: int = 1,
    ) -> ResourceConfig:
        return ResourceConfig(
            cpu=cpu,
            ram=ram,
            disk=disk,
            device=GpuConfig(gpu_type.lower(), count),
            preemptible=preemptible,
            replicas=replicas,
        )

    @staticmethod
    def with_tpu(
        tpu_type: str,
        *,
        cpu: float = 1,
        ram: str = "4g",
        disk: str = "10g",
        preemptible: bool = True,
    ) -> ResourceConfig:
        return ResourceConfig(
            cpu=cpu, ram=ram, disk=disk, device=TpuConfig(tpu_type.lower()), preemptible=preemptible
        )

    @staticmethod
    def parse(value: str | ResourceConfig) -> ResourceConfig:
        """Parse "cpu", "cpu:4", "gpu:1", "gpu:h100x8", "tpu:v5e-8" (+ "key=value" options)."""
        if isinstance(value, ResourceConfig):
            return value
        try:
            return ResourceConfig._parse(value)
        except ResourceConfigError as e:
            if str(e).startswith("resources="):
                raise
            raise ResourceConfigError(f"resources={value!r}: {e}") from None

    @staticmethod
    def _parse(value: str) -> ResourceConfig:
        if not isinstance(value, str) or not value.strip():
            raise ResourceConfigError(
                f"resources={value!r}: expected a string like 'cpu', 'cpu:4', 'gpu:h100x8' or 'tpu:v5e-8'"
            )
        head, *options = value.strip().split()
        kwargs: dict[str, Any] = {}
        kind, _, arg = head.lower().partition(":")
        if kind == "cpu":
            if arg:
                kwargs["cpu"] = _parse_number(arg, value, "cpu")
            device: DeviceConfig = CpuConfig()
        elif kind == "gpu":
            device = _parse_gpu(arg, value)
        elif kind == "tpu":
            if not arg:
                raise ResourceConfigError(
                    f"resources={value!r}: name the TPU slice, e.g. tpu:v5e-8 or tpu:v6e-4"
                )
            device = TpuConfig(arg)
        else:
            raise ResourceConfigError(
                f"resources={value!r}: unknown device {kind!r}; write cpu[:N], gpu[:TYPE[xN]|:N] "
                f"or tpu:TYPE-SIZE (GPU types: {', '.join(GPU_TYPES)}; TPU generations: "
                f"{', '.join(TPU_GENERATIONS)})"
            )
        for option in options:
            key, eq, raw = option.partition("=")
            if not eq or key not in ("cpu", "ram", "disk", "preemptible", "replicas"):
                raise ResourceConfigError(
                    f"resources={value!r}: option {option!r} is not one of cpu=N, ram=SIZE, "
                    f"disk=SIZE, preemptible=true|false, replicas=N"
                )
            if key in kwargs:
                # Keeping either value silently would hide a typo; `cpu:4 cpu=8` counts too.
                raise ResourceConfigError(
                    f"resources={value!r}: {key} is given more than once; keep one {key}="
                )
            if key == "cpu":
                kwargs["cpu"] = _parse_number(raw, value, "cpu")
            elif key == "replicas":
                replicas = _parse_number(raw, value, "replicas")
                if not isinstance(replicas, int):
                    raise ResourceConfigError(
                        f"resources={value!r}: replicas={raw} is not a whole number of hosts; "
                        f"write e.g. replicas=2"
                    )
                kwargs["replicas"] = replicas
            elif key == "preemptible":
                try:
                    kwargs["preemptible"] = parse_bool(raw)
                except ValueError:
                    raise ResourceConfigError(
                        f"resources={value!r}: preemptible must be true or false"
                    ) from None
            else:
                kwargs[key] = raw
        return ResourceConfig(device=device, **kwargs)

    # -- views ----------------------------------------------------------------------------

    @property
    def needs_accelerator(self) -> bool:
        return not isinstance(self.device, CpuConfig)

    @property
    def accelerator_count(self) -> int:
        """GPUs or TPU chips per replica (0 for CPU)."""
        return self.device.count

    @property
    def num_processes(self) -> int:
        """Processes (one per host) the step runs as: GPU replicas, or a TPU slice's hosts."""
        if isinstance(self.device, TpuConfig):
            return self.device.hosts * self.replicas
        return self.replicas

    @property
    def ram_bytes(self) -> int:
        return parse_bytes(self.ram)

    @property
    def disk_bytes(self) -> int:
        return parse_bytes(self.disk)

    def to_string(self) -> str:
        """The canonical string; `ResourceConfig.parse(rc.to_string()) == rc`."""
        default = ResourceConfig()
        if isinstance(self.device, CpuConfig):
            parts = ["cpu" if self.cpu == 1 else f"cpu:{_fmt_cpu(self.cpu)}"]
        else:
            parts = [self.device.spec()]
            if self.cpu != default.cpu:
                parts.append(f"cpu={_fmt_cpu(self.cpu)}")
        if self.ram != default.ram:
            parts.append(f"ram={self.ram}")
        if self.disk != default.disk:
            parts.append(f"disk={self.disk}")
        if self.preemptible != default.preemptible:
            parts.append(f"preemptible={str(self.preemptible).lower()}")
        if self.replicas != default.replicas:
            parts.append(f"replicas={self.replicas}")
        return " ".join(parts)

    def __str__(self) -> str:
        return self.to_string()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # -- op tags ----------------------------------------------------------------------------

    def to_op_tags(self) -> dict[str, str]:
        """Tags for an asset's `op_tags`: the Iris request and the per-step dagster-k8s config.

        Per-step k8s config must be in op_tags; job-level tags don't reach step pods
        (dagster#20429).
        """
        return {
            RESOURCES_TAG: self.to_string(),
            K8S_CONFIG_TAG: json.dumps(self.k8s_config(), sort_keys=True),
        }

    @staticmethod
    def from_op_tags(tags: dict[str, Any] | None) -> ResourceConfig:
        """The request in a step's tags; a step without the tag needs one CPU."""
        value = (tags or {}).get(RESOURCES_TAG)
        if value is None:
            return ResourceConfig()
        return ResourceConfig.parse(value)

    def k8s_config(self) -> dict[str, Any]:
        """dagster-k8s `UserDefinedDagsterK8sConfig` fields for a pod running this request."""
        requests = {
            "cpu": _fmt_cpu(self.cpu),
            "memory": k8s_quantity(self.ram_bytes),
            "ephemeral-storage": k8s_quantity(self.disk_bytes),
        }
        limits: dict[str, str] = {"memory": k8s_quantity(self.ram_bytes)}
        node_selector: dict[str, str] = {}
        tolerations: list[dict[str, str]] = []
        device = self.device
        if isinstance(device, GpuConfig):
            limits["nvidia.com/gpu"] = str(device.count)
            requests["nvidia.com/gpu"] = str(device.count)
            if device.variant != ANY_GPU:
                node_selector["cloud.google.com/gke-accelerator"] = GPU_TYPES[device.variant]
            # GKE taints GPU nodes nvidia.com/gpu=present:NoSchedule.
            tolerations.append(
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            )
        elif isinstance(device, TpuConfig):
            gen = TPU_GENERATIONS[device.generation]
            limits["google.com/tpu"] = str(device.chips_per_host)
            requests["google.com/tpu"] = str(device.chips_per_host)
            node_selector["cloud.google.com/gke-tpu-accelerator"] = gen.gke_accelerator
            node_selector["cloud.google.com/gke-tpu-topology"] = device.topology
            tolerations.append(
                {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
            )
        pod_spec: dict[str, Any] = {}
        if self.preemptible:
            # May land on Spot/preemptible nodes (Iris retries preemptions).
            tolerations.append(
                {
                    "key": "cloud.google.com/gke-spot",
                    "operator": "Equal",
                    "value": "true",
                    "effect": "NoSchedule",
                }
            )
        else:
            pod_spec["affinity"] = {
                "node_affinity": {
                    "required_during_scheduling_ignored_during_execution": {
                        "node_selector_terms": [
                            {
                                "match_expressions": [
                                    {
                                        "key": "cloud.google.com/gke-spot",
                                        "operator": "DoesNotExist",
                                    },
                                    {
                                        "key": "cloud.google.com/gke-preemptible",
                                        "operator": "DoesNotExist",
                                    },
                                ]
                            }
                        ]
                    }
                }
            }
        if node_selector:
            pod_spec["node_selector"] = node_selector
        if tolerations:
            pod_spec["tolerations"] = tolerations
        return {
            "container_config": {"resources": {"requests": requests, "limits": limits}},
            "pod_spec_config": pod_spec,
        }


def _parse_number(raw: str, whole: str, what: str) -> float:
    try:
        number = float(raw)
    except ValueError:
        raise ResourceConfigError(f"resources={whole!r}: {what}={raw!r} is not a number") from None
    if number <= 0:
        raise ResourceConfigError(f"resources={whole!r}: {what} must be positive, got {raw}")
    return int(number) if number.is_integer() else number


def _parse_gpu(arg: str, whole: str) -> GpuConfig:
    if not arg:
        return GpuConfig()
    if arg.isdigit():
        return GpuConfig(ANY_GPU, int(arg))
    m = re.fullmatch(r"([a-z0-9-]+?)(?:x(\d+))?", arg)
    if not m:
        raise ResourceConfigError(
            f"resources={whole!r}: write gpu:TYPE, gpu:TYPExN or gpu:N (GPU types: {', '.join(GPU_TYPES)})"
        )
    variant, count = m.group(1), int(m.group(2) or 1)
    if variant not in GPU_TYPES:
        raise ResourceConfigError(
            f"resources={whole!r}: unknown GPU type {variant!r}; known GPU types: "
            f"{', '.join(GPU_TYPES)} (or gpu:N for N GPUs of any type)"
        )
    return GpuConfig(variant, count)
