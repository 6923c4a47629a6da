"""A training step preempted (SIGTERM) mid-run is retried by the Iris executor and resumes
from its last checkpoint: real step processes, a real instance, the real train_lm asset."""

from __future__ import annotations

import os
import signal
import threading
import time

import dagster as dg
import psutil

from marin_dagster.iris.executor import WORKER_MODULE
from tests.iris import train_job
from tests.iris.conftest import execution_config

# The train_lm step's op name, from the asset itself (asset keys are named by the factories).
STEP_KEY = train_job.assets()[3].op.name


def _checkpoint_steps(prefix: str) -> list[int]:
    root = os.path.join(prefix, "checkpoints")
    found = []
    for run in os.listdir(root) if os.path.isdir(root) else []:
        folder = os.path.join(root, run, "checkpoints")
        if os.path.isdir(folder):  # orbax renames a step's folder to its number when complete
            found += [int(n) for n in os.listdir(folder) if n.isdigit()]
    return found


def _training_step_process() -> psutil.Process | None:
    for proc in psutil.Process().children(recursive=True):
        try:
            if (
                WORKER_MODULE in " ".join(proc.cmdline())
                and proc.environ().get("DAGSTER_RUN_STEP_KEY") == STEP_KEY
            ):
                return proc
        except psutil.Error:
            continue
    return None


def _preempt_after_a_checkpoint(prefix: str, killed: list[int], stop: threading.Event) -> None:
    """What a cluster does to a preemptible node: SIGTERM to the step's process."""
    while not stop.is_set():
        proc = _training_step_process()
        if proc is not None and any(s >= 10 for s in _checkpoint_steps(prefix)):
            killed.append(proc.pid)
            proc.send_signal(signal.SIGTERM)
            return
        time.sleep(0.1)


def test_preempted_training_resumes_from_its_checkpoint(
    instance, iris_dir, tmp_path, downloads, monkeypatch
):
    prefix = str(tmp_path / "data")
    monkeypatch.setenv("MARIN_PREFIX", prefix)
    monkeypatch.setenv("MARIN_TEST_DOWNLOADS", downloads)
    killed: list[int] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_preempt_after_a_checkpoint, args=(prefix, killed, stop))
    watcher.start()
    try:
        result = dg.execute_job(
            dg.reconstructable(train_job.train_job),
            instance=instance,
            run_config=execution_config(tmp_path, max_retries_preemption=2),
            raise_on_error=False,
        )
    finally:
        stop.set()
        watcher.join()
    assert killed, "the training step finished before a checkpoint could be preempted"
    assert result.success, [
        str(e.event_specific_data)
        for e in result.all_events
        if e.event_type_value == "STEP_FAILURE"
    ]
    retries = [
        e
        for e in result.all_events
        if e.event_type_value == "STEP_UP_FOR_RETRY" and e.step_key == STEP_KEY
    ]
    assert len(retries) == 1 and "SIGTERM" in retries[0].event_specific_data.error.message
    starts = [
        e
        for e in result.all_events
        if e.event_type_value == "STEP_WORKER_STARTING" and e.step_key == STEP_KEY
    ]
    pids = [e.event_specific_data.metadata["pid"].value for e in starts]
    assert len(pids) == 2 and pids[0] == str(killed[0]) and pids[1] != pids[0]

    mat = result.asset_materializations_for_node(STEP_KEY)[0].metadata
    assert mat["resumed_from_step"].value >= 10
    assert mat["steps"].value == train_job.TRAIN_STEPS
