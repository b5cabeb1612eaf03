"""The RBAC manifest grants exactly what the daemon calls, checked from the wire: every
Kubernetes request the adapter and the leader election send to an in-process sandbox API
server is recorded (method, path, query), turned into (apiGroup, resource, verb, namespace,
name) as the apiserver's authorizer sees it, and compared with deploy/kubernetes/rbac.yaml
both ways, scopes included (namespaced grants only where bound, resourceNames honoured).

tests/unit/test_rbac.py checks the manifest's shape and scans the code's call sites; this one
watches what actually goes over the wire when every write is exercised."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge import wellknown as wk
from bridge.adapters.kube import KubeAdapter, PoolTarget, api_client_from_config
from bridge.leader import LeaderElector
from bridge.model import Phase
from gpu_bridge_lab.sandbox.kube import KubeServer, ServingModel, seed_serving, wait_serving_ready
from gpu_bridge_lab.sandbox.kube import resources as R

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
    def __init__(self, server: KubeServer) -> None:
        self.calls: list[Call] = []
        self.other: list[str] = []
        self._route = server.route
        server.route = self.route  # type: ignore[method-assign]

    def route(self, req: Any) -> Any:
        c = to_call(req.method, req.path, dict(req.query))
        if c is None:
            self.other.append(f"{req.method} {req.path}")
        else:
            self.calls.append(c)
        return self._route(req)


@pytest.fixture(scope="module")
def exercised(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Call], list[str]]]:
    """Every read and write of the Kubernetes adapter and the leader election, once."""
    tmp = tmp_path_factory.mktemp("rbac")
    model = ServingModel(nodes=3, namespace=SERVING_NS, termination_grace_s=1)
    with KubeServer(port=0, pod_start_delay_s=0.05, pod_stop_s=0.1) as server:
        seed_serving(server.store, model, spare_nodes=1)
        server.store.create(R.core("namespaces"), {"metadata": {"name": "gpu-bridge"}})
        # objects the daemon does not watch, to exercise the cache-miss GETs
        server.store.create(R.core("nodes"), {"metadata": {"name": "outside-node", "labels": {}}})
        server.store.create(R.core("pods"), {"metadata": {"name": "outside-pod", "namespace": SERVING_NS},
                                             "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
        assert wait_serving_ready(server.store, model, 30)
        rec = Recorder(server)
        kubeconfig = server.write_kubeconfig(tmp / "kubeconfig")
        api = api_client_from_config(kubeconfig=str(kubeconfig))
        kube = KubeAdapter(api, pools=[PoolTarget("default", SERVING_NS, model.deployment)], identity="rbac-test",
                           watch_timeout_s=5)
        leader = LeaderElector(api, namespace="gpu-bridge", identity="rbac-test", name=wk.LEASE_NAME,
                               lease_duration_s=15, retry_period_s=0.01)
        try:
            kube.start()
            assert kube.wait_synced(10)
            node = kube.nodes()[0].name
            pods = sorted(kube.pods("default"), key=lambda p: p.name)
            now = time.time()
            assert kube.set_phase(node, Phase.LENDING, "rbac test", now)
            assert kube.fence(node)
            assert kube.unfence(node)
            assert kube.set_pod_deletion_cost(SERVING_NS, pods[0].name, -10_000)
            kube.read_scale(SERVING_NS, model.deployment)
            assert kube.scale(SERVING_NS, model.deployment, 2)
            kube.evict(SERVING_NS, pods[1].name)
            kube.emit_event(node, "GpuBridgeLending", "rbac test")
            assert kube.fence("outside-node")  # not in the cache: GET nodes first
            assert kube.set_pod_deletion_cost(SERVING_NS, "outside-pod", 5)  # not in the cache: GET pods first
            assert leader.try_acquire_or_renew()
            time.sleep(0.02)
            assert leader.try_acquire_or_renew()  # renew: update
            assert leader.release()
        finally:
            kube.stop()
            api.close()
        yield rec.calls, rec.other


def test_the_exercise_covers_every_call_kind(exercised: tuple[list[Call], list[str]]) -> None:
    kinds = {(c.group, c.resource, c.verb) for c in exercised[0]}
    for want in [("", "nodes", "list"), ("", "nodes", "watch"), ("", "nodes", "patch"), ("", "nodes", "get"),
                 ("", "pods", "list"), ("", "pods", "watch"), ("", "pods", "patch"), ("", "pods", "get"), ("", "pods/eviction", "create"),
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
