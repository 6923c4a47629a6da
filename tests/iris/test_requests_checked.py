"""Requests no machine can serve are refused when the asset is defined; requests only this
machine cannot serve (more cores than it has) run, with a warning in the run."""

from __future__ import annotations

import logging
import socket

import dagster as dg
import pytest

from assets.raw import sample_corpus
from marin_dagster.iris import RESOURCES_TAG, ResourceConfigError
from marin_dagster.iris.executor import available_cores, available_memory
from tests.iris import jobs
from tests.iris.conftest import execution_config, read_records


@pytest.mark.parametrize(
    "resources, fragments",
    [
        ("tpu:v5e-0", ["resources='tpu:v5e-0'", "at least one chip", "tpu:v5e-4"]),
        ("cpu replicas=2", ["resources='cpu replicas=2'", "CPU-only", "drop replicas="]),
        ("cpu:8 replicas=4", ["replicas=4", "CPU-only"]),
    ],
)
def test_factory_refuses_requests_no_machine_can_serve(resources, fragments):
    with pytest.raises(ResourceConfigError) as e:
        sample_corpus("raw/refused", resources=resources)
    for fragment in fragments:
        assert fragment in str(e.value)


def test_factory_keeps_requests_a_launcher_decides():
    # More cores than this machine has: a k8s node may have them. Accelerator replicas are
    # refused by the launcher before the run starts (test_inventory, test_kubernetes).
    for resources in ("cpu:64", "gpu:1 replicas=2", "tpu:v5e-1"):
        asset = sample_corpus("raw/kept", resources=resources)
        assert asset.op.tags[RESOURCES_TAG] == resources


def _runs_with_one_warning(instance, iris_dir, tmp_path, job, step: str) -> str:
    """Run `job`, whose step asks for more than this machine has: it runs, with a warning."""
    result = dg.execute_job(
        dg.reconstructable(job), instance=instance, run_config=execution_config(tmp_path)
    )
    assert result.success
    assert len(read_records(iris_dir, f"{step}.ran")) == 1
    warnings = [e for e in instance.all_logs(result.run_id) if e.level == logging.WARNING]
    assert [e.step_key for e in warnings] == [step], [e.user_message for e in warnings]
    return warnings[0].user_message


def test_more_cores_than_the_machine_has_runs_with_a_warning_naming_step_request_and_cores(
    instance, iris_dir, tmp_path
):
    cores = available_cores()
    assert jobs.MANY_CORES > cores
    message = _runs_with_one_warning(
        instance, iris_dir, tmp_path, jobs.many_cores_job, "many_cores"
    )
    assert 'Step "many_cores"' in message
    assert f"cpu:{jobs.MANY_CORES}" in message
    assert f"has {cores} CPU cores;" in message and socket.gethostname() in message


def test_more_memory_than_the_machine_has_runs_with_a_warning(instance, iris_dir, tmp_path):
    memory = available_memory()
    assert memory is not None and memory < 2**46
    message = _runs_with_one_warning(instance, iris_dir, tmp_path, jobs.much_ram_job, "much_ram")
    assert 'Step "much_ram" asks for cpu ram=64t, and this machine' in message
    assert f"has {memory / 2**30:.1f} GiB of memory;" in message
