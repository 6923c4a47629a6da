"""Where a step runs: the environment the launchers set and the metadata assets report."""

from __future__ import annotations

import os
import socket

from marin_dagster.iris.inventory import Device

REQUESTED_ENV = "MARIN_IRIS_REQUESTED"
ASSIGNED_DEVICES_ENV = "MARIN_IRIS_ASSIGNED_DEVICES"
HOST_ENV = "MARIN_IRIS_HOST"
LAUNCHER_ENV = "MARIN_IRIS_LAUNCHER"
ATTEMPT_ENV = "MARIN_IRIS_ATTEMPT"
K8S_JOB_ENV = "MARIN_IRIS_K8S_JOB"
K8S_POD_ENV = "MARIN_IRIS_K8S_POD"


def device_env(devices: tuple[Device, ...], base_port: int = 8476) -> dict[str, str]:
    """Visibility variables so a step's process sees exactly its devices.

    GPUs: CUDA_VISIBLE_DEVICES. TPU chips: the libtpu variables for one process on a subset of
    a host's chips (TPU_VISIBLE_CHIPS, TPU_CHIPS_PER_PROCESS_BOUNDS, TPU_PROCESS_BOUNDS) plus a
    port of its own so two TPU steps on one host don't collide on the mesh controller.
    """
    gpus = [d.id for d in devices if d.kind == "gpu"]
    chips = [d.id for d in devices if d.kind == "tpu"]
    # An empty CUDA_VISIBLE_DEVICES hides every GPU: CPU and TPU steps must not grab one
    # (JAX would preallocate most of its memory).
    env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus)}
    if chips:
        bounds = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}.get(len(chips))
        port = base_port + int(chips[0])
        env.update(
            TPU_VISIBLE_CHIPS=",".join(chips),
            TPU_VISIBLE_DEVICES=",".join(chips),
            TPU_PROCESS_BOUNDS="1,1,1",
            TPU_PROCESS_PORT=str(port),
            TPU_PROCESS_ADDRESSES=f"localhost:{port}",
            TPU_MESH_CONTROLLER_ADDRESS=f"localhost:{port + 100}",
            TPU_MESH_CONTROLLER_PORT=str(port + 100),
        )
        if bounds:
            env["TPU_CHIPS_PER_PROCESS_BOUNDS"] = bounds
    return env


def iris_placement_metadata() -> dict[str, str]:
    """What this step asked for, what it was given and where it runs, for asset metadata.

    Outside an Iris launcher (an in-process run, a test) it reports `launcher: in-process`.
    """
    return {
        "iris/requested": os.environ.get(REQUESTED_ENV, "unknown"),
        "iris/assigned": os.environ.get(ASSIGNED_DEVICES_ENV, "") or "none",
        "iris/host": os.environ.get(HOST_ENV) or socket.gethostname(),
        "iris/launcher": os.environ.get(LAUNCHER_ENV, "in-process"),
        "iris/attempt": os.environ.get(ATTEMPT_ENV, "0"),
        **({"iris/k8s_job": os.environ[K8S_JOB_ENV]} if K8S_JOB_ENV in os.environ else {}),
        **({"iris/k8s_pod": os.environ[K8S_POD_ENV]} if K8S_POD_ENV in os.environ else {}),
    }
