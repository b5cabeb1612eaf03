"""Scheduling as pure functions: what a pod requests, whether a node's taints are
tolerated, and why a pod cannot go on a node (worded like the real scheduler's reasons)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_bridge_lab.sandbox.kube import selectors
from gpu_bridge_lab.sandbox.kube.quantity import parse as parse_quantity

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def pod_requests(pod: Mapping[str, Any]) -> dict[str, float]:
    """Effective requests: sum over containers, max with each init container (as the scheduler)."""
    spec = pod.get("spec") or {}
    total: dict[str, float] = {}
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        reqs = dict(res.get("limits") or {})  # limits default requests for extended resources
        reqs.update(res.get("requests") or {})
        for k, v in reqs.items():
            total[k] = total.get(k, 0.0) + parse_quantity(v)
    for c in spec.get("initContainers") or []:
        res = c.get("resources") or {}
        reqs = dict(res.get("limits") or {})
        reqs.update(res.get("requests") or {})
        for k, v in reqs.items():
            total[k] = max(total.get(k, 0.0), parse_quantity(v))
    return total


def tolerates(tolerations: list[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator", "Equal")
        if not t.get("key"):
            if op == "Exists":
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if op == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


def _node_affinity_ok(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    aff = (((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {})
    req = aff.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not req:
        return True
    labels = node["metadata"].get("labels") or {}
    fields = {"metadata.name": node["metadata"]["name"]}
    for term in req.get("nodeSelectorTerms") or []:
        exprs = term.get("matchExpressions") or []
        fexprs = term.get("matchFields") or []
        if not exprs and not fexprs:
            continue
        try:
            if all(selectors.node_selector_requirement(e).matches(labels) for e in exprs) and \
                    all(selectors.node_selector_requirement(e).matches(fields) for e in fexprs):
                return True
        except selectors.SelectorError:
            continue
    return False


def fit_problem(pod: Mapping[str, Any], node: Mapping[str, Any], used: Mapping[str, float],
                pods_on_node: int) -> str:
    """Why a pod cannot go on a node ("" if it can), worded like the scheduler's reasons."""
    spec = pod.get("spec") or {}
    nspec = node.get("spec") or {}
    tolerations = spec.get("tolerations") or []
    if node["metadata"].get("deletionTimestamp"):
        return "node(s) were being deleted"
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") != "True" and \
                not tolerates(tolerations, {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}):
            return "node(s) had untolerated taint {node.kubernetes.io/not-ready: }"
    if nspec.get("unschedulable") and not tolerates(tolerations, {"key": UNSCHEDULABLE_TAINT,
                                                                  "effect": "NoSchedule"}):
        return "node(s) were unschedulable"
    for taint in nspec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
    labels = node["metadata"].get("labels") or {}
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return "node(s) didn't match Pod's node affinity/selector"
    if not _node_affinity_ok(pod, node):
        return "node(s) didn't match Pod's node affinity/selector"
    alloc = (node.get("status") or {}).get("allocatable") or {}
    if "pods" in alloc and pods_on_node + 1 > parse_quantity(alloc["pods"]):
        return "Too many pods"
    for k, v in pod_requests(pod).items():
        if v <= 0:
            continue
        have = parse_quantity(alloc[k]) if k in alloc else 0.0
        if used.get(k, 0.0) + v > have + 1e-9:
            return f"Insufficient {k}"
    return ""
