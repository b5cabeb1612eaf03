"""Support (no tests here) for the Kubernetes adapter and leader integration tests: a sandbox
``KubeServer`` on a free port, a kubeconfig for it, and seeding through the official client
(the same requests would seed a real cluster)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from bridge import wellknown as wk


def kube_server_class() -> Any:
    try:
        from bridge.sandbox.kube import KubeServer  # type: ignore[attr-defined]
    except ImportError:
        pytest.skip("the sandbox KubeServer (bridge.sandbox.kube) is not available yet")
    return KubeServer


def start_server(tmp: Path) -> Iterator[tuple[Any, Path]]:
    cls = kube_server_class()
    server = cls(port=0)
    start = getattr(server, "start", None)
    if callable(start):
        start()
    kubeconfig = tmp / "kubeconfig"
    server.write_kubeconfig(str(kubeconfig))
    try:
        yield server, kubeconfig
    finally:
        server.stop()


def wait_for(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not met within {timeout} s")
        time.sleep(0.05)


def ensure_namespace(api: k8s.ApiClient, name: str) -> None:
    try:
        k8s.CoreV1Api(api).create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    except ApiException as e:
        if e.status != 409:
            raise


def seed_node(api: k8s.ApiClient, name: str, pool: str, *, gpus: int = 4, taints: list[dict[str, str]] | None = None, unschedulable: bool = False) -> None:
    core = k8s.CoreV1Api(api)
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {wk.LABEL_POOL: pool, "kubernetes.io/hostname": name}},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
    }
    core.create_node(body)
    status = {
        "status": {
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110", wk.GPU_RESOURCE: str(gpus)},
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110", wk.GPU_RESOURCE: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "sandbox"}],
        }
    }
    core.patch_node_status(name, status)


def seed_deployment(api: k8s.ApiClient, namespace: str, name: str, pool: str, replicas: int, *, grace_s: int = 1) -> None:
    ensure_namespace(api, namespace)
    labels = {"app": name, "pool": pool}
    k8s.AppsV1Api(api).create_namespaced_deployment(
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": {wk.LABEL_POOL: pool},
                        "terminationGracePeriodSeconds": grace_s,
                        "containers": [{"name": "vllm", "image": "vllm/vllm-openai", "resources": {"limits": {wk.GPU_RESOURCE: "4"}}}],
                    },
                },
            },
        },
    )


def seed_pdb(api: k8s.ApiClient, namespace: str, name: str, labels: dict[str, str], min_available: int) -> None:
    k8s.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
        namespace,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": labels}},
        },
    )
