"""The Kubernetes launcher: Job manifests rendered by dagster-k8s, and the launcher's API calls.

No real cluster runs here (there is no Kubernetes API server on this machine): manifests are
checked field by field and loaded into the `kubernetes` client's models, and the step handler
talks to the recorded fakes in tests/iris/fake_k8s.py.
"""

from __future__ import annotations

import json

import dagster as dg
import pytest
from dagster._core.execution.api import create_execution_plan
from dagster._core.execution.context.system import PlanData, PlanOrchestrationContext
from dagster._core.execution.context_creation_job import create_context_free_log_manager
from dagster._core.execution.plan.state import KnownExecutionState
from dagster._core.execution.retries import RetryMode
from dagster._core.executor.step_delegating import StepDelegatingExecutor, StepHandlerContext
from dagster._grpc.types import ExecuteStepArgs
from kubernetes import client

from marin_dagster.iris import ResourceConfig, ResourceConfigError
from marin_dagster.iris.executor import IrisStepHandler
from marin_dagster.iris.executor_k8s import KubernetesLauncher, classify_failed_pods
from marin_dagster.iris.settings import IrisSettings, KubernetesSettings
from tests.iris import jobs
from tests.iris.fake_k8s import FakeBatchV1Api, FakeCoreV1Api

SETTINGS = KubernetesSettings(
    image="us-docker.pkg.dev/marin/marin-dagster:1.0",
    namespace="marin",
    service_account_name="marin-runner",
    env_secrets=("marin-secrets",),
    secret_env={"WANDB_API_KEY": "wandb:api-key", "HF_TOKEN": "hf:token"},
    env={"MARIN_PREFIX": "gs://marin-bucket/data"},
    ttl_seconds_after_finished=300,
    require_shared_instance=False,
)


class _Run:
    run_id = "4f1c2a9e-0000-4000-8000-00000000beef"
    job_name = "k8s_job"


def _render(text: str, attempt: int = 0) -> tuple[client.V1Job, str]:
    launcher = KubernetesLauncher(SETTINGS, batch_api=FakeBatchV1Api(), core_api=FakeCoreV1Api())
    return launcher.render_job(
        run=_Run(),
        run_launcher=None,
        step_key="train",
        attempt=attempt,
        step_tags=ResourceConfig.parse(text).to_op_tags(),
        command=["/usr/local/bin/python", "-m", "marin_dagster.iris.executor_worker"],
        command_env=[{"name": "DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS", "value": "eJxLy..."}],
        image=SETTINGS.image,
    )


def _as_model(job: client.V1Job) -> client.V1Job:
    """Round trip through the API's JSON form, as the client sends it and a server returns it."""
    api = client.ApiClient()
    wire = api.sanitize_for_serialization(job)

    class _Response:
        data = json.dumps(wire)

    return api.deserialize(_Response(), "V1Job"), wire


def _common_checks(job: client.V1Job, wire: dict) -> client.V1Container:
    assert wire["apiVersion"] == "batch/v1" and wire["kind"] == "Job"
    assert job.metadata.name.startswith("iris-step-") and len(job.metadata.name) <= 63
    labels = job.metadata.labels
    assert labels["dagster/run-id"] == _Run.run_id
    assert labels["marin/iris-step"] == "train" and labels["marin/iris"] == "step"
    assert job.spec.template.metadata.labels["dagster/run-id"] == _Run.run_id
    assert job.spec.ttl_seconds_after_finished == 300
    assert job.spec.backoff_limit == 0
    pod = job.spec.template.spec
    assert pod.restart_policy == "Never"
    assert pod.service_account_name == "marin-runner"
    (container,) = pod.containers
    assert container.image == SETTINGS.image
    assert container.args == ["/usr/local/bin/python", "-m", "marin_dagster.iris.executor_worker"]
    env = {e.name: e for e in container.env}
    assert env["MARIN_PREFIX"].value == "gs://marin-bucket/data"
    assert env["DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS"].value == "eJxLy..."
    assert env["DAGSTER_HOME"].value == "/opt/dagster/dagster_home"
    # Secrets by reference only.
    assert env["WANDB_API_KEY"].value is None
    assert env["WANDB_API_KEY"].value_from.secret_key_ref.to_dict() == {
        "name": "wandb",
        "key": "api-key",
        "optional": None,
    }
    assert env["HF_TOKEN"].value_from.secret_key_ref.name == "hf"
    assert env["DAGSTER_PG_PASSWORD"].value_from.secret_key_ref.name == "dagster-postgresql-secret"
    assert [s.secret_ref.name for s in container.env_from if s.secret_ref] == ["marin-secrets"]
    assert env["MARIN_IRIS_HOST"].value_from.field_ref.field_path == "spec.nodeName"
    assert env["MARIN_IRIS_LAUNCHER"].value == "kubernetes"
    return container


def test_gpu_job_manifest():
    rendered, namespace = _render("gpu:h100x8 cpu=16 ram=128g")
    assert namespace == "marin"
    job, wire = _as_model(rendered)
    container = _common_checks(job, wire)
    assert container.resources.limits == {"memory": "128Gi", "nvidia.com/gpu": "8"}
    assert container.resources.requests["cpu"] == "16"
    assert container.resources.requests["nvidia.com/gpu"] == "8"
    pod = job.spec.template.spec
    assert pod.node_selector == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    tolerations = {(t.key, t.operator, t.effect) for t in pod.tolerations}
    assert ("nvidia.com/gpu", "Exists", "NoSchedule") in tolerations
    assert ("cloud.google.com/gke-spot", "Equal", "NoSchedule") in tolerations
    env = {e.name: e.value for e in container.env}
    assert env["MARIN_IRIS_REQUESTED"] == "gpu:h100x8 cpu=16 ram=128g"
    assert "google.com/tpu" not in container.resources.limits
    assert wire["spec"]["template"]["spec"]["nodeSelector"]  # camelCase on the wire


def test_tpu_job_manifest_and_retry_attempt_name():
    rendered, _ = _render("tpu:v5e-8", attempt=2)
    job, wire = _as_model(rendered)
    container = _common_checks(job, wire)
    assert job.metadata.name.endswith("-2") and job.metadata.labels["marin/iris-attempt"] == "2"
    assert container.resources.limits == {"memory": "4Gi", "google.com/tpu": "8"}
    assert job.spec.template.spec.node_selector == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "2x4",
    }
    assert ("google.com/tpu", "Exists") in {
        (t.key, t.operator) for t in job.spec.template.spec.tolerations
    }
    assert "nvidia.com/gpu" not in container.resources.limits


def _indexed_checks(job: client.V1Job, processes: int) -> dict[str, client.V1EnvVar]:
    assert job.spec.completion_mode == "Indexed"
    assert job.spec.completions == job.spec.parallelism == processes
    assert job.spec.backoff_limit == 0
    assert [r.succeeded_indexes for r in job.spec.success_policy.rules] == ["0"]
    assert job.spec.template.spec.subdomain == job.metadata.name
    env = {e.name: e for e in job.spec.template.spec.containers[0].env}
    assert env["MARIN_NUM_PROCESSES"].value == str(processes)
    name = job.metadata.name
    assert env["MARIN_COORDINATOR_ADDRESS"].value == f"{name}-0.{name}:8476"
    assert (
        env["MARIN_PROCESS_ID"].value_from.field_ref.field_path
        == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    return env


def test_multi_host_gpu_job_is_an_indexed_job_with_a_coordinator():
    rendered, _ = _render("gpu:h100x8 replicas=2")
    job, wire = _as_model(rendered)
    container = _common_checks(job, wire)
    _indexed_checks(job, 2)
    # Each pod is one host with its 8 GPUs.
    assert container.resources.limits["nvidia.com/gpu"] == "8"
    assert wire["spec"]["completionMode"] == "Indexed"
    assert wire["spec"]["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}
    assert wire["spec"]["template"]["spec"]["subdomain"] == job.metadata.name


def test_multi_host_tpu_slice_is_one_pod_per_host():
    rendered, _ = _render("tpu:v5e-16")
    job, wire = _as_model(rendered)
    container = _common_checks(job, wire)
    _indexed_checks(job, 4)  # v5e-16: 4 hosts of 4 chips
    assert container.resources.limits["google.com/tpu"] == "4"
    assert job.spec.template.spec.node_selector == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "4x4",
    }


def test_single_host_jobs_stay_plain():
    job, _ = _render("gpu:h100x8")
    assert job.spec.completion_mode is None and job.spec.completions is None
    env = {e.name for e in job.spec.template.spec.containers[0].env}
    assert not env & {"MARIN_NUM_PROCESSES", "MARIN_PROCESS_ID", "MARIN_COORDINATOR_ADDRESS"}


def test_indexed_job_gets_a_headless_service_owned_by_it():
    """What the launcher sends the API server (which is what does not run here)."""
    batch, core = FakeBatchV1Api(), FakeCoreV1Api()
    launcher = KubernetesLauncher(SETTINGS, batch_api=batch, core_api=core)
    job, namespace = _render("gpu:h100x8 replicas=2")
    launcher.create(job, namespace)
    (svc,) = core.services.values()
    wire = client.ApiClient().sanitize_for_serialization(svc)
    name = job.metadata.name
    assert wire["kind"] == "Service" and wire["metadata"]["name"] == name
    assert wire["spec"]["clusterIP"] == "None"  # headless: DNS names pods, no virtual IP
    assert wire["spec"]["selector"] == {"job-name": name}
    assert wire["spec"]["publishNotReadyAddresses"] is True
    assert wire["spec"]["ports"] == [{"name": "coordinator", "port": 8476}]
    (owner,) = wire["metadata"]["ownerReferences"]
    assert owner["kind"] == "Job" and owner["name"] == name and owner["uid"] == f"uid-{name}"
    assert wire["metadata"]["labels"]["marin/iris"] == "step"

    # Done when index 0 is done, not when the first pod (perhaps a follower) succeeds.
    batch.jobs[(namespace, name)].status = client.V1JobStatus(succeeded=1, active=1)
    assert launcher.state(name, namespace, processes=2).phase == "running"
    batch.jobs[(namespace, name)].status = client.V1JobStatus(
        succeeded=1,
        conditions=[client.V1JobCondition(type="SuccessCriteriaMet", status="True")],
    )
    assert launcher.state(name, namespace, processes=2).phase == "succeeded"

    # A single-host Job has no Service.
    plain, _ = _render("gpu:1")
    launcher.create(plain, namespace)
    assert len(core.services) == 1


def test_requests_the_launcher_cannot_place():
    with pytest.raises(ResourceConfigError, match="multislice"):
        _render("tpu:v5e-8 replicas=2")
    no_image = KubernetesLauncher(
        KubernetesSettings(), batch_api=FakeBatchV1Api(), core_api=FakeCoreV1Api()
    )
    with pytest.raises(ResourceConfigError, match="no image"):
        no_image.render_job(
            run=_Run(),
            run_launcher=None,
            step_key="s",
            attempt=0,
            step_tags=ResourceConfig.parse("gpu:1").to_op_tags(),
            command=["x"],
            command_env=[],
            image=None,
        )


def _pod_status(**kwargs) -> client.V1PodStatus:
    return client.V1PodStatus(phase="Failed", **kwargs)


def test_classify_failed_pods():
    def pod(status):
        return client.V1Pod(metadata=client.V1ObjectMeta(name="p"), status=status)

    def terminated(code):
        return [
            client.V1ContainerStatus(
                name="dagster",
                image="i",
                image_id="",
                ready=False,
                restart_count=0,
                state=client.V1ContainerState(
                    terminated=client.V1ContainerStateTerminated(exit_code=code)
                ),
            )
        ]

    assert classify_failed_pods("j", []).phase == "preempted"
    assert (
        classify_failed_pods("j", [pod(_pod_status(reason="Evicted", message="low memory"))]).phase
        == "preempted"
    )
    disrupted = _pod_status(
        conditions=[
            client.V1PodCondition(
                type="DisruptionTarget", status="True", reason="PreemptionByScheduler"
            )
        ]
    )
    assert classify_failed_pods("j", [pod(disrupted)]).phase == "preempted"
    assert (
        classify_failed_pods("j", [pod(_pod_status(container_statuses=terminated(143)))]).phase
        == "preempted"
    )
    failed = classify_failed_pods("j", [pod(_pod_status(container_statuses=terminated(1)))])
    assert failed.phase == "failed" and "exited 1" in failed.reason
    # A multi-host Job: one host preempted, another failed in its collective after it.
    both = [
        pod(_pod_status(container_statuses=terminated(75))),
        pod(_pod_status(container_statuses=terminated(143))),
    ]
    assert classify_failed_pods("j", both).phase == "preempted"


def _handler_context(instance, job_def, run, step_key, attempt, handler):
    recon = dg.reconstructable(jobs.k8s_job)
    plan = create_execution_plan(recon)
    plan_context = PlanOrchestrationContext(
        plan_data=PlanData(
            job=recon,
            dagster_run=run,
            instance=instance,
            execution_plan=plan,
            raise_on_error=True,
            retry_mode=RetryMode.ENABLED,
        ),
        log_manager=create_context_free_log_manager(instance, run),
        executor=StepDelegatingExecutor(handler, retries=RetryMode.ENABLED),
        output_capture=None,
    )
    args = ExecuteStepArgs(
        job_origin=recon.get_python_origin(),
        run_id=run.run_id,
        step_keys_to_execute=[step_key],
        instance_ref=instance.get_ref(),
        known_state=KnownExecutionState(
            previous_retry_attempts={step_key: attempt} if attempt else {}
        ),
    )
    return StepHandlerContext(
        instance=instance,
        plan_context=plan_context,
        steps=plan.steps,
        execute_step_args=args,
        dagster_run=run,
    )


def _events(instance, run_id, type_value):
    return [
        e
        for e in instance.all_logs(run_id)
        if e.dagster_event is not None and e.dagster_event.event_type_value == type_value
    ]


def test_handler_launches_retries_and_cleans_up_jobs(instance):
    batch, core = FakeBatchV1Api(), FakeCoreV1Api()
    settings = IrisSettings(launcher="kubernetes", max_retries_preemption=1, kubernetes=SETTINGS)
    handler = IrisStepHandler(settings, RetryMode.ENABLED, k8s_apis=(batch, core))
    job_def = jobs.k8s_job()
    run = instance.create_run_for_job(
        job_def, job_code_origin=dg.reconstructable(jobs.k8s_job).get_python_origin()
    )

    ctx = _handler_context(instance, job_def, run, "train_gpu", 0, handler)
    list(handler.launch_step(ctx))
    (created,) = [c for c in batch.calls if c[0] == "create_namespaced_job"]
    name = created[1]["name"]
    assert created[1]["namespace"] == "marin"
    job = batch.jobs[("marin", name)]
    assert job.spec.template.spec.containers[0].resources.limits["nvidia.com/gpu"] == "8"
    starting = _events(instance, run.run_id, "STEP_WORKER_STARTING")
    assert starting[0].dagster_event.engine_event_data.metadata["Kubernetes Job name"].value == name

    # Running on a node: healthy, and the node is logged once.
    core.add_pod("marin", name, client.V1PodStatus(phase="Running"), node="gke-h100-pool-7")
    assert handler.check_step_health(ctx).is_healthy
    assert handler.check_step_health(ctx).is_healthy
    node_logs = [
        e
        for e in instance.all_logs(run.run_id)
        if "runs on node gke-h100-pool-7" in (e.message or "")
    ]
    assert len(node_logs) == 1

    # Evicted: retried as a preemption (STEP_UP_FOR_RETRY in the log), still "healthy".
    job.status = client.V1JobStatus(failed=1)
    core.pods.clear()
    core.add_pod("marin", name, _pod_status(reason="Evicted", message="node drained"))
    assert handler.check_step_health(ctx).is_healthy
    (retry,) = _events(instance, run.run_id, "STEP_UP_FOR_RETRY")
    assert "Evicted" in retry.dagster_event.event_specific_data.error.message
    assert "preemption retry 1 of 1" in retry.dagster_event.event_specific_data.error.message

    # The executor relaunches it as attempt 1: a new Job name; preempted again -> out of retries.
    ctx1 = _handler_context(instance, job_def, run, "train_gpu", 1, handler)
    list(handler.launch_step(ctx1))
    name1 = [c for c in batch.calls if c[0] == "create_namespaced_job"][-1][1]["name"]
    assert name1 == f"{name}-1"
    batch.jobs[("marin", name1)].status = client.V1JobStatus(failed=1)
    health = handler.check_step_health(ctx1)
    assert not health.is_healthy
    assert (
        "node lost" in health.unhealthy_reason
        and "max_retries_preemption=1" in health.unhealthy_reason
    )

    # A TPU step that fails by its own exit code: not retried.
    ctx_tpu = _handler_context(instance, job_def, run, "train_tpu", 0, handler)
    list(handler.launch_step(ctx_tpu))
    tpu_name = [c for c in batch.calls if c[0] == "create_namespaced_job"][-1][1]["name"]
    assert (
        batch.jobs[("marin", tpu_name)].spec.template.spec.node_selector[
            "cloud.google.com/gke-tpu-topology"
        ]
        == "2x4"
    )
    batch.jobs[("marin", tpu_name)].status = client.V1JobStatus(failed=1)
    core.add_pod(
        "marin",
        tpu_name,
        _pod_status(
            container_statuses=[
                client.V1ContainerStatus(
                    name="dagster",
                    image="i",
                    image_id="",
                    ready=False,
                    restart_count=0,
                    state=client.V1ContainerState(
                        terminated=client.V1ContainerStateTerminated(exit_code=1)
                    ),
                )
            ]
        ),
    )
    health = handler.check_step_health(ctx_tpu)
    assert not health.is_healthy and "exited 1" in health.unhealthy_reason
    assert len(_events(instance, run.run_id, "STEP_UP_FOR_RETRY")) == 1

    # Cancelling: every Job of the run is deleted, by label.
    ctx_tpu2 = _handler_context(instance, job_def, run, "train_tpu", 0, handler)
    list(handler.launch_step(ctx_tpu2))
    assert len(batch.jobs) == 3
    list(handler.terminate_step(ctx_tpu2))
    assert batch.jobs == {}
    listed = [c for c in batch.calls if c[0] == "list_namespaced_job"]
    assert listed[-1][1]["label_selector"] == f"dagster/run-id={run.run_id},marin/iris=step"
    deleted = {c[1]["name"] for c in batch.calls if c[0] == "delete_namespaced_job"}
    assert deleted == {name, name1, tpu_name}


def test_kubernetes_launcher_refuses_an_instance_pods_cannot_reach(instance):
    settings = IrisSettings(
        launcher="kubernetes", kubernetes=KubernetesSettings(image="img:1")
    )  # require_shared_instance on
    batch, core = FakeBatchV1Api(), FakeCoreV1Api()
    handler = IrisStepHandler(settings, RetryMode.ENABLED, k8s_apis=(batch, core))
    job_def = jobs.k8s_job()
    run = instance.create_run_for_job(
        job_def, job_code_origin=dg.reconstructable(jobs.k8s_job).get_python_origin()
    )
    with pytest.raises(ResourceConfigError, match="Postgres.*SqliteRunStorage"):
        list(handler.launch_step(_handler_context(instance, job_def, run, "train_gpu", 0, handler)))
    assert batch.calls == []
