"""A train_lm step on 2 hosts through the Iris local launcher: real step processes (process 0
the Dagster step, process 1 the follower), a real instance, the real train_lm asset, 2 forced
CPU devices per process. SIGTERM to the follower (a preempted host) stops the leader too; the
step is retried as a preemption and resumes from its last checkpoint."""

from __future__ import annotations

import os
import signal
import threading
import time

import dagster as dg
import psutil
import pytest

from marin_dagster.iris.executor import WORKER_MODULE
from tests.iris import multihost_job
from tests.iris.conftest import execution_config
from tests.iris.test_preempted_training import _checkpoint_steps


def _step_key() -> str:
    return multihost_job.assets()[-1].op.name


def _step_processes(step_key: str) -> dict[str, psutil.Process]:
    found = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            env = proc.environ()
            if (
                WORKER_MODULE in " ".join(proc.cmdline())
                and env.get("DAGSTER_RUN_STEP_KEY") == step_key
            ):
                found[env.get("MARIN_PROCESS_ID", "?")] = proc
        except psutil.Error:
            continue
    return found


def _preempt_follower(prefix: str, step_key: str, seen: dict, stop: threading.Event) -> None:
    """What a cluster does to one preemptible host: SIGTERM to its process."""
    while not stop.is_set():
        procs = _step_processes(step_key)
        if len(procs) == 2 and any(s >= 10 for s in _checkpoint_steps(prefix)):
            seen.update({k: (p.pid, p.environ()) for k, p in procs.items()})
            procs["1"].send_signal(signal.SIGTERM)
            return
        time.sleep(0.1)


@pytest.mark.slow
def test_two_host_training_step_survives_a_preempted_host(
    instance, iris_dir, tmp_path, downloads, monkeypatch, capfd
):
    prefix = str(tmp_path / "data")
    monkeypatch.setenv("MARIN_PREFIX", prefix)
    monkeypatch.setenv("MARIN_TEST_DOWNLOADS", downloads)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    seen: dict = {}
    stop = threading.Event()
    step_key = _step_key()
    watcher = threading.Thread(target=_preempt_follower, args=(prefix, step_key, seen, stop))
    watcher.start()
    try:
        result = dg.execute_job(
            dg.reconstructable(multihost_job.multihost_job),
            instance=instance,
            run_config=execution_config(
                tmp_path, inventory={"gpus": ["0", "1"]}, max_retries_preemption=2
            ),
            raise_on_error=False,
        )
    finally:
        stop.set()
        watcher.join()
    assert seen, "the training step finished before a checkpoint could be preempted"
    assert result.success, [
        str(e.event_specific_data)
        for e in result.all_events
        if e.event_type_value == "STEP_FAILURE"
    ]
    # Each process had one device of the lease and the coordinator of process 0.
    leader_env, follower_env = seen["0"][1], seen["1"][1]
    assert leader_env["MARIN_NUM_PROCESSES"] == follower_env["MARIN_NUM_PROCESSES"] == "2"
    assert leader_env["MARIN_COORDINATOR_ADDRESS"] == follower_env["MARIN_COORDINATOR_ADDRESS"]
    assert {leader_env["CUDA_VISIBLE_DEVICES"], follower_env["CUDA_VISIBLE_DEVICES"]} == {"0", "1"}

    retries = [
        e
        for e in result.all_events
        if e.event_type_value == "STEP_UP_FOR_RETRY" and e.step_key == step_key
    ]
    assert len(retries) == 1
    message = retries[0].event_specific_data.error.message
    assert "process 1 of 2" in message and "SIGTERM" in message, message
    starts = [
        e
        for e in result.all_events
        if e.event_type_value == "STEP_WORKER_STARTING" and e.step_key == step_key
    ]
    assert len(starts) == 2
    assert starts[0].event_specific_data.metadata["iris/processes"].value == "2"
    assert starts[0].event_specific_data.metadata["pid"].value == str(seen["0"][0])

    mat = result.asset_materializations_for_node(step_key)[0].metadata
    assert mat["devices"].value == 4  # the mesh spans both processes
    assert mat["resumed_from_step"].value >= 10
    assert mat["steps"].value == multihost_job.TRAIN_STEPS
    # No step process outlived the run.
    assert not _step_processes(step_key)
    params = mat["params"].value
    assert os.path.exists(getattr(params, "path", params))  # written by process 0
    # The follower, like process 0, keeps its INFO logs to its own (orbax's absl lines were
    # a few hundred); the step processes write to this process's stdout and stderr.
    out, err = capfd.readouterr()
    lines = (out + err).splitlines()
    assert any("process 1 of 2 joined the training" in line for line in lines)
    noise = [line for line in lines if "INFO" in line and ("absl" in line or "[process=" in line)]
    assert not noise, noise[:5]
