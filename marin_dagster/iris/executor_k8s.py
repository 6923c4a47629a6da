"""The Kubernetes launcher: one dagster-k8s Job per accelerator step, found again by labels.

Jobs are rendered by dagster-k8s (`construct_dagster_k8s_job`) from three layers merged in
order: the deployment (K8sRunLauncher settings when the instance has one, else
`KubernetesSettings`), the step's `dagster-k8s/config` op tag (limits, node selectors,
tolerations from its ResourceConfig) and Iris's own additions (labels, TTL, placement env).
Secrets only ever enter pods as `envFrom.secretRef` or `valueFrom.secretKeyRef`.

A multi-host step (`gpu:h100x8 replicas=2`, `tpu:v5e-16`: `ResourceConfig.num_processes` > 1)
is one indexed Job (`completionMode: Indexed`, completions = parallelism = the number of hosts,
each pod asking for one host's devices) and a headless Service of the Job's name, its pods'
`subdomain`, so pod 0 is reachable as `{job}-0.{job}`: that is the coordinator address each
pod is given (`MARIN_COORDINATOR_ADDRESS`), with `MARIN_NUM_PROCESSES` and `MARIN_PROCESS_ID`
(the pod's completion index). The Job succeeds when index 0 (the Dagster step) does
(`successPolicy`); any pod failing fails the Job, the Job controller stops the other pods, and
Iris retries the step as its policy says. The Service is owned by the Job and goes with it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kubernetes
from dagster_k8s.client import DagsterKubernetesClient
from dagster_k8s.container_context import K8sContainerContext
from dagster_k8s.job import (
    DagsterK8sJobConfig,
    UserDefinedDagsterK8sConfig,
    construct_dagster_k8s_job,
    get_k8s_job_name,
    get_user_defined_k8s_config,
)
from dagster_k8s.launcher import K8sRunLauncher

from marin_dagster.iris import placement
from marin_dagster.iris.processes import COORDINATOR_ENV, NUM_PROCESSES_ENV, PROCESS_ID_ENV
from marin_dagster.iris.resource_config import (
    ResourceConfig,
    ResourceConfigError,
    TpuConfig,
)
from marin_dagster.iris.settings import KubernetesSettings

logger = logging.getLogger(__name__)

RUN_ID_LABEL = "dagster/run-id"
STEP_LABEL = "marin/iris-step"
ATTEMPT_LABEL = "marin/iris-attempt"
MANAGED_LABEL = "marin/iris"

# Pod conditions/reasons Kubernetes uses when a pod is taken away rather than failing itself.
_PREEMPTION_REASONS = {
    "Evicted",
    "Preempting",
    "NodeLost",
    "Shutdown",
    "NodeShutdown",
    "Terminated",
    "DeletionByTaintManager",
    "DeletionByPodGC",
    "TerminationByKubelet",
}


@dataclass(frozen=True)
class JobState:
    """What became of a step Job: running, succeeded, preempted, failed or missing."""

    phase: str
    reason: str = ""


def step_job_name(run_id: str, step_key: str, attempt: int) -> str:
    name = f"iris-step-{get_k8s_job_name(run_id, step_key)}"
    return f"{name}-{attempt}" if attempt else name


def _sanitize_label(value: str) -> str:
    from dagster_k8s.utils import sanitize_k8s_label

    return sanitize_k8s_label(value)


class KubernetesLauncher:
    """Creates, watches and deletes step Jobs through a DagsterKubernetesClient."""

    def __init__(
        self,
        settings: KubernetesSettings,
        batch_api: Any | None = None,
        core_api: Any | None = None,
    ) -> None:
        self.settings = settings
        if batch_api is None or core_api is None:
            if settings.load_incluster_config:
                kubernetes.config.load_incluster_config()
            else:
                kubernetes.config.load_kube_config(settings.kubeconfig_file)
        self.client = DagsterKubernetesClient.production_client(
            batch_api_override=batch_api, core_api_override=core_api
        )

    # -- rendering -------------------------------------------------------------------------

    def container_context(
        self,
        run: Any,
        run_launcher: Any,
        step_tags: Mapping[str, str],
        extra_env: Sequence[Mapping[str, Any]],
        labels: Mapping[str, str],
        request: ResourceConfig,
        job_name: str | None = None,
    ) -> K8sContainerContext:
        s = self.settings
        base = K8sContainerContext(
            image_pull_policy=s.image_pull_policy,
            service_account_name=s.service_account_name,
            env_config_maps=list(s.env_config_maps),
            env_secrets=list(s.env_secrets),
            volumes=list(s.volumes),
            volume_mounts=list(s.volume_mounts),
            labels=dict(s.labels),
            namespace=s.namespace,
            run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(dict(s.step_k8s_config)),
        )
        if isinstance(run_launcher, K8sRunLauncher):
            # The deployment's own settings (Helm values) come first; ours refine them.
            base = K8sContainerContext.create_for_run(
                run, run_launcher, include_run_tags=False
            ).merge(base)
        additions = {
            "container_config": {
                "env": [
                    *[{"name": k, "value": v} for k, v in sorted(s.env.items())],
                    *s.secret_env_vars(),
                    *extra_env,
                ]
            },
            "job_spec_config": {
                "ttl_seconds_after_finished": s.ttl_seconds_after_finished,
                # Iris decides about retries (preemption vs. failure), not the Job controller.
                "backoff_limit": 0,
            },
            "job_metadata": {"labels": dict(labels)},
            "pod_template_spec_metadata": {"labels": dict(labels)},
        }
        n = request.num_processes
        if n > 1:
            additions["job_spec_config"].update(
                {
                    "completion_mode": "Indexed",
                    "completions": n,
                    "parallelism": n,
                    # Done when process 0, the Dagster step, is done: the others are stopped.
                    "success_policy": {"rules": [{"succeeded_indexes": "0"}]},
                }
            )
            # Pod i is {job}-{i}.{job}: the headless Service of the same name.
            additions["pod_spec_config"] = {"subdomain": job_name}
        return base.merge(
            K8sContainerContext(run_k8s_config=get_user_defined_k8s_config(dict(step_tags)))
        ).merge(
            K8sContainerContext(run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(additions))
        )

    def render_job(
        self,
        *,
        run: Any,
        run_launcher: Any,
        step_key: str,
        attempt: int,
        step_tags: Mapping[str, str],
        command: Sequence[str],
        command_env: Sequence[Mapping[str, Any]],
        image: str | None,
    ) -> tuple[kubernetes.client.V1Job, str]:
        """The V1Job for one step attempt, and its namespace."""
        request = ResourceConfig.from_op_tags(step_tags)
        job_name = step_job_name(run.run_id, step_key, attempt)
        labels = {
            RUN_ID_LABEL: run.run_id,
            "dagster/job": run.job_name,
            "dagster/op": step_key,
            STEP_LABEL: step_key,
            ATTEMPT_LABEL: str(attempt),
            MANAGED_LABEL: "step",
        }
        extra_env = [
            *command_env,
            {"name": "DAGSTER_RUN_JOB_NAME", "value": run.job_name},
            {"name": "DAGSTER_RUN_STEP_KEY", "value": step_key},
            {"name": placement.REQUESTED_ENV, "value": request.to_string()},
            {"name": placement.LAUNCHER_ENV, "value": "kubernetes"},
            {"name": placement.ATTEMPT_ENV, "value": str(attempt)},
            {"name": placement.K8S_JOB_ENV, "value": job_name},
            {
                "name": placement.HOST_ENV,
                "value_from": {"field_ref": {"field_path": "spec.nodeName"}},
            },
            {
                "name": placement.K8S_POD_ENV,
                "value_from": {"field_ref": {"field_path": "metadata.name"}},
            },
            {"name": placement.ASSIGNED_DEVICES_ENV, "value": _assigned_devices(request)},
            *self.process_env(request, job_name),
        ]
        context = self.container_context(
            run, run_launcher, step_tags, extra_env, labels, request, job_name
        )
        if isinstance(run_launcher, K8sRunLauncher):
            job_config = context.get_k8s_job_config(image, run_launcher)
        else:
            job_config = DagsterK8sJobConfig(
                job_image=image,
                dagster_home=self.settings.dagster_home,
                postgres_password_secret=self.settings.postgres_password_secret,
            )
        if not job_config.job_image:
            raise ResourceConfigError(
                f"step {step_key!r}: no image for its Kubernetes Job; set IrisResource "
                f"kubernetes.image (or run under a K8sRunLauncher / a code location with an image)"
            )
        job = construct_dagster_k8s_job(
            job_config=job_config,
            args=list(command),
            job_name=job_name,
            pod_name=job_name,
            component="iris_step",
            user_defined_k8s_config=context.run_k8s_config,
            labels={k: _sanitize_label(v) for k, v in labels.items()},
        )
        return job, context.namespace or self.settings.namespace

    def process_env(self, request: ResourceConfig, job_name: str) -> list[dict[str, Any]]:
        """A multi-host step's env: the process count, pod 0's address, the pod's index."""
        if request.num_processes == 1:
            return []
        return [
            {"name": NUM_PROCESSES_ENV, "value": str(request.num_processes)},
            {
                "name": COORDINATOR_ENV,
                "value": f"{job_name}-0.{job_name}:{self.settings.coordinator_port}",
            },
            {
                "name": PROCESS_ID_ENV,
                "value_from": {
                    "field_ref": {
                        "field_path": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                    }
                },
            },
        ]

    def render_service(self, job: kubernetes.client.V1Job) -> kubernetes.client.V1Service:
        """The headless Service that names an indexed Job's pods (`{job}-{i}.{job}`), owned by
        the Job (deleted with it). The Job must have been created (its uid is set)."""
        name = job.metadata.name
        return kubernetes.client.V1Service(
            api_version="v1",
            kind="Service",
            metadata=kubernetes.client.V1ObjectMeta(
                name=name,
                labels=dict(job.metadata.labels or {}),
                owner_references=[
                    kubernetes.client.V1OwnerReference(
                        api_version="batch/v1",
                        kind="Job",
                        name=name,
                        uid=job.metadata.uid,
                        controller=False,
                    )
                ],
            ),
            spec=kubernetes.client.V1ServiceSpec(
                cluster_ip="None",
                selector={"job-name": name},
                # Pods are addressable before they are ready: process 0 serves the coordinator
                # before anything could call it ready.
                publish_not_ready_addresses=True,
                ports=[
                    kubernetes.client.V1ServicePort(
                        name="coordinator", port=self.settings.coordinator_port
                    )
                ],
            ),
        )

    # -- API calls ---------------------------------------------------------------------------

    def create(self, job: kubernetes.client.V1Job, namespace: str) -> None:
        self.client.create_namespaced_job_with_retries(body=job, namespace=namespace)
        if job.spec.completion_mode == "Indexed":
            created = self.client.batch_api.read_namespaced_job_status(
                name=job.metadata.name, namespace=namespace
            )
            self.client.core_api.create_namespaced_service(
                namespace=namespace, body=self.render_service(created)
            )

    def state(self, job_name: str, namespace: str, processes: int = 1) -> JobState:
        status = self.client.get_job_status(job_name=job_name, namespace=namespace)
        if status is None:
            return JobState("missing", f"Kubernetes Job {job_name} was not found")
        if processes > 1:
            # An indexed Job counts each pod that succeeded; it is done when its success
            # policy (index 0) is met.
            if any(
                c.type in ("Complete", "SuccessCriteriaMet") and c.status == "True"
                for c in status.conditions or []
            ):
                return JobState("succeeded")
        elif status.succeeded:
            return JobState("succeeded")
        if not status.failed:
            return JobState("running")
        pods = self.client.core_api.list_namespaced_pod(
            namespace=namespace, label_selector=f"job-name={job_name}"
        ).items
        return classify_failed_pods(job_name, pods)

    def delete(self, job_name: str, namespace: str) -> None:
        self.client.delete_job(job_name=job_name, namespace=namespace)

    def delete_run_jobs(self, run_id: str, namespace: str) -> list[str]:
        """Delete every step Job (and its pods) of a run; returns the deleted Job names."""
        selector = f"{RUN_ID_LABEL}={_sanitize_label(run_id)},{MANAGED_LABEL}=step"
        jobs = self.client.batch_api.list_namespaced_job(
            namespace=namespace, label_selector=selector
        ).items
        names = [j.metadata.name for j in jobs]
        for name in names:
            self.client.batch_api.delete_namespaced_job(
                name=name, namespace=namespace, propagation_policy="Foreground"
            )
        return names


def classify_failed_pods(job_name: str, pods: Sequence[Any]) -> JobState:
    """A failed Job's pods say whether it was preempted (evicted, node lost, SIGTERM) or failed."""
    if not pods:
        # Pods vanish with their node (node lost, Spot reclaim) before the Job records why.
        return JobState(
            "preempted", f"Kubernetes Job {job_name} failed and its pod is gone (node lost)"
        )
    # Any preempted pod first: in a multi-host Job the other pods fail because it is gone.
    for pod in pods:
        status = pod.status
        if status is None:
            continue
        if status.reason in _PREEMPTION_REASONS:
            return JobState(
                "preempted",
                f"pod {pod.metadata.name}: {status.reason} {status.message or ''}".strip(),
            )
        for condition in status.conditions or []:
            if condition.type == "DisruptionTarget" and condition.status == "True":
                return JobState(
                    "preempted", f"pod {pod.metadata.name}: {condition.reason or 'disrupted'}"
                )
        for cs in status.container_statuses or []:
            terminated = cs.state.terminated if cs.state else None
            if terminated and terminated.exit_code == 143:
                return JobState(
                    "preempted", f"pod {pod.metadata.name}: container got SIGTERM (exit 143)"
                )
    for pod in pods:
        status = pod.status
        if status is None:
            continue
        for cs in status.container_statuses or []:
            terminated = cs.state.terminated if cs.state else None
            if terminated and terminated.exit_code:
                return JobState(
                    "failed",
                    f"pod {pod.metadata.name}: container exited {terminated.exit_code} ({terminated.reason or 'Error'})",
                )
    return JobState("failed", f"Kubernetes Job {job_name} failed")


def _assigned_devices(request: ResourceConfig) -> str:
    if not request.needs_accelerator:
        return ""
    device = request.device
    if isinstance(device, TpuConfig):
        return f"tpu:{device.variant} ({device.chips_per_host} chips, topology {device.topology})"
    return f"{device.spec()} (nvidia.com/gpu={device.count})"
