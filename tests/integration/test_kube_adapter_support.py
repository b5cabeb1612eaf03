"""Support (no tests here) for the Kubernetes adapter and leader integration tests: a corner of
the session's real control plane (``kube_plane``) for one test (its own namespace, pool and
node names), the lab's fault proxy in front of it, and seeding through the official client
(the same requests would seed any cluster)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from bridge import wellknown as wk
from bridge.adapters.kube.client import api_client_from_config
from gpu_bridge_lab.sandbox.faultproxy import FaultProxy, proxied_kubeconfig  # noqa: F401 (re-exported for the tests)


@dataclass
class Corner:
    """One test's part of the shared control plane: names made unique by ``prefix`` so tests
    never see each other's nodes, pods or Leases; ``close()`` deletes what it made."""

    plane: Any  # the Sandbox running the control plane
    api: k8s.ApiClient
    prefix: str = field(default_factory=lambda: "t" + uuid.uuid4().hex[:6])
    nodes: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)

    @property
    def kubeconfig(self) -> Path:
        return Path(self.plane.kubeconfig)

    @property
    def port(self) -> int:
        return int(self.plane.ports["kube"])

    def name(self, base: str) -> str:
        return f"{self.prefix}-{base}"

    def close(self) -> None:
        core = k8s.CoreV1Api(self.api)
        for n in self.nodes:
            try:
                core.delete_node(n, _request_timeout=5)
            except Exception:  # noqa: BLE001 - cleanup is best effort
                pass
        for ns in self.namespaces:
            try:
                core.delete_namespace(ns, _request_timeout=5)
            except Exception:  # noqa: BLE001
                pass
        self.api.close()


@pytest.fixture
def corner(kube_plane: Any) -> Iterator[Corner]:
    c = Corner(kube_plane, api_client_from_config(kubeconfig=str(kube_plane.kubeconfig)))
    try:
        yield c
    finally:
        c.close()


def kubectl() -> str:
    """$GPU_BRIDGE_KUBECTL (scripts/test_kubectl_debian12.sh), else the kubectl built with the
    control plane, of its release."""
    import os

    from gpu_bridge_lab.sandbox.realkube import find_binaries

    return os.environ.get("GPU_BRIDGE_KUBECTL") or str(find_binaries().kubectl)


def wait_for(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not met within {timeout} s")
        time.sleep(0.05)


def raw(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a client method and return the JSON as a dict: the v37 client's pydantic models
    reject objects with optional fields missing (a Node without nodeInfo.bootID, ...)."""
    resp = fn(*args, _preload_content=False, **kwargs)
    try:
        return json.loads(resp.data)
    finally:
        resp.release_conn()


def ensure_namespace(api: k8s.ApiClient, name: str, corner: Corner | None = None) -> None:
    """The namespace and its ``default`` ServiceAccount (the real admission plugin refuses pods
    until that exists; the controller makes it, but the ReplicaSet controller backs off)."""
    core = k8s.CoreV1Api(api)
    for create in (lambda: raw(core.create_namespace, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
                   lambda: raw(core.create_namespaced_service_account, name, {"metadata": {"name": "default"}})):
        try:
            create()
        except ApiException as e:
            if e.status != 409:
                raise
    if corner is not None and name not in corner.namespaces:
        corner.namespaces.append(name)


def seed_node(api: k8s.ApiClient, name: str, pool: str | None, *, gpus: int = 4, taints: list[dict[str, str]] | None = None,
              unschedulable: bool = False, labels: dict[str, str] | None = None, corner: Corner | None = None,
              wait: bool = True) -> None:
    """A GPU node, Ready (kwok keeps it so: --manage-all-nodes). With ``wait``, returns once the
    node lifecycle controller has lifted the ``node.kubernetes.io/not-ready`` taint every new
    node is created with (until then the scheduler places nothing there)."""
    core = k8s.CoreV1Api(api)
    all_labels = {"kubernetes.io/hostname": name, **({wk.LABEL_POOL: pool} if pool else {}), **(labels or {})}
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
    }
    raw(core.create_node, body)
    if corner is not None:
        corner.nodes.append(name)
    res = {"cpu": "32", "memory": "256Gi", "pods": "110", wk.GPU_RESOURCE: str(gpus)}
    ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    raw(core.patch_node_status, name, {"status": {"capacity": res, "allocatable": res, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "sandbox",
         "lastHeartbeatTime": ts, "lastTransitionTime": ts}]}})
    if wait:
        wait_for(lambda: not any(t["key"].startswith("node.kubernetes.io/")
                                 for t in raw(core.read_node, name)["spec"].get("taints") or []),
                 timeout=20, what=f"node {name}: the not-ready taint lifted")


def seed_deployment(api: k8s.ApiClient, namespace: str, name: str, pool: str, replicas: int, *, grace_s: int = 1,
                    corner: Corner | None = None) -> None:
    ensure_namespace(api, namespace, corner)
    labels = {"app": name, "pool": pool}
    raw(
        k8s.AppsV1Api(api).create_namespaced_deployment,
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
                        "containers": [{"name": "vllm", "image": "vllm/vllm-openai",
                                        "resources": {"requests": {wk.GPU_RESOURCE: "4"}, "limits": {wk.GPU_RESOURCE: "4"}}}],
                    },
                },
            },
        },
    )


def seed_pdb(api: k8s.ApiClient, namespace: str, name: str, labels: dict[str, str], min_available: int) -> None:
    raw(
        k8s.PolicyV1Api(api).create_namespaced_pod_disruption_budget,
        namespace,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": labels}},
        },
    )


def outage(proxy: FaultProxy, seconds: float) -> None:
    """Drop every connection through ``proxy`` and refuse new ones for ``seconds``."""
    proxy.set_mode("refuse")

    def back() -> None:
        time.sleep(seconds)
        proxy.set_mode("pass")

    threading.Thread(target=back, daemon=True).start()


def serving_side(c: Corner, *, nodes: int, spare_nodes: int = 0, grace_s: int = 30, timeout_s: float = 60.0) -> Any:
    """A whole serving side in this corner (gpu_bridge_lab.sandbox.realkube.serving_model):
    ``nodes`` GPU nodes with one vLLM replica each plus ``spare_nodes`` empty ones, the
    Deployment and its PDB, every replica available. Returns the ServingModel."""
    from gpu_bridge_lab.sandbox.realkube.serving_model import ServingModel, seed_serving, wait_serving_ready

    m = ServingModel(nodes=nodes, pool=c.name("pool"), namespace=c.name("serving"), node_prefix=c.name("gpu-node-"),
                     termination_grace_s=grace_s)
    c.namespaces.append(m.namespace)
    c.nodes.extend(m.node_names(spare_nodes))
    seed_serving(c.api, m, spare_nodes=spare_nodes)
    assert wait_serving_ready(c.api, m, timeout_s), f"{m.want_replicas} vLLM replicas not available in {timeout_s} s"
    return m
