"""The RBAC manifest grants exactly what the daemon calls, checked from the wire: every
Kubernetes request the adapter and the leader election send to the real control plane
(``kube_plane``), authenticated as the daemon's ServiceAccount with exactly
deploy/kubernetes/rbac.yaml (so the real authorizer refuses anything not granted), is
recorded as it leaves the client (method, path, query), turned into (apiGroup, resource,
verb, namespace, name) as the apiserver's authorizer sees it, and compared with the manifest
both ways, scopes included (namespaced grants only where bound, resourceNames honoured).

tests/unit/test_rbac.py checks the manifest's shape and scans the code's call sites; this one
watches what actually goes over the wire when every write is exercised."""

from __future__ import annotations

import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge import wellknown as wk
from bridge.adapters.kube.client import KubeAdapter, api_client_from_config
from bridge.adapters.protocols import PoolTarget
from bridge.adapters.kube.lease import LeaderElector
from bridge.model import Phase
from gpu_bridge_lab.sandbox.realkube.component import RBAC_MANIFEST, apply_rbac
from gpu_bridge_lab.sandbox.realkube.serving_model import ServingModel, seed_serving, wait_serving_ready

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RBAC = ROOT / "deploy" / "kubernetes" / "rbac.yaml"
SERVING_NS = "llm-serving"  # the namespace rbac.yaml's example RoleBinding is for
# Grants kept although no call uses them (see tests/unit/test_rbac.py UNUSED_ON_PURPOSE).
UNUSED_ON_PURPOSE = {("apps", "deployments/scale", "patch"), ("", "events", "patch")}


@dataclass(frozen=True)
class Call:
    group: str
    resource: str  # "pods/eviction" for a subresource
    verb: str
    namespace: str  # "" = cluster-scoped
    name: str


def to_call(method: str, path: str, query: dict[str, str]) -> Call | None:
    """An HTTP request -> what RBAC authorizes (None for non-resource URLs like /version)."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    watch = query.get("watch") in ("true", "1")
    if rest[:1] == ["watch"]:
        watch, rest = True, rest[1:]
    if not rest:
        return None
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    resource, name, sub = rest[0], rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else ""
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete" if name else "deletecollection"}.get(method)
    if method == "GET":
        verb = "get" if name else ("watch" if watch else "list")
    assert verb, (method, path)
    if method == "POST" and not sub:
        name = ""  # create: the authorizer sees no name
    return Call(group, f"{resource}/{sub}" if sub else resource, verb, namespace, name)


@dataclass(frozen=True)
class Grant:
    group: str
    resource: str
    verb: str
    namespaces: frozenset[str] | None  # None = every namespace (and cluster-scoped objects)
    names: frozenset[str] | None  # None = any name

    def allows(self, c: Call) -> bool:
        if (self.group, self.resource, self.verb) != (c.group, c.resource, c.verb):
            return False
        if self.namespaces is not None and c.namespace not in self.namespaces:
            return False
        return self.names is None or (bool(c.name) and c.name in self.names)


def grants() -> list[Grant]:
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    roles = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d
             for d in docs if d["kind"] in ("Role", "ClusterRole")}
    out: list[Grant] = []
    for b in docs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ref = b["roleRef"]
        role_ns = b["metadata"].get("namespace", "") if ref["kind"] == "Role" else ""
        role = roles[(ref["kind"], role_ns, ref["name"])]
        scope = None if b["kind"] == "ClusterRoleBinding" else frozenset({b["metadata"]["namespace"]})
        for rule in role["rules"]:
            names = frozenset(rule["resourceNames"]) if rule.get("resourceNames") else None
            for g in rule["apiGroups"]:
                for res in rule["resources"]:
                    for verb in rule["verbs"]:
                        out.append(Grant(g, res, verb, scope, names))
    return out


class Recorder:
    """Records every request the client sends (its RESTClientObject, under every API call,
    the adapter's raw JSON writes included)."""

    def __init__(self, api: Any) -> None:
        self.calls: list[Call] = []
        self.other: list[str] = []
        rest = api.rest_client
        self._request = rest.request
        rest.request = self.request

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        u = urllib.parse.urlsplit(url)
        c = to_call(method, u.path, dict(urllib.parse.parse_qsl(u.query)))
        if c is None:
            self.other.append(f"{method} {u.path}")
        else:
            self.calls.append(c)
        return self._request(method, url, *args, **kwargs)


@pytest.fixture(scope="module")
def exercised(kube_plane: Any) -> Iterator[tuple[list[Call], list[str]]]:
    """Every read and write of the Kubernetes adapter and the leader election, once, as the
    daemon's ServiceAccount."""
    from kubernetes import client as k8s

    prefix = "r" + uuid.uuid4().hex[:6]
    model = ServingModel(nodes=3, namespace=SERVING_NS, pool=f"{prefix}-pool", node_prefix=f"{prefix}-gpu-node-",
                         termination_grace_s=1)
    admin = api_client_from_config(kubeconfig=str(kube_plane.kubeconfig))
    core = k8s.CoreV1Api(admin)
    outside_node = f"{prefix}-outside-node"
    try:
        seed_serving(admin, model, spare_nodes=1)
        apply_rbac(admin, RBAC_MANIFEST, serving_namespaces=[SERVING_NS])  # the RoleBinding for llm-serving
        # objects the daemon does not watch, to exercise the cache-miss GETs (the node in
        # another pool: admission-policy.yaml lets the daemon write pool nodes only)
        core.create_node({"metadata": {"name": outside_node, "labels": {wk.LABEL_POOL: f"{prefix}-other-pool"}}},
                         _preload_content=False)
        core.create_namespaced_pod(SERVING_NS, {"metadata": {"name": "outside-pod"},
                                                "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
                                   _preload_content=False)
        assert wait_serving_ready(admin, model, 60)
        api = api_client_from_config(kubeconfig=str(kube_plane.daemon_kubeconfig))
        rec = Recorder(api)
        kube = KubeAdapter(api, pools=[PoolTarget(model.pool, SERVING_NS, model.deployment)], identity="rbac-test",
                           watch_timeout_s=5)
        leader = LeaderElector(api, namespace="gpu-bridge", identity="rbac-test", name=wk.LEASE_NAME,
                               lease_duration_s=15, retry_period_s=0.01)
        try:
            kube.start()
            assert kube.wait_synced(10)
            node = kube.nodes()[0].name
            pods = sorted(kube.pods(model.pool), key=lambda p: p.name)
            now = time.time()
            assert kube.set_phase(node, Phase.LENDING, "rbac test", now)
            assert kube.fence(node)
            assert kube.unfence(node)
            assert kube.set_pod_deletion_cost(SERVING_NS, pods[0].name, -10_000)
            # warm lending's readiness gate: pods/status, the condition merged by type (Ready kept)
            assert kube.set_pod_awake(SERVING_NS, pods[0].name, False)
            conds = {c.type: c.status for c in core.read_namespaced_pod_status(pods[0].name, SERVING_NS).status.conditions}
            assert conds[wk.CONDITION_AWAKE] == "False" and "Ready" in conds, conds
            kube.read_scale(SERVING_NS, model.deployment)
            assert kube.scale(SERVING_NS, model.deployment, 2)
            kube.evict(SERVING_NS, pods[1].name)
            kube.emit_event(node, "GpuBridgeLending", "rbac test")
            assert kube.fence(outside_node)  # not in the cache: GET nodes first
            assert kube.set_pod_deletion_cost(SERVING_NS, "outside-pod", 5)  # not in the cache: GET pods first
            assert leader.try_acquire_or_renew()
            time.sleep(0.02)
            assert leader.try_acquire_or_renew()  # renew: update
            assert leader.release()
            # nothing refused by the authorizer on the way (a 409 is a node written meanwhile by
            # kwok or the node lifecycle controller: re-read and retried)
            refused = {k: v for k, v in kube.calls.errors().items() if k[2] in ("401", "403")}
            assert refused == {}, refused
        finally:
            kube.stop()
            api.close()
        yield rec.calls, rec.other
    finally:
        for n in [*model.node_names(1), outside_node]:
            try:
                core.delete_node(n, _preload_content=False)
            except Exception:  # noqa: BLE001 - cleanup is best effort
                pass
        try:
            core.delete_namespace(SERVING_NS, _preload_content=False)
        except Exception:  # noqa: BLE001
            pass
        admin.close()


def test_the_exercise_covers_every_call_kind(exercised: tuple[list[Call], list[str]]) -> None:
    kinds = {(c.group, c.resource, c.verb) for c in exercised[0]}
    for want in [("", "nodes", "list"), ("", "nodes", "watch"), ("", "nodes", "patch"), ("", "nodes", "get"),
                 ("", "pods", "list"), ("", "pods", "watch"), ("", "pods", "patch"), ("", "pods", "get"), ("", "pods/eviction", "create"),
                 ("", "pods/status", "patch"),
                 ("apps", "deployments", "get"), ("apps", "deployments", "list"), ("apps", "deployments", "watch"),
                 ("apps", "deployments/scale", "get"), ("apps", "deployments/scale", "update"), ("", "events", "create"),
                 ("coordination.k8s.io", "leases", "get"), ("coordination.k8s.io", "leases", "create"),
                 ("coordination.k8s.io", "leases", "update")]:
        assert want in kinds, f"{want} not exercised; got {sorted(kinds)}"


def test_every_call_on_the_wire_is_granted(exercised: tuple[list[Call], list[str]]) -> None:
    gs = grants()
    denied = sorted({c for c in exercised[0] if not any(g.allows(c) for g in gs)}, key=str)
    assert not denied, "rbac.yaml would deny:\n" + "\n".join(map(str, denied))


def test_nothing_granted_that_the_wire_does_not_use(exercised: tuple[list[Call], list[str]]) -> None:
    used = {(c.group, c.resource, c.verb) for c in exercised[0]}
    unused = sorted({(g.group, g.resource, g.verb) for g in grants()} - used - UNUSED_ON_PURPOSE)
    assert not unused, f"rbac.yaml grants {unused}, which the daemon never calls (least privilege)"


def test_scopes_are_as_narrow_as_the_calls(exercised: tuple[list[Call], list[str]]) -> None:
    calls = exercised[0]
    assert {c.namespace for c in calls if c.resource == "events"} == {"default"}
    assert {c.namespace for c in calls if c.group == "coordination.k8s.io"} == {"gpu-bridge"}
    assert {c.name for c in calls if c.group == "coordination.k8s.io" and c.verb != "create"} == {wk.LEASE_NAME}
    assert {c.namespace for c in calls if c.resource.startswith(("pods", "deployments"))} == {SERVING_NS}
    assert all(c.namespace == "" for c in calls if c.resource == "nodes")
    for g in grants():  # only nodes are granted cluster-wide
        assert g.namespaces is not None or g.resource == "nodes", g


def test_no_delete_and_no_non_resource_urls(exercised: tuple[list[Call], list[str]]) -> None:
    calls, other = exercised
    assert not [c for c in calls if c.verb in ("delete", "deletecollection")]
    assert other == [], f"non-resource requests (need system:discovery): {other}"
