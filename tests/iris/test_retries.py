"""Preemption retries, own-error failures and run termination, with real step processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import dagster as dg
import psutil

from marin_dagster.iris import ResourceConfig
from marin_dagster.iris.inventory import DeviceLeases, LocalInventory
from tests.iris import jobs
from tests.iris.conftest import execution_config, read_records

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_preempted_step_is_retried_and_raising_step_is_not(instance, iris_dir, tmp_path):
    result = dg.execute_job(
        dg.reconstructable(jobs.retry_job),
        instance=instance,
        run_config=execution_config(tmp_path, max_retries_preemption=1, max_concurrent=3),
        raise_on_error=False,
    )
    assert not result.success

    # SIGTERM on the first attempt: retried as a preemption, the second attempt succeeds.
    attempts = read_records(iris_dir, "preempted_once.attempt")
    assert [a["attempt"] for a in attempts] == ["0", "1"]
    assert attempts[0]["pid"] != attempts[1]["pid"]
    assert result.is_node_success("preempted_once")
    retry_events = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    by_step = {}
    for e in retry_events:
        by_step.setdefault(e.step_key, []).append(e.event_specific_data.error.message)
    assert "preemption retry 1 of 1" in by_step["preempted_once"][0]
    assert "SIGTERM" in by_step["preempted_once"][0]

    # Always preempted: one retry (max_retries_preemption=1), then the step fails saying why.
    assert len(read_records(iris_dir, "always_preempted.attempt")) == 2
    assert len(by_step["always_preempted"]) == 1
    failure = result.failure_data_for_node("always_preempted")
    assert "after 1 preemption retries" in failure.error.message

    # Its own error: not retried, the run fails with that error.
    assert len(read_records(iris_dir, "raises.attempt")) == 1
    assert "raises" not in by_step
    assert "deliberate failure in raises()" in str(result.failure_data_for_node("raises").error)


RUNNER = textwrap.dedent(
    """
    import sys
    import dagster as dg
    from dagster._utils.interrupts import capture_interrupts
    from tests.iris import jobs
    # As the run worker (`dagster api execute_run`) does: a termination request is an interrupt.
    with capture_interrupts():
        with dg.DagsterInstance.get() as instance:
            dg.execute_job(dg.reconstructable(jobs.long_job), instance=instance,
                           run_config={config!r}, raise_on_error=False)
    """
)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_terminating_a_run_leaves_no_step_process(instance, iris_dir, tmp_path):
    config = execution_config(tmp_path)
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER.format(config=config)],
        cwd=REPO,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            records = read_records(iris_dir, "long_cpu.pids") + read_records(
                iris_dir, "long_gpu.pids"
            )
            if len(records) == 2:
                break
            assert runner.poll() is None, "the run ended before its steps started"
            time.sleep(0.2)
        assert len(records) == 2, "steps did not start"
        pids = [r["pid"] for r in records] + [r["child"] for r in records]
        assert all(_alive(p) for p in pids)
        runner_children = {p.pid for p in psutil.Process(runner.pid).children(recursive=True)}
        assert {r["pid"] for r in records} <= runner_children

        (run,) = instance.get_runs()
        instance.report_run_canceling(run)
        os.kill(runner.pid, signal.SIGTERM)
        runner.wait(timeout=90)
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)

    assert not [p for p in pids if _alive(p)], "step processes or their children survived"
    events = instance.all_logs(run.run_id)
    messages = [e.message or "" for e in events]
    assert any("Executor received termination signal" in m for m in messages)
    assert sum("Iris stopped step" in m for m in messages) == 2
    assert not any(
        e.dagster_event and e.dagster_event.event_type_value == "STEP_UP_FOR_RETRY" for e in events
    )
    # The lease died with its holder: the device can be leased again.
    assert os.listdir(tmp_path / "leases") == ["gpu-0.lock"]
    leases = DeviceLeases(LocalInventory.from_config(gpus=["0"]), str(tmp_path / "leases"))
    assert leases.acquire("next-run", ResourceConfig.parse("gpu:1")) is not None
    leases.release_all()
