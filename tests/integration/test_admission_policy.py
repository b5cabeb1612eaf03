"""deploy/kubernetes/admission-policy.yaml on the real control plane (``kube_plane``, Kubernetes
v1.36, which applies it with rbac.yaml): as the daemon's ServiceAccount, whose RBAC allows
patching any node and any pod of its serving namespace, the patches the daemon never makes are
refused by the ValidatingAdmissionPolicy (a pod's image, a label it does not own, a cordon of a
node outside the pools, a NoExecute taint under its key, the pool label, a pod label), while
the daemon's own writes, made by its real Kubernetes adapter, go through. The same forbidden
patches as the cluster admin pass: the policy binds the daemon only."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from bridge import wellknown as wk
from bridge.adapters.kube.client import KubeAdapter, api_client_from_config
from bridge.adapters.protocols import PoolTarget
from bridge.model import Phase, Pin
from test_kube_adapter_support import Corner, corner, ensure_namespace, raw, seed_node, wait_for  # noqa: F401 (corner: fixture)

pytestmark = pytest.mark.integration


class World:
    def __init__(self, c: Corner, daemon: k8s.ApiClient) -> None:
        self.c, self.daemon = c, daemon
        self.pool, self.ns = c.name("pool"), c.name("serving")
        self.node, self.outside, self.pod = c.name("gpu-node-01"), c.name("cpu-node-01"), c.name("vllm-0")

    def patch(self, api: k8s.ApiClient, kind: str, name: str, body: dict[str, Any]) -> Any:
        core = k8s.CoreV1Api(api)
        if kind == "node":
            return raw(core.patch_node, name, body)
        return raw(core.patch_namespaced_pod, name, self.ns, body)

    def refused(self, kind: str, name: str, body: dict[str, Any]) -> str:
        """Patch as the daemon; the policy's message (fails if the patch went through)."""
        try:
            self.patch(self.daemon, kind, name, body)
        except ApiException as e:
            assert e.status in (403, 422), (e.status, e.body)
            msg = json.loads(e.body)["message"]
            assert "ValidatingAdmissionPolicy 'gpu-bridge-writes'" in msg, msg
            return str(msg)
        raise AssertionError(f"{kind} {name}: {body} accepted")


@pytest.fixture
def world(corner: Corner, kube_plane: Any) -> Iterator[World]:
    daemon = api_client_from_config(kubeconfig=str(kube_plane.daemon_kubeconfig))
    w = World(corner, daemon)
    seed_node(corner.api, w.node, w.pool, corner=corner, wait=False)
    seed_node(corner.api, w.outside, None, corner=corner, wait=False)
    ensure_namespace(corner.api, w.ns, corner)
    rbac = k8s.RbacAuthorizationV1Api(corner.api)
    # rbac.yaml's per-serving-namespace RoleBinding, for this namespace
    raw(rbac.create_namespaced_role_binding, w.ns, {
        "metadata": {"name": "gpu-bridge-serving"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpu-bridge-serving"},
        "subjects": [{"kind": "ServiceAccount", "name": "gpu-bridge", "namespace": "gpu-bridge"}],
    })
    raw(k8s.CoreV1Api(corner.api).create_namespaced_pod, w.ns, {
        "metadata": {"name": w.pod, "labels": {"app": "vllm"}},
        "spec": {"nodeName": w.node, "containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
    })
    try:
        _wait_in_force(w)
        yield w
    finally:
        daemon.close()


def _wait_in_force(w: World) -> None:
    """Until the apiserver has loaded the policy (applied at start-up with rbac.yaml; a plane
    just started may take a moment): a dry-run cordon of the node outside the pools, as the
    daemon, refused. Dry run: a probe that went through must not change what the test sees."""
    core = k8s.CoreV1Api(w.daemon)

    def refused() -> bool:
        try:
            raw(core.patch_node, w.outside, {"spec": {"unschedulable": True}}, dry_run="All")
        except ApiException as e:
            return e.status in (403, 422) and "gpu-bridge-writes" in (e.body or "")
        return False

    wait_for(refused, timeout=30, what="the admission policy in force")


FORBIDDEN: list[tuple[str, str, Callable[[World], dict[str, Any]], str]] = [
    ("pod-image", "pod", lambda w: {"spec": {"containers": [{"name": "vllm", "image": "evil/miner"}]}},
     "gpu-bridge may not change a pod's spec"),
    ("pod-label", "pod", lambda w: {"metadata": {"labels": {"app": "other"}}}, "only gpu-bridge.io/* labels"),
    ("pod-annotation", "pod", lambda w: {"metadata": {"annotations": {"prometheus.io/scrape": "false"}}},
     "only gpu-bridge.io/* annotations"),
    ("node-label", "node", lambda w: {"metadata": {"labels": {"topology.kubernetes.io/zone": "elsewhere"}}},
     "only gpu-bridge.io/* labels"),
    ("node-pool-label", "node", lambda w: {"metadata": {"labels": {wk.LABEL_POOL: "another-pool"}}},
     "never gpu-bridge.io/pool"),
    ("node-no-execute", "node", lambda w: {"spec": {"taints": [{"key": wk.TAINT_KEY, "effect": "NoExecute"}]}},
     "its own taint gpu-bridge.io/lent (effect NoSchedule)"),
    ("node-foreign-taint", "node", lambda w: {"spec": {"taints": [{"key": "example.com/x", "effect": "NoSchedule"}]}},
     "its own taint gpu-bridge.io/lent"),
    ("outside-cordon", "outside", lambda w: {"spec": {"unschedulable": True}}, "may write only pool nodes"),
]


@pytest.mark.parametrize("what, kind, body, said", FORBIDDEN, ids=[f[0] for f in FORBIDDEN])
def test_the_daemon_account_cannot_make_a_patch_the_daemon_never_makes(
    world: World, what: str, kind: str, body: Callable[[World], dict[str, Any]], said: str
) -> None:
    name = {"pod": world.pod, "node": world.node, "outside": world.outside}[kind]
    msg = world.refused("node" if kind == "outside" else kind, name, body(world))
    assert said in msg, msg
    # the admin may: the policy binds the daemon's ServiceAccount only
    world.patch(world.c.api, "node" if kind == "outside" else kind, name, body(world))


def test_the_daemons_own_writes_go_through(world: World) -> None:
    kube = KubeAdapter(world.daemon, pools=[PoolTarget(world.pool, world.ns, "vllm", pod_selector="app=vllm")], identity="vap-test",
                       watch_timeout_s=5)
    kube.start()
    try:
        assert kube.wait_synced(10)
        now = time.time()
        assert kube.set_phase(world.node, Phase.LENDING, "admission policy test", now)
        assert kube.fence(world.node)
        assert kube.set_pod_deletion_cost(world.ns, world.pod, -10_000)
        assert kube.set_request(world.node, "reclaim")
        assert kube.set_pin(world.node, Pin.SERVING)
        assert kube.set_pin(world.node, None)
        assert kube.set_request(world.node, None)
        assert kube.unfence(world.node)
        assert kube.set_phase(world.node, Phase.SERVING, "admission policy test", now + 1)
        refused = {k: v for k, v in kube.calls.errors().items() if k[2] in ("401", "403", "422")}
        assert refused == {}, refused
    finally:
        kube.stop()
    node = raw(k8s.CoreV1Api(world.c.api).read_node, world.node)
    assert node["metadata"]["labels"][wk.LABEL_PHASE] == "serving" and not node["spec"].get("unschedulable")
    pod = raw(k8s.CoreV1Api(world.c.api).read_namespaced_pod, world.pod, world.ns)
    assert pod["metadata"]["annotations"][wk.POD_DELETION_COST] == "-10000"
