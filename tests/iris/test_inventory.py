"""Local inventory, device leases (real flocks on real files) and the environment steps get."""

from __future__ import annotations

import subprocess
import sys

import pytest

from marin_dagster.iris import ResourceConfig, ResourceConfigError
from marin_dagster.iris.inventory import DeviceLeases, LocalInventory, parse_nvidia_smi
from marin_dagster.iris.placement import device_env
from marin_dagster.iris.processes import was_preempted

NVIDIA_SMI = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5e1c0c7a-0000-0000-0000-000000000000)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-6f2d1d8b-0000-0000-0000-000000000000)
GPU 2: Tesla T4 (UUID: GPU-7a3e2e9c-0000-0000-0000-000000000000)
"""


def test_parse_nvidia_smi():
    devices = parse_nvidia_smi(NVIDIA_SMI)
    assert [(d.id, d.variant) for d in devices] == [("0", "h100"), ("1", "a100-80gb"), ("2", "t4")]


def test_typed_requests_match_typed_devices():
    inv = LocalInventory(tuple(parse_nvidia_smi(NVIDIA_SMI)))
    assert [d.id for d in inv.serving(ResourceConfig.parse("gpu:h100"))] == ["0"]
    assert len(inv.serving(ResourceConfig.parse("gpu:1"))) == 3
    inv.check_feasible(ResourceConfig.parse("gpu:3"), "ok")
    with pytest.raises(ResourceConfigError, match=r"asks for gpu:h100x2 .* has 1 that fit"):
        inv.check_feasible(ResourceConfig.parse("gpu:h100x2"), "train")


def test_impossible_local_requests_are_clear():
    inv = LocalInventory.from_config(gpus=["0"])
    with pytest.raises(ResourceConfigError) as e:
        inv.check_feasible(ResourceConfig.parse("gpu:2"), "train")
    message = str(e.value)
    assert "step 'train' asks for gpu:2 (2 GPUs)" in message and "gpu:0" in message
    assert "launcher='kubernetes'" in message
    with pytest.raises(ResourceConfigError, match="has 0 that fit"):
        inv.check_feasible(ResourceConfig.parse("tpu:v5e-4"), "tpu_step")
    # Multi-host: one process per replica, each with its own devices.
    two = LocalInventory.from_config(gpus=["0", "1"])
    two.check_feasible(ResourceConfig.parse("gpu:1 replicas=2"), "multi")
    with pytest.raises(ResourceConfigError, match="4 GPUs, 2 for each of 2 processes"):
        two.check_feasible(ResourceConfig.parse("gpu:2 replicas=2"), "multi")
    # A multi-host TPU slice is many machines: not this one.
    with pytest.raises(ResourceConfigError, match="a slice of 4 TPU hosts.*kubernetes"):
        LocalInventory.from_config(tpu_chips=[str(i) for i in range(16)]).check_feasible(
            ResourceConfig.parse("tpu:v5e-16"), "big"
        )
    with pytest.raises(ResourceConfigError, match="twice"):
        LocalInventory.from_config(gpus=["0", "0"])
    with pytest.raises(ResourceConfigError, match="gpu_type='h900'"):
        LocalInventory.from_config(gpus=["0"], gpu_type="h900")


def test_leases_are_exclusive_within_and_across_processes(tmp_path):
    inv = LocalInventory.from_config(gpus=["0", "1"])
    leases = DeviceLeases(inv, str(tmp_path))
    gpu1 = ResourceConfig.parse("gpu:1")
    a = leases.acquire("a", gpu1)
    b = leases.acquire("b", gpu1)
    assert a and b and set(a).isdisjoint(b)
    assert leases.acquire("c", gpu1) is None  # all-or-nothing, nothing left
    assert leases.acquire("d", ResourceConfig.parse("gpu:2")) is None
    assert leases.acquire("e", ResourceConfig.parse("gpu:1 replicas=2")) is None
    holders = leases.holders(gpu1)
    assert sorted(h.split()[0] for h in holders.values()) == ["a", "b"]

    # Another process (another run on the host) sees the same leases.
    probe = (
        "import sys; from marin_dagster.iris import ResourceConfig;"
        "from marin_dagster.iris.inventory import DeviceLeases, LocalInventory;"
        f"l = DeviceLeases(LocalInventory.from_config(gpus=['0','1']), {str(tmp_path)!r});"
        "got = l.acquire('other', ResourceConfig.parse('gpu:1'));"
        "print(','.join(str(d) for d in got) if got else 'none')"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "none"
    leases.release("a")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(a[0])
    leases.release_all()
    assert leases.acquire("e", ResourceConfig.parse("gpu:2")) is not None


def test_device_env():
    inv = LocalInventory.from_config(
        gpus=["2", "3"], tpu_chips=["0", "1", "2", "3"], tpu_type="v5e"
    )
    gpus = tuple(inv.serving(ResourceConfig.parse("gpu:2")))
    assert device_env(gpus) == {"CUDA_VISIBLE_DEVICES": "2,3"}
    chips = tuple(inv.serving(ResourceConfig.parse("tpu:v5e-4")))
    env = device_env(chips[2:])
    assert env["TPU_VISIBLE_CHIPS"] == "2,3"
    assert env["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "1,2,1"
    assert env["TPU_PROCESS_BOUNDS"] == "1,1,1"
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert device_env(chips[:1])["TPU_PROCESS_PORT"] != env["TPU_PROCESS_PORT"]
    assert device_env(()) == {"CUDA_VISIBLE_DEVICES": ""}


def test_exit_as_preempted_after_own_sigterm_handler():
    code = (
        "import signal, time\n"
        "from marin_dagster.iris import exit_as_preempted\n"
        "signal.signal(signal.SIGTERM, lambda *a: exit_as_preempted())\n"
        "signal.raise_signal(signal.SIGTERM)\n"
        "raise SystemExit(3)\n"
    )
    rc = subprocess.run([sys.executable, "-c", code]).returncode
    assert rc == -15 and was_preempted(rc)


def test_preemption_exit_codes():
    assert was_preempted(-15) and was_preempted(143)
    assert not any(was_preempted(rc) for rc in (0, 1, -9, 137, None))
