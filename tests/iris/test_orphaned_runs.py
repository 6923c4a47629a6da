"""`kill -9` of a run's process: its step workers die with it and the run ends up FAILURE.

The run is started the way a user starts it (`dagster asset materialize` in its own session,
a persistent DAGSTER_HOME); the step runs a Zephyr pipeline on local worker processes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import dagster as dg
import psutil
import pytest

from marin_dagster.execution.asset import step_for
from marin_dagster.execution.instance import (
    RUN_HOST_TAG,
    RUN_PID_TAG,
    RUN_PROCESS_START_TAG,
    fail_orphaned_runs,
)
from marin_dagster.execution.processes import process_start_time
from marin_dagster.execution.status import StepStatus, read_status
from resources.storage import StorageResource
from tests.conftest import REPO, subprocess_env
from tests.iris import orphan_location
from tests.iris.conftest import read_records

DAGSTER = os.path.join(os.path.dirname(sys.executable), "dagster")


def _wait_until(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in the process group: zombies did die, only unreaped."""
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


@pytest.fixture
def cli_env(dagster_home, iris_dir, tmp_path) -> dict[str, str]:
    return subprocess_env(
        DAGSTER_HOME=dagster_home, MARIN_PREFIX=str(tmp_path / "data"), IRIS_TEST_DIR=iris_dir
    )


@pytest.fixture
def groups() -> Iterator[list[int]]:
    """Process groups a test started or saw; whatever is left of them is killed at the end."""
    started: list[int] = []
    yield started
    for pgid in started:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _materialize(select: str, env: dict[str, str], log_path: str) -> subprocess.Popen:
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [
                DAGSTER,
                "asset",
                "materialize",
                "-m",
                "tests.iris.orphan_location",
                "--select",
                select,
            ],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def test_kill_9_of_the_run_kills_its_step_workers_and_the_next_run_fails_it(
    cli_env, iris_dir, tmp_path, groups
):
    output = StorageResource(prefix=cli_env["MARIN_PREFIX"]).output_path(
        "orphan/held", step_for(orphan_location.held).version
    )
    cli = _materialize("orphan/held", cli_env, str(tmp_path / "first.log"))
    groups.append(cli.pid)
    _wait_until(
        lambda: len(read_records(iris_dir, "zephyr_task")) == 2,
        180,
        "both Zephyr tasks to start (see first.log)",
    )
    step = read_records(iris_dir, "step")[0]
    workers = {r["pid"] for r in read_records(iris_dir, "zephyr_task")}
    groups.append(step["pgid"])
    # What makes the test mean something: the step worker is out of the CLI's process group,
    # and the Zephyr workers are in the step worker's.
    assert step["pgid"] != cli.pid
    assert {r["pgid"] for r in read_records(iris_dir, "zephyr_task")} == {step["pgid"]}
    assert step["pid"] not in workers
    assert read_status(output).status == StepStatus.RUNNING

    os.killpg(cli.pid, signal.SIGKILL)
    cli.wait(timeout=10)
    _wait_until(
        lambda: not _group_members(step["pgid"]),
        5,
        f"the step worker's group {step['pgid']} to die with its run",
    )

    # Nothing is left to finish the work: released now, the output still reads RUNNING.
    open(os.path.join(iris_dir, orphan_location.RELEASE), "w").close()
    time.sleep(2.0)
    assert read_status(output).status == StepStatus.RUNNING
    assert not os.path.exists(os.path.join(output, "part-00000.jsonl"))

    with dg.DagsterInstance.get() as instance:
        (first,) = instance.get_runs()
        assert first.status == dg.DagsterRunStatus.STARTED
        assert first.tags[RUN_PID_TAG] == str(cli.pid)
        assert first.tags[RUN_HOST_TAG] == socket.gethostname()

    # The next run: its executor fails the orphan, and its step takes the dead lease over.
    second = _materialize("orphan/held", cli_env, str(tmp_path / "second.log"))
    groups.append(second.pid)
    assert second.wait(timeout=300) == 0, open(tmp_path / "second.log").read()[-4000:]
    assert read_status(output).status == StepStatus.SUCCESS
    with dg.DagsterInstance.get() as instance:
        runs = {r.run_id: r for r in instance.get_runs()}
        assert runs[first.run_id].status == dg.DagsterRunStatus.FAILURE
        (latest,) = [r for r in runs.values() if r.run_id != first.run_id]
        assert latest.status == dg.DagsterRunStatus.SUCCESS
        failure = instance.all_logs(first.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)[0]
        assert f"pid {cli.pid}" in failure.message and "gone" in failure.message
        notes = [
            e.message
            for e in instance.all_logs(latest.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)
        ]
        assert any(first.run_id in (m or "") for m in notes), notes


def _add_started_run(instance: dg.DagsterInstance, tags: dict[str, str]) -> str:
    run = dg.DagsterRun(
        job_name="some_job", run_id=str(uuid.uuid4()), status=dg.DagsterRunStatus.STARTED, tags=tags
    )
    instance.add_run(run)
    return run.run_id


def test_sweep_fails_only_runs_whose_process_on_this_host_is_gone(instance):
    host = socket.gethostname()
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    me = str(os.getpid())
    my_start = process_start_time(os.getpid())
    dead = _add_started_run(instance, {RUN_PID_TAG: str(finished.pid), RUN_HOST_TAG: host})
    # A live pid that is another process now (the run's pid was reused): also gone.
    reused = _add_started_run(
        instance,
        {RUN_PID_TAG: me, RUN_HOST_TAG: host, RUN_PROCESS_START_TAG: str((my_start or 0) + 1)},
    )
    alive = _add_started_run(
        instance, {RUN_PID_TAG: me, RUN_HOST_TAG: host, RUN_PROCESS_START_TAG: str(my_start)}
    )
    elsewhere = _add_started_run(
        instance, {RUN_PID_TAG: str(finished.pid), RUN_HOST_TAG: "other-host"}
    )
    untagged = _add_started_run(instance, {})

    assert sorted(fail_orphaned_runs(instance)) == sorted([dead, reused])
    status = {r.run_id: r.status for r in instance.get_runs()}
    assert status[dead] == status[reused] == dg.DagsterRunStatus.FAILURE
    for run_id in (alive, elsewhere, untagged):
        assert status[run_id] == dg.DagsterRunStatus.STARTED
    assert fail_orphaned_runs(instance) == []


def test_a_reexecution_still_carrying_its_parents_tags_is_not_orphaned():
    """Dagster copies a run's tags into its re-execution: until the new run's executor
    retags it, it names the parent's finished process, and looked orphaned to
    `fail_orphaned_runs` (which every run's executor and `marin status` call)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    tags = {RUN_PID_TAG: str(gone.pid), RUN_HOST_TAG: socket.gethostname()}
    with dg.instance_for_test() as instance:
        parent, child, orphan = (str(uuid.uuid4()) for _ in range(3))
        instance.add_run(
            dg.DagsterRun(
                job_name="j", run_id=parent, status=dg.DagsterRunStatus.FAILURE, tags=tags
            )
        )
        for run_id, parent_id in ((child, parent), (orphan, None)):
            instance.add_run(
                dg.DagsterRun(
                    job_name="j",
                    run_id=run_id,
                    status=dg.DagsterRunStatus.STARTED,
                    tags=tags,
                    parent_run_id=parent_id,
                    root_run_id=parent_id,
                )
            )
        assert fail_orphaned_runs(instance) == [orphan]
        assert instance.get_run_by_id(child).status == dg.DagsterRunStatus.STARTED
