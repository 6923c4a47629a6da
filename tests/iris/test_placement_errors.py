"""Requests the executor cannot place fail the run before any step process starts."""

from __future__ import annotations

import dagster as dg
import pytest

from marin_dagster.iris import ResourceConfigError
from resources.iris import IrisInventory, IrisKubernetes, IrisResource
from tests.iris import jobs
from tests.iris.conftest import execution_config, read_records


def _run_failure_text(instance, result) -> str:
    return "\n".join(
        f"{e.message or ''} {getattr(e.dagster_event.event_specific_data, 'error', None) or ''}"
        for e in instance.all_logs(result.run_id)
        if e.dagster_event is not None
    )


def test_more_gpus_than_the_inventory_fails_before_launch(instance, iris_dir, tmp_path):
    result = dg.execute_job(
        dg.reconstructable(jobs.impossible_job),
        instance=instance,
        run_config=execution_config(tmp_path),
        raise_on_error=False,
    )
    assert not result.success
    text = _run_failure_text(instance, result)
    assert "Iris cannot place this run; nothing was launched" in text
    assert (
        "step 'two_gpus' asks for gpu:2 (2 GPUs) but the local inventory (configured) has 1" in text
    )
    starting = [e for e in result.all_events if e.event_type_value == "STEP_WORKER_STARTING"]
    assert starting == []
    assert (
        read_records(iris_dir, "cpu_side.start") == []
        and read_records(iris_dir, "two_gpus.ran") == []
    )


def test_unreadable_resource_tag_fails_before_launch(instance, iris_dir, tmp_path):
    result = dg.execute_job(
        dg.reconstructable(jobs.bad_tag_job),
        instance=instance,
        run_config=execution_config(tmp_path),
        raise_on_error=False,
    )
    assert not result.success
    text = _run_failure_text(instance, result)
    assert "resources='gpu:z999': unknown GPU type 'z999'; known GPU types: t4" in text
    assert read_records(iris_dir, "bad_tag.ran") == []


def test_iris_resource_configures_the_executor():
    iris = IrisResource(
        inventory=IrisInventory(gpus=["0", "1"], gpu_type="h100"),
        max_retries_preemption=3,
        kubernetes=IrisKubernetes(image="img:1", secret_env={"HF_TOKEN": "hf:token"}),
    )
    settings = iris.settings()
    assert settings.inventory.local_inventory().count("gpu") == 2
    assert settings.max_retries_preemption == 3
    assert settings.kubernetes.secret_env_vars() == [
        {"name": "HF_TOKEN", "value_from": {"secret_key_ref": {"name": "hf", "key": "token"}}}
    ]
    executor_def = iris.executor()
    assert executor_def.name == "iris"
    # The configured executor validates against the executor's own schema.
    defs = dg.Definitions(
        assets=[jobs.gpu_a],
        jobs=[dg.define_asset_job("j", selection=["gpu_a"])],
        executor=executor_def,
    )
    assert defs.resolve_job_def("j").executor_def.name == "iris"
    with pytest.raises(ResourceConfigError, match="launcher='slurm'"):
        IrisResource(launcher="slurm").executor_config()
    with pytest.raises(ResourceConfigError, match="secret-name:key"):
        IrisResource(
            kubernetes=IrisKubernetes(secret_env={"X": "nokey"})
        ).settings().kubernetes.secret_env_vars()


def test_a_bad_inventory_is_said_once_for_the_run(instance, iris_dir, tmp_path):
    """The executor's inventory was read again for each step, so its one error came once per
    step, each as if the step were at fault."""
    result = dg.execute_job(
        dg.reconstructable(jobs.local_gpu_job),
        instance=instance,
        run_config=execution_config(tmp_path, inventory={"gpus": ["0"], "gpu_type": "h1000"}),
        raise_on_error=False,
    )
    assert not result.success
    [failure] = [
        e.dagster_event
        for e in instance.all_logs(result.run_id)
        if e.dagster_event is not None
        and e.dagster_event.event_type == dg.DagsterEventType.RUN_FAILURE
    ]
    text = failure.event_specific_data.error.message
    assert text.count("inventory gpu_type='h1000' is unknown") == 1, text
    assert "(steps gpu_a, gpu_b)" in text and "cpu_side" not in text, text
    assert read_records(iris_dir, "cpu_side.start") == []
