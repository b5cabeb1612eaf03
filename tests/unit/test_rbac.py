"""deploy/kubernetes/rbac.yaml: its shape (kinds, bindings that point at what exists), least
privilege (exact verbs per resource, no wildcards, nothing sensitive, namespaced where it can
be). (`kubectl apply --dry-run=client` needs API discovery, so no kubectl check here.)"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge import wellknown

ROOT = Path(__file__).resolve().parents[2]
RBAC = ROOT / "deploy" / "kubernetes" / "rbac.yaml"

# (role kind, role name) -> {(apiGroup, resource): verbs}
EXPECTED: dict[tuple[str, str], dict[tuple[str, str], set[str]]] = {
    ("ClusterRole", "gpu-bridge-nodes"): {
        ("", "nodes"): {"get", "list", "watch", "patch"},
    },
    ("ClusterRole", "gpu-bridge-serving"): {
        ("", "pods"): {"get", "list", "watch", "patch"},  # patch: pod-deletion-cost
        ("", "pods/eviction"): {"create"},
        ("", "pods/status"): {"patch"},  # warm lending's readiness gate
        ("apps", "deployments"): {"get", "list", "watch"},
        ("apps", "deployments/scale"): {"get", "patch", "update"},
    },
    ("Role", "gpu-bridge-events"): {
        ("", "events"): {"create", "patch"},
    },
    ("Role", "gpu-bridge-leader-election"): {
        ("coordination.k8s.io", "leases"): {"get", "create", "update"},
    },
}


def docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(RBAC.read_text()) if d]


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in docs() if d["kind"] == kind]


def test_kinds() -> None:
    kinds = sorted(d["kind"] for d in docs())
    assert kinds == sorted(
        ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "RoleBinding",
         "Role", "RoleBinding", "Role", "RoleBinding"]
    )


@pytest.mark.parametrize("key", list(EXPECTED), ids=[k[1] for k in EXPECTED])
def test_exact_verbs(key: tuple[str, str]) -> None:
    kind, name = key
    (role,) = [d for d in by_kind(kind) if d["metadata"]["name"] == name]
    got: dict[tuple[str, str], set[str]] = defaultdict(set)
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                got[(group, res)] |= set(rule["verbs"])
    assert dict(got) == EXPECTED[key]


def test_no_wildcards_or_sensitive_resources() -> None:
    for d in by_kind("ClusterRole") + by_kind("Role"):
        for rule in d["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], (d["metadata"]["name"], field)
            assert not {"secrets", "configmaps", "serviceaccounts/token", "nodes/proxy"} & set(rule["resources"])
            assert not {"delete", "deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"])


def test_lease_update_limited_to_the_bridge_lease() -> None:
    (role,) = [r for r in by_kind("Role") if r["metadata"]["name"] == "gpu-bridge-leader-election"]
    assert role["metadata"]["namespace"] == "gpu-bridge"
    for rule in role["rules"]:
        if set(rule["verbs"]) & {"get", "update"}:
            assert rule["resourceNames"] == [wellknown.LEASE_NAME]


def test_serving_permissions_are_bound_per_namespace_only() -> None:
    crbs = [b["roleRef"]["name"] for b in by_kind("ClusterRoleBinding")]
    assert crbs == ["gpu-bridge-nodes"]
    serving = [b for b in by_kind("RoleBinding") if b["roleRef"]["name"] == "gpu-bridge-serving"]
    assert serving and all(b["metadata"].get("namespace") for b in serving)


def test_events_only_where_node_events_live() -> None:
    (role,) = [r for r in by_kind("Role") if r["metadata"]["name"] == "gpu-bridge-events"]
    assert role["metadata"]["namespace"] == "default"  # bridge.adapters.kube: event_namespace="default"


def test_bindings_point_at_what_exists() -> None:
    sa = by_kind("ServiceAccount")[0]["metadata"]
    roles = {(d["kind"], d["metadata"]["name"]) for d in by_kind("ClusterRole") + by_kind("Role")}
    for b in by_kind("ClusterRoleBinding") + by_kind("RoleBinding"):
        assert (b["roleRef"]["kind"], b["roleRef"]["name"]) in roles
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}]


# --- the RBAC against the calls the code makes ---------------------------------------------
# Grants the code does not use today, kept on purpose: patch on the scale subresource and on
# events (the brief's list; a JSON-patch scale or event aggregation needs no RBAC change).
UNUSED_ON_PURPOSE = {("patch", "deployments/scale"), ("patch", "events")}


# Readers only `gpu-bridge web` uses, under its own identity: their calls are checked against
# deploy/kubernetes/web-rbac.yaml (tests/unit/test_web_rbac.py), not against the daemon's.
WEB_ONLY_FILES = frozenset({"events.py"})


def code_calls() -> set[tuple[str, str]]:
    """(verb, resource) of every Kubernetes call in the adapters and the leader election:
    ``calls.run("verb", "resource", ...)`` (or the Kubernetes adapter's ``_json("verb", "resource", ...)``),
    ``_call("verb", ...)`` on leases, and the
    informers (``_informer(name, "resource", ...)`` lists and watches)."""
    import ast

    out: set[tuple[str, str]] = set()
    files = sorted(p for p in (ROOT / "bridge" / "adapters" / "kube").glob("*.py") if p.name not in WEB_ONLY_FILES)
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            consts = [a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else None for a in node.args]
            name = node.func.attr
            if name in ("run", "_json") and len(consts) >= 2 and consts[0] and consts[1]:
                out.add((consts[0], consts[1]))
            elif name == "_call" and path.name == "lease.py" and consts and consts[0]:
                out.add((consts[0], "leases"))
            elif name == "_informer" and len(consts) >= 2 and consts[1]:
                out |= {("list", consts[1]), ("watch", consts[1])}
    return out


def granted() -> set[tuple[str, str]]:
    return {
        (verb, res)
        for d in by_kind("ClusterRole") + by_kind("Role")
        for rule in d["rules"]
        for res in rule["resources"]
        for verb in rule["verbs"]
    }


def test_every_call_the_code_makes_is_granted() -> None:
    calls = code_calls()
    assert ("patch", "nodes") in calls and ("create", "pods/eviction") in calls  # the scan sees the adapter
    missing = calls - granted()
    assert not missing, f"the code calls {sorted(missing)} but rbac.yaml does not grant it"


def test_nothing_granted_that_the_code_does_not_use() -> None:
    unused = granted() - code_calls() - UNUSED_ON_PURPOSE
    assert not unused, f"rbac.yaml grants {sorted(unused)} that no code calls (least privilege)"
