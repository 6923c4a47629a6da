"""The accelerators of one machine and the leases that keep two steps off one device.

Leases are `flock`s on one file per device under a lease directory shared by every run on the
host, so two runs (or two steps of one run) never hold the same device; the kernel drops a
lease when its holder dies, so a killed run worker leaves no stale lease behind.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field

from marin_dagster.iris.resource_config import (
    ANY_GPU,
    GPU_TYPES,
    TPU_GENERATIONS,
    GpuConfig,
    ResourceConfig,
    ResourceConfigError,
    TpuConfig,
)

logger = logging.getLogger(__name__)

ANY = "any"


@dataclass(frozen=True)
class Device:
    """One GPU or TPU chip; `id` is what CUDA_VISIBLE_DEVICES / TPU_VISIBLE_CHIPS take."""

    kind: str  # "gpu" | "tpu"
    id: str
    variant: str = ANY  # GPU type ("h100") or TPU generation ("v5e"); "any" if unknown

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}"

    def serves(self, request: ResourceConfig) -> bool:
        device = request.device
        if isinstance(device, GpuConfig):
            return self.kind == "gpu" and (
                device.variant == ANY_GPU or self.variant in (ANY, device.variant)
            )
        if isinstance(device, TpuConfig):
            return self.kind == "tpu" and self.variant in (ANY, device.generation)
        return False


@dataclass(frozen=True)
class LocalInventory:
    """The devices the local launcher may hand out."""

    devices: tuple[Device, ...] = ()
    source: str = "configured"

    @staticmethod
    def from_config(
        gpus: list[str] | None = None,
        gpu_type: str | None = None,
        tpu_chips: list[str] | None = None,
        tpu_type: str | None = None,
    ) -> LocalInventory:
        """Configured devices; with neither `gpus` nor `tpu_chips` given, detect them."""
        if gpus is None and tpu_chips is None:
            return LocalInventory.detect()
        if gpu_type is not None and gpu_type not in GPU_TYPES:
            raise ResourceConfigError(
                f"inventory gpu_type={gpu_type!r} is unknown; known GPU types: {', '.join(GPU_TYPES)}"
            )
        if tpu_type is not None and tpu_type not in TPU_GENERATIONS:
            raise ResourceConfigError(
                f"inventory tpu_type={tpu_type!r} is unknown; known TPU generations: "
                f"{', '.join(TPU_GENERATIONS)}"
            )
        devices = [Device("gpu", str(g), gpu_type or ANY) for g in gpus or []]
        devices += [Device("tpu", str(t), tpu_type or ANY) for t in tpu_chips or []]
        ids = [str(d) for d in devices]
        if len(set(ids)) != len(ids):
            raise ResourceConfigError(f"inventory lists a device twice: {ids}")
        return LocalInventory(tuple(devices), "configured")

    @staticmethod
    def detect() -> LocalInventory:
        """GPUs from `nvidia-smi -L`, TPU chips from /dev/accel*; none when neither is found."""
        devices: list[Device] = []
        if shutil.which("nvidia-smi"):
            try:
                out = subprocess.run(
                    ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True
                ).stdout
            except (subprocess.SubprocessError, OSError) as e:
                logger.warning("nvidia-smi -L failed (%s); assuming no GPUs", e)
                out = ""
            devices += parse_nvidia_smi(out)
        accel = sorted(
            (name for name in _listdir("/dev") if re.fullmatch(r"accel\d+", name)),
            key=lambda n: int(n[5:]),
        )
        if accel:
            generation = _tpu_generation_from_env(os.environ.get("TPU_ACCELERATOR_TYPE", ""))
            devices += [Device("tpu", name[5:], generation) for name in accel]
        return LocalInventory(tuple(devices), "detected")

    def count(self, kind: str) -> int:
        return sum(1 for d in self.devices if d.kind == kind)

    def serving(self, request: ResourceConfig) -> list[Device]:
        return [d for d in self.devices if d.serves(request)]

    def check_feasible(self, request: ResourceConfig, step: str) -> None:
        """Raise before launch when this machine can never satisfy `request`."""
        if not request.needs_accelerator:
            return
        device = request.device
        if isinstance(device, TpuConfig) and device.hosts > 1:
            raise ResourceConfigError(
                f"step {step!r} asks for {request}, a slice of {device.hosts} TPU hosts; "
                "the local launcher runs on this one machine: ask for a single-host "
                f"slice (up to {TPU_GENERATIONS[device.generation].max_single_host_chips} "
                f"chips for {device.generation}), or use launcher='kubernetes'"
            )
        # replicas > 1: one process per replica, each with its own `accelerator_count` devices.
        wanted = request.accelerator_count * request.replicas
        usable = self.serving(request)
        if len(usable) < wanted:
            kind = request.device.kind
            have = (
                ", ".join(
                    str(d) + (f" ({d.variant})" if d.variant != ANY else "") for d in self.devices
                )
                or "none"
            )
            raise ResourceConfigError(
                f"step {step!r} asks for {request} ({wanted} {kind.upper()}"
                f"{'s' if wanted != 1 else ''}"
                + (
                    f", {request.accelerator_count} for each of {request.replicas} processes"
                    if request.replicas > 1
                    else ""
                )
                + f") but the local inventory ({self.source}) has "
                f"{len(usable)} that fit: {have}. Lower the request, list more devices in the "
                f"Iris inventory, or use launcher='kubernetes'."
            )


def parse_nvidia_smi(output: str) -> list[Device]:
    """Lines like 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)'."""
    devices = []
    for line in output.splitlines():
        m = re.match(r"GPU (\d+): (.*?)(?: \(UUID|$)", line.strip())
        if m:
            devices.append(Device("gpu", m.group(1), gpu_type_from_name(m.group(2))))
    return devices


def gpu_type_from_name(name: str) -> str:
    lowered = name.lower()
    # Longest names first so "a100 80gb" is not read as "a100".
    for variant in sorted(GPU_TYPES, key=len, reverse=True):
        parts = variant.split("-")
        if all(p in lowered for p in parts):
            return variant
    return ANY


def _tpu_generation_from_env(accelerator_type: str) -> str:
    m = re.match(r"(v\d+[a-z]*?)(?:litepod|lite)?-\d+", accelerator_type.lower())
    if not m:
        return ANY
    generation = m.group(1)
    if "lite" in accelerator_type.lower() and generation == "v5":
        generation = "v5e"
    return generation if generation in TPU_GENERATIONS else ANY


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def default_lease_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"marin-iris-leases-{os.getuid()}")


@dataclass
class DeviceLeases:
    """Exclusive device leases for steps; `acquire` is all-or-nothing."""

    inventory: LocalInventory
    lease_dir: str = field(default_factory=default_lease_dir)
    _held: dict[str, list[tuple[Device, int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        os.makedirs(self.lease_dir, exist_ok=True)

    def _path(self, device: Device) -> str:
        return os.path.join(self.lease_dir, f"{device.kind}-{device.id}.lock")

    def acquire(self, owner: str, request: ResourceConfig) -> tuple[Device, ...] | None:
        """Lease `request.accelerator_count` free devices per replica to `owner` (all of them,
        replica after replica), or None if too few are free."""
        if owner in self._held:
            raise RuntimeError(f"{owner} already holds {[str(d) for d, _ in self._held[owner]]}")
        wanted = request.accelerator_count * request.replicas
        taken: list[tuple[Device, int]] = []
        for device in self.inventory.serving(request):
            if len(taken) == wanted:
                break
            fd = os.open(self._path(device), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            # Who holds it, for the "waiting for devices" message of other runs.
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{owner} pid={os.getpid()}\n".encode(), 0)
            taken.append((device, fd))
        if len(taken) < wanted:
            for _, fd in taken:
                _unlock(fd)
            return None
        self._held[owner] = taken
        return tuple(d for d, _ in taken)

    def release(self, owner: str) -> None:
        for _, fd in self._held.pop(owner, []):
            _unlock(fd)

    def holders(self, request: ResourceConfig) -> dict[str, str]:
        """Device -> who holds it, for the devices that could serve `request`."""
        out = {}
        for device in self.inventory.serving(request):
            try:
                with open(self._path(device)) as f:
                    holder = f.read().strip()
            except OSError:
                holder = ""
            out[str(device)] = holder or "free"
        return out

    def release_all(self) -> None:
        for owner in list(self._held):
            self.release(owner)


def _unlock(fd: int) -> None:
    try:
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
