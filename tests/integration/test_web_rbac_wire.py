"""gpu-bridge web's identity is read-only on the real control plane (``kube_plane``): with the
ServiceAccount token of deploy/kubernetes/web-rbac.yaml (applied exactly), the real authorizer
lets it read what the web view reads (nodes, serving pods and Deployments, node Events) and
refuses every write: patching a node (the daemon's fence), creating a pod or a batch Job,
scaling the Deployment, evicting a pod, writing an Event or taking the Lease."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.adapters.kube.client import api_client_from_config
from bridge.adapters.kube.events import NodeEventReader
from gpu_bridge_lab.sandbox.realkube.component import WEB_RBAC_MANIFEST, apply_rbac

pytestmark = pytest.mark.integration
SERVING_NS = "llm-serving"


@pytest.fixture(scope="module")
def web_api(kube_plane: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, str]]:
    """(the web view's API client, the admin's, a node name) on the shared control plane."""
    from kubernetes import client as k8s

    admin = api_client_from_config(kubeconfig=str(kube_plane.kubeconfig))
    core = k8s.CoreV1Api(admin)
    node = "w" + uuid.uuid4().hex[:6] + "-gpu-node"
    for ns in (SERVING_NS,):
        try:
            core.create_namespace({"metadata": {"name": ns}}, _preload_content=False)
        except k8s.ApiException as e:
            if e.status != 409:
                raise
    apply_rbac(admin, WEB_RBAC_MANIFEST, serving_namespaces=[SERVING_NS])
    core.create_node({"metadata": {"name": node, "labels": {}}}, _preload_content=False)
    token = core.create_namespaced_service_account_token(
        "gpu-bridge-web", "gpu-bridge", {"spec": {"expirationSeconds": 3600}}).status.token
    doc = yaml.safe_load(Path(kube_plane.kubeconfig).read_text())
    doc["users"] = [{"name": "web", "user": {"token": token}}]
    for ctx in doc["contexts"]:
        ctx["context"]["user"] = "web"
    path = tmp_path_factory.mktemp("web-kube") / "kubeconfig-web"
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    web = api_client_from_config(kubeconfig=str(path))
    try:
        yield web, admin, node
    finally:
        web.close()
        try:
            core.delete_node(node, _preload_content=False)
        except Exception:  # noqa: BLE001 - cleanup is best effort
            pass
        admin.close()


def status_of(call: Any) -> int:
    from kubernetes.client.exceptions import ApiException

    try:
        call()
    except ApiException as e:
        return int(e.status)
    return 200


def test_the_web_identity_reads_what_the_view_reads(web_api: tuple[Any, Any, str]) -> None:
    from kubernetes import client as k8s

    web, _, node = web_api
    core, apps = k8s.CoreV1Api(web), k8s.AppsV1Api(web)
    assert status_of(lambda: core.list_node(_preload_content=False)) == 200
    assert status_of(lambda: core.read_node(node, _preload_content=False)) == 200
    assert status_of(lambda: core.list_namespaced_pod(SERVING_NS, _preload_content=False)) == 200
    assert status_of(lambda: apps.list_namespaced_deployment(SERVING_NS, _preload_content=False)) == 200
    assert NodeEventReader(web).node_events("GpuBridgeJobPreempted") == ()  # the LIST is allowed


@pytest.mark.parametrize(
    "write",
    ["patch-node", "create-pod", "create-batch-job", "scale-deployment", "evict-pod", "create-event", "create-lease",
     "read-secret", "pods-outside-serving"],
)
def test_the_web_identity_cannot_write(web_api: tuple[Any, Any, str], write: str) -> None:
    from kubernetes import client as k8s

    web, _, node = web_api
    core, apps, batch = k8s.CoreV1Api(web), k8s.AppsV1Api(web), k8s.BatchV1Api(web)
    coord = k8s.CoordinationV1Api(web)
    pod = {"metadata": {"name": "web-made"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    calls = {
        "patch-node": lambda: core.patch_node(node, {"spec": {"unschedulable": True}}, _preload_content=False),
        "create-pod": lambda: core.create_namespaced_pod(SERVING_NS, pod, _preload_content=False),
        "create-batch-job": lambda: batch.create_namespaced_job(SERVING_NS, {
            "metadata": {"name": "web-made"}, "spec": {"template": {"spec": {**pod["spec"], "restartPolicy": "Never"}}}},
            _preload_content=False),
        "scale-deployment": lambda: apps.patch_namespaced_deployment_scale("vllm", SERVING_NS, {"spec": {"replicas": 0}},
                                                                           _preload_content=False),
        "evict-pod": lambda: core.create_namespaced_pod_eviction("any", SERVING_NS, {"metadata": {"name": "any"}},
                                                                 _preload_content=False),
        "create-event": lambda: core.create_namespaced_event("default", {
            "metadata": {"name": "web-made"}, "involvedObject": {"kind": "Node", "name": node}, "reason": "X"},
            _preload_content=False),
        "create-lease": lambda: coord.create_namespaced_lease("gpu-bridge", {"metadata": {"name": "gpu-bridge"}},
                                                               _preload_content=False),
        "read-secret": lambda: core.list_namespaced_secret("gpu-bridge", _preload_content=False),
        "pods-outside-serving": lambda: core.list_namespaced_pod("kube-system", _preload_content=False),
    }
    assert status_of(calls[write]) == 403
