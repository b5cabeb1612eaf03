"""Which pods of a ReplicaSet go first when it scales down, as the real controller ranks
them (pure; the controller deletes the head of the list)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


def is_ready(pod: Mapping[str, Any]) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def victim_order(pods: list[Mapping[str, Any]], all_pods: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pods of a ReplicaSet, the first to delete first (the real controller's ranking:
    unassigned < assigned; Pending < Unknown < Running; not ready < ready; lower
    pod-deletion-cost; more replicas on the same node; ready more recently; more
    restarts; newer)."""
    per_node: dict[str, int] = {}
    for p in all_pods:
        n = (p.get("spec") or {}).get("nodeName")
        if n:
            per_node[n] = per_node.get(n, 0) + 1
    phase_rank = {"Pending": 0, "Unknown": 1, "Running": 2}

    def ready_since(p: Mapping[str, Any]) -> str:
        for c in (p.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Ready" and c.get("status") == "True":
                return c.get("lastTransitionTime") or ""
        return ""

    def cost(p: Mapping[str, Any]) -> int:
        try:
            return int(((p["metadata"].get("annotations") or {}).get(DELETION_COST)) or 0)
        except ValueError:
            return 0

    def key(p: Mapping[str, Any]) -> tuple[Any, ...]:
        node = (p.get("spec") or {}).get("nodeName") or ""
        st = p.get("status") or {}
        restarts = sum(int(c.get("restartCount", 0)) for c in st.get("containerStatuses") or [])
        rs_since = ready_since(p)
        return (1 if node else 0, phase_rank.get(st.get("phase", "Pending"), 0), 1 if is_ready(p) else 0,
                cost(p), -per_node.get(node, 0) if node else 0,
                _neg_str(rs_since) if rs_since else "", -restarts, _neg_str(p["metadata"].get("creationTimestamp", "")))

    return sorted(pods, key=key)


def _neg_str(s: str) -> str:
    """Sort key reversing an ISO timestamp (newer first)."""
    return "".join(chr(0x10FFFF - ord(ch)) for ch in s)
