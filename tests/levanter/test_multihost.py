"""Multi-host training on one machine: 2 processes x 2 forced CPU devices, joined by
jax.distributed (gloo), train with FSDP like 1 process x 4 devices; a SIGKILL of one process
stops the other and leaves nothing finished; the rerun resumes from the last checkpoint.

The processes are started as Iris's local launcher starts a multi-process step: a
`ProcessGang`, process 0 running the training, process 1 `python -m
marin_dagster.levanter.follower` (it trains what process 0 publishes).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from marin_dagster.iris.processes import ProcessGang, free_port, gang_env
from tests.conftest import subprocess_env
from tests.levanter.caches import write_cache

VOCAB = 50
STEPS = 20
RTOL = 1e-5


def _env(tmp_path, devices: int, **extra: str) -> dict[str, str]:
    return subprocess_env(
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        JAX_PLATFORMS="cpu",
        # The processes compile the same step functions: share XLA's compilation cache.
        JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax-cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        **extra,
    )


def _popen(command: list[str], env: dict[str, str], log: str) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(
            command, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )


def _leader_command(spec: dict) -> list[str]:
    return [sys.executable, "-m", "tests.levanter.train_job", json.dumps(spec)]


FOLLOWER = [sys.executable, "-m", "marin_dagster.levanter.follower"]


def _gang(tmp_path, spec: dict, name: str) -> ProcessGang:
    address = f"127.0.0.1:{free_port()}"
    procs = [
        _popen(
            _leader_command(spec) if i == 0 else FOLLOWER,
            _env(tmp_path, 2, **gang_env(2, i, address)),
            str(tmp_path / f"{name}-{i}.log"),
        )
        for i in range(2)
    ]
    return ProcessGang(procs)


def _logs(tmp_path, name: str) -> str:
    return "\n".join(
        f"--- process {i}:\n" + (tmp_path / f"{name}-{i}.log").read_text()[-3000:]
        for i in range(2)
        if (tmp_path / f"{name}-{i}.log").exists()
    )


def _losses(output: str) -> list[float]:
    with open(os.path.join(output, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r["loss"] for r in rows if "loss" in r]


def _finished_steps(out: str) -> list[int]:
    ckpt = os.path.join(out, "checkpoints")
    return sorted(int(n) for n in os.listdir(ckpt) if n.isdigit()) if os.path.isdir(ckpt) else []


@pytest.mark.slow
def test_two_processes_train_like_one_then_survive_a_sigkill(tmp_path) -> None:
    data = write_cache(str(tmp_path / "cache"), VOCAB, 8000, period=5, validation_tokens=600)
    base = {
        "datasets": {data: 1.0},
        "steps": STEPS,
        "vocab": VOCAB,
        "checkpoint_every_steps": 4,
        "log_every": 5,
        "sample_tokens": 0,
    }
    fsdp = {"parallelism": "fsdp"}

    # 1 process x 4 devices.
    one_out = str(tmp_path / "one")
    one = _popen(
        _leader_command({**base, "runs": [{"output": one_out, **fsdp}]}),
        _env(tmp_path, 4),
        str(tmp_path / "one.log"),
    )
    assert one.wait(timeout=300) == 0, (tmp_path / "one.log").read_text()[-3000:]
    one_result = json.load(open(os.path.join(one_out, "train_result.json")))
    assert one_result["num_devices"] == 4

    # 2 processes x 2 devices: the same losses, step by step.
    two_out = str(tmp_path / "two")
    gang = _gang(tmp_path, {**base, "runs": [{"output": two_out, **fsdp}]}, "two")
    assert gang.wait(timeout=300) == 0, _logs(tmp_path, "two")
    two_result = json.load(open(os.path.join(two_out, "train_result.json")))
    assert two_result["num_devices"] == 4 and two_result["final_step"] == STEPS
    one_losses, two_losses = _losses(one_out), _losses(two_out)
    assert len(one_losses) == len(two_losses) == STEPS
    np.testing.assert_allclose(two_losses, one_losses, rtol=RTOL)
    assert two_losses[-1] < two_losses[0] * 0.8  # it learned
    np.testing.assert_allclose(two_result["eval_loss"], one_result["eval_loss"], rtol=RTOL)
    a, b = (
        np.load(os.path.join(one_out, "params.npz")),
        np.load(os.path.join(two_out, "params.npz")),
    )
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-6, err_msg=k)
    print(
        "max relative loss difference, 2x2 vs 1x4:",
        float(np.max(np.abs(np.array(two_losses) - one_losses) / np.abs(one_losses))),
    )

    # SIGKILL of process 1 after a checkpoint: process 0 is stopped too, nothing is finished.
    killed_out = str(tmp_path / "killed")
    spec = {**base, "runs": [{"output": killed_out, **fsdp}], "log_every": 1}
    gang = _gang(tmp_path, {**spec, "sleep_per_step": 0.3}, "killed")
    deadline = time.time() + 240
    while not [s for s in _finished_steps(killed_out) if s >= 8]:
        assert gang.poll() is None, _logs(tmp_path, "killed")
        assert time.time() < deadline, "no checkpoint appeared\n" + _logs(tmp_path, "killed")
        time.sleep(0.05)
    os.killpg(gang.procs[1].pid, signal.SIGKILL)
    assert gang.wait(timeout=30) == -signal.SIGKILL
    assert gang.failed_process == 1
    assert gang.procs[0].poll() is not None  # the leader did not outlive its follower
    at_kill = _finished_steps(killed_out)
    assert max(at_kill) < STEPS
    assert not os.path.exists(os.path.join(killed_out, "train_result.json"))
    assert not os.path.exists(os.path.join(killed_out, "params.npz"))

    # The rerun resumes from the last checkpoint and tells the same story.
    gang = _gang(tmp_path, spec, "resumed")
    assert gang.wait(timeout=300) == 0, _logs(tmp_path, "resumed")
    resumed = json.load(open(os.path.join(killed_out, "train_result.json")))
    assert resumed["resumed_from_step"] is not None
    assert resumed["resumed_from_step"] >= max(at_kill)
    assert resumed["final_step"] == STEPS
    resumed_losses = _losses(killed_out)
    assert len(resumed_losses) == STEPS
    np.testing.assert_allclose(resumed_losses, two_losses, rtol=RTOL)
    np.testing.assert_allclose(resumed_losses, one_losses, rtol=RTOL)


def test_topology_from_the_launchers_environment() -> None:
    from marin_dagster.levanter.distributed import Topology, topology_from_env

    assert topology_from_env({}) is None  # no launcher: one process, as before
    assert topology_from_env({"MARIN_NUM_PROCESSES": "auto"}) == Topology(num_processes=0)
    topo = topology_from_env(
        {
            "MARIN_NUM_PROCESSES": "4",
            "MARIN_PROCESS_ID": "3",
            "MARIN_COORDINATOR_ADDRESS": "job-0.job:8476",
        }
    )
    assert topo == Topology(4, 3, "job-0.job:8476") and not topo.is_leader
    with pytest.raises(ValueError, match="MARIN_COORDINATOR_ADDRESS is unset"):
        topology_from_env({"MARIN_NUM_PROCESSES": "2", "MARIN_PROCESS_ID": "0"})
    with pytest.raises(ValueError, match="must be in 0..1"):
        topology_from_env(
            {
                "MARIN_NUM_PROCESSES": "2",
                "MARIN_PROCESS_ID": "2",
                "MARIN_COORDINATOR_ADDRESS": "h:1",
            }
        )
    with pytest.raises(ValueError, match="expected integers"):
        topology_from_env({"MARIN_NUM_PROCESSES": "two"})


def test_a_coordinator_port_already_taken_is_named_before_joining() -> None:
    """Process 0 would crash in gRPC's C++ (a segfault) on a taken port while the others
    waited out their join timeout; it names the port instead."""
    import socket

    from tests.conftest import subprocess_env

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        env = subprocess_env(
            MARIN_NUM_PROCESSES="2", MARIN_PROCESS_ID="0", MARIN_COORDINATOR_ADDRESS=address
        )
        done = subprocess.run(
            [sys.executable, "-c", "from marin_dagster.levanter import distributed as d; "
             "d.initialize_from_env()"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"the coordinator address {address} (MARIN_COORDINATOR_ADDRESS)" in done.stderr
    assert "is taken" in done.stderr
