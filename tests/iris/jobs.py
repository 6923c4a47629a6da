"""Jobs the Iris tests run through `execute_job(reconstructable(...))`.

Step-delegating executors start each step in a new process that re-imports its job, so the
jobs live in an importable module. Assets record what they saw into IRIS_TEST_DIR.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import dagster as dg

from marin_dagster.iris import ResourceConfig
from marin_dagster.iris.executor import iris_executor
from marin_dagster.iris.placement import iris_placement_metadata

GPU1 = ResourceConfig.parse("gpu:1").to_op_tags()
CPU = ResourceConfig.parse("cpu").to_op_tags()


def _iris_job(name: str, assets: list[dg.AssetsDefinition]) -> dg.JobDefinition:
    """A job of these assets on the Iris executor (each job below is a module-level
    function, as `reconstructable` needs)."""
    return dg.Definitions(
        assets=assets,
        jobs=[dg.define_asset_job(name, selection=assets)],
        executor=iris_executor,
    ).resolve_job_def(name)


def _dir() -> str:
    return os.environ["IRIS_TEST_DIR"]


def _record(name: str, **extra: object) -> None:
    with open(os.path.join(_dir(), f"{name}.jsonl"), "a") as f:
        f.write(json.dumps({"t": time.time(), "pid": os.getpid(), **extra}) + "\n")


def _wait_for(path: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(0.05)
    return False


def _gpu_step(name: str) -> dg.MaterializeResult:
    env = {
        k: os.environ.get(k)
        for k in (
            "CUDA_VISIBLE_DEVICES",
            "MARIN_IRIS_ASSIGNED_DEVICES",
            "MARIN_IRIS_REQUESTED",
            "MARIN_IRIS_LAUNCHER",
        )
    }
    _record(f"{name}.start", env=env)
    open(os.path.join(_dir(), f"{name}.started"), "w").close()
    time.sleep(1.0)
    _record(f"{name}.end")
    return dg.MaterializeResult(metadata=iris_placement_metadata())


# -- local launcher: one CPU asset, two gpu:1 assets ------------------------------------------


@dg.asset(op_tags=CPU)
def cpu_side() -> dg.MaterializeResult:
    _record("cpu_side.start", env={"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")})
    # Runs alongside: finishes only once a GPU step has started (a serial executor never gets there).
    seen = _wait_for(os.path.join(_dir(), "gpu_a.started"), 120) or _wait_for(
        os.path.join(_dir(), "gpu_b.started"), 1
    )
    if not seen:
        raise RuntimeError("no GPU step started while the CPU step ran")
    _record("cpu_side.end")
    return dg.MaterializeResult(metadata=iris_placement_metadata())


@dg.asset(op_tags=GPU1)
def gpu_a() -> dg.MaterializeResult:
    return _gpu_step("gpu_a")


@dg.asset(op_tags=GPU1)
def gpu_b() -> dg.MaterializeResult:
    return _gpu_step("gpu_b")


def local_gpu_job() -> dg.JobDefinition:
    return _iris_job("local_gpu_job", [cpu_side, gpu_a, gpu_b])


# -- max_concurrent: three CPU steps that hold their slot a while -----------------------------


def _slot(name: str) -> None:
    _record("slots", step=name, event="start")
    time.sleep(3.0)
    _record("slots", step=name, event="end")


@dg.asset(op_tags=CPU)
def slot_a() -> None:
    _slot("slot_a")


@dg.asset(op_tags=CPU)
def slot_b() -> None:
    _slot("slot_b")


@dg.asset(op_tags=CPU)
def slot_c() -> None:
    _slot("slot_c")


def slots_job() -> dg.JobDefinition:
    return _iris_job("slots_job", [slot_a, slot_b, slot_c])


# -- retries: preempted once, always preempted, raising --------------------------------------


@dg.asset(op_tags=CPU)
def preempted_once() -> dg.MaterializeResult:
    marker = os.path.join(_dir(), "preempted_once.marker")
    _record("preempted_once.attempt", attempt=os.environ.get("MARIN_IRIS_ATTEMPT"))
    if not os.path.exists(marker):
        open(marker, "w").close()
        # What a scheduler does to a preempted worker.
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)
    return dg.MaterializeResult(metadata=iris_placement_metadata())


@dg.asset(op_tags=CPU)
def always_preempted() -> None:
    _record("always_preempted.attempt")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)


@dg.asset(op_tags=CPU)
def raises() -> None:
    _record("raises.attempt")
    raise ValueError("deliberate failure in raises()")


def retry_job() -> dg.JobDefinition:
    return _iris_job("retry_job", [preempted_once, always_preempted, raises])


# -- termination: long steps that spawn children ----------------------------------------------


def _long_step(name: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    _record(f"{name}.pids", pid=os.getpid(), child=child.pid)
    time.sleep(600)


@dg.asset(op_tags=CPU)
def long_cpu() -> None:
    _long_step("long_cpu")


@dg.asset(op_tags=GPU1)
def long_gpu() -> None:
    _long_step("long_gpu")


def long_job() -> dg.JobDefinition:
    return _iris_job("long_job", [long_cpu, long_gpu])


# -- impossible and unreadable requests ---------------------------------------------------------


@dg.asset(op_tags=ResourceConfig.parse("gpu:2").to_op_tags())
def two_gpus() -> None:
    _record("two_gpus.ran")


@dg.asset(op_tags={"marin/resources": "gpu:z999"})
def bad_tag() -> None:
    _record("bad_tag.ran")


def impossible_job() -> dg.JobDefinition:
    return _iris_job("impossible_job", [cpu_side, two_gpus])


def bad_tag_job() -> dg.JobDefinition:
    return _iris_job("bad_tag_job", [bad_tag])


# -- Kubernetes: one GPU and one TPU step (rendered and launched against a fake API) ----------


@dg.asset(op_tags=ResourceConfig.parse("gpu:h100x8 cpu=16 ram=128g").to_op_tags())
def train_gpu() -> None:
    _record("train_gpu.ran")


@dg.asset(op_tags=ResourceConfig.parse("tpu:v5e-8").to_op_tags())
def train_tpu() -> None:
    _record("train_tpu.ran")


def k8s_job() -> dg.JobDefinition:
    return _iris_job("k8s_job", [train_gpu, train_tpu])


# -- more cores than the machine has ------------------------------------------------------------

# cpu:64, or more where the machine running the tests has 64 cores or more.
MANY_CORES = max(64, 2 * (os.cpu_count() or 1))


@dg.asset(op_tags=ResourceConfig.parse(f"cpu:{MANY_CORES}").to_op_tags())
def many_cores() -> None:
    _record("many_cores.ran")


def many_cores_job() -> dg.JobDefinition:
    return _iris_job("many_cores_job", [many_cores])


# More memory than any machine running the tests has: 64 TiB.
MUCH_RAM = "65536g"


@dg.asset(op_tags=ResourceConfig.parse(f"cpu ram={MUCH_RAM}").to_op_tags())
def much_ram() -> None:
    _record("much_ram.ran")


def much_ram_job() -> dg.JobDefinition:
    return _iris_job("much_ram_job", [much_ram])
