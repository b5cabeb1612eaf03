"""deploy/kubernetes/web-rbac.yaml: gpu-bridge web's own identity reads and never writes.
Exact verbs per resource, no write verb anywhere, nothing sensitive, namespaced where it can
be, and every binding points at this manifest's own ServiceAccount (never the daemon's)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
WEB_RBAC = ROOT / "deploy" / "kubernetes" / "web-rbac.yaml"
READ_VERBS = {"get", "list", "watch"}

EXPECTED: dict[tuple[str, str], dict[tuple[str, str], set[str]]] = {
    ("ClusterRole", "gpu-bridge-web-nodes"): {("", "nodes"): {"get", "list", "watch"}},
    ("ClusterRole", "gpu-bridge-web-serving"): {("", "pods"): {"get", "list", "watch"},
                                                ("apps", "deployments"): {"get", "list", "watch"}},
    ("Role", "gpu-bridge-web-events"): {("", "events"): {"list"}},
}


def docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(WEB_RBAC.read_text()) if d]


def test_exact_verbs_and_read_only() -> None:
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs() if d["kind"] in ("Role", "ClusterRole")}
    assert set(roles) == set(EXPECTED)
    for key, want in EXPECTED.items():
        got: dict[tuple[str, str], set[str]] = defaultdict(set)
        for rule in roles[key]["rules"]:
            assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"]
            assert set(rule["verbs"]) <= READ_VERBS, (key, rule)
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    got[(g, r)] |= set(rule["verbs"])
        assert dict(got) == want


def test_bindings_name_only_the_web_service_account() -> None:
    bindings = [d for d in docs() if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert len(bindings) == 3
    for b in bindings:
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-bridge-web", "namespace": "gpu-bridge"}]
        assert b["roleRef"]["name"].startswith("gpu-bridge-web-")
    scopes = {b["metadata"]["name"]: (b["kind"], b["metadata"].get("namespace")) for b in bindings}
    assert scopes == {"gpu-bridge-web-nodes": ("ClusterRoleBinding", None),
                      "gpu-bridge-web-serving": ("RoleBinding", "llm-serving"),
                      "gpu-bridge-web-events": ("RoleBinding", "default")}
    (sa,) = [d for d in docs() if d["kind"] == "ServiceAccount"]
    assert sa["automountServiceAccountToken"] is False


def test_every_call_the_web_view_makes_is_granted() -> None:
    """The web view's Kubernetes calls: the KubeAdapter's watches (nodes, pods, deployments:
    ``status``'s observation reads only its caches) and the node-Event reader
    (bridge/adapters/kube/events.py)."""
    from tests.unit.test_rbac import WEB_ONLY_FILES

    import ast

    calls: set[tuple[str, str]] = set()
    for name in ("client.py", *WEB_ONLY_FILES):
        for node in ast.walk(ast.parse((ROOT / "bridge" / "adapters" / "kube" / name).read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                consts = [a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else None for a in node.args]
                if node.func.attr == "run" and name in WEB_ONLY_FILES and len(consts) >= 2 and consts[0] and consts[1]:
                    calls.add((consts[0], consts[1]))
                elif node.func.attr == "_informer" and len(consts) >= 2 and consts[1]:
                    calls |= {("list", consts[1]), ("watch", consts[1])}
    assert ("list", "events") in calls and ("watch", "nodes") in calls  # the scan sees both
    granted = {(v, r) for d in docs() if d["kind"] in ("Role", "ClusterRole") for rule in d["rules"]
               for r in rule["resources"] for v in rule["verbs"]}
    assert calls <= granted, f"web-rbac.yaml does not grant {sorted(calls - granted)}"
