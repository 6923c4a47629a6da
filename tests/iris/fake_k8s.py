"""A recorded stand-in for the Kubernetes API (BatchV1Api / CoreV1Api).

No real cluster runs in these tests: there is no API server here. The fakes keep Jobs and Pods
as the `kubernetes` client's own models, answer the calls dagster-k8s and Iris make, and record
every call so tests can check what the launcher asked Kubernetes to do.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException


def _matches(labels: dict[str, str] | None, selector: str | None) -> bool:
    if not selector:
        return True
    labels = labels or {}
    return all(labels.get(k) == v for k, v in (term.split("=", 1) for term in selector.split(",")))


class FakeBatchV1Api:
    def __init__(self) -> None:
        self.jobs: dict[tuple[str, str], client.V1Job] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def create_namespaced_job(
        self, body: client.V1Job, namespace: str, **kwargs: Any
    ) -> client.V1Job:
        self.calls.append(
            ("create_namespaced_job", {"name": body.metadata.name, "namespace": namespace})
        )
        body.status = client.V1JobStatus(active=1)
        body.metadata.uid = f"uid-{body.metadata.name}"
        self.jobs[(namespace, body.metadata.name)] = body
        return body

    def read_namespaced_job_status(self, name: str, namespace: str, **kwargs: Any) -> client.V1Job:
        self.calls.append(("read_namespaced_job_status", {"name": name, "namespace": namespace}))
        if (namespace, name) not in self.jobs:
            raise ApiException(status=404, reason="Not Found")
        return self.jobs[(namespace, name)]

    def list_namespaced_job(
        self, namespace: str, label_selector: str | None = None, **kwargs: Any
    ) -> client.V1JobList:
        self.calls.append(
            ("list_namespaced_job", {"namespace": namespace, "label_selector": label_selector})
        )
        items = [
            j
            for (ns, _), j in self.jobs.items()
            if ns == namespace and _matches(j.metadata.labels, label_selector)
        ]
        return client.V1JobList(items=items)

    def delete_namespaced_job(self, name: str, namespace: str, **kwargs: Any) -> None:
        self.calls.append(
            ("delete_namespaced_job", {"name": name, "namespace": namespace, **kwargs})
        )
        if self.jobs.pop((namespace, name), None) is None:
            raise ApiException(status=404, reason="Not Found")


class FakeCoreV1Api:
    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], client.V1Pod] = {}
        self.services: dict[tuple[str, str], client.V1Service] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def create_namespaced_service(
        self, namespace: str, body: client.V1Service, **kwargs: Any
    ) -> client.V1Service:
        self.calls.append(
            ("create_namespaced_service", {"name": body.metadata.name, "namespace": namespace})
        )
        self.services[(namespace, body.metadata.name)] = body
        return body

    def add_pod(
        self, namespace: str, job_name: str, status: client.V1PodStatus, node: str = "gke-node-1"
    ) -> None:
        name = f"{job_name}-x1"
        self.pods[(namespace, name)] = client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels={"job-name": job_name}),
            spec=client.V1PodSpec(containers=[], node_name=node),
            status=status,
        )

    def list_namespaced_pod(
        self, namespace: str, label_selector: str | None = None, **kwargs: Any
    ) -> client.V1PodList:
        self.calls.append(
            ("list_namespaced_pod", {"namespace": namespace, "label_selector": label_selector})
        )
        items = [
            p
            for (ns, _), p in self.pods.items()
            if ns == namespace and _matches(p.metadata.labels, label_selector)
        ]
        return client.V1PodList(items=items)

    def delete_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> None:
        self.calls.append(("delete_namespaced_pod", {"name": name, "namespace": namespace}))
        self.pods.pop((namespace, name), None)
