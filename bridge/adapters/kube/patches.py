"""Pure patch builders: current snapshot + intent -> a strategic-merge patch, or None if the
object already is as wanted (idempotent writes: no request at all).

Each patch carries the snapshot's ``metadata.resourceVersion``, so the server rejects it with
409 when the object changed since we read it (optimistic concurrency); the caller re-reads
and rebuilds.
"""

from __future__ import annotations

import re
from typing import Any

from bridge import wellknown as wk
from bridge.model import Phase, Pin, WarmRecord

from .objects import NodeInfo, PodInfo

REASON_CAP = 256
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def clean_reason(reason: str) -> str:
    """A reason as it can go into an annotation or an Event: one line, capped."""
    return _CONTROL.sub(" ", reason).strip()[:REASON_CAP]


def format_since(since: float) -> str:
    return f"{since:.3f}"


def phase_patch(node: NodeInfo, phase: Phase, reason: str, since: float, owner: str) -> dict[str, Any] | None:
    """Label phase + annotations since/reason/owner, in one patch."""
    annotations = {wk.ANNOTATION_PHASE_SINCE: format_since(since), wk.ANNOTATION_REASON: clean_reason(reason),
                   wk.ANNOTATION_OWNER: owner}
    if node.labels.get(wk.LABEL_PHASE) == phase.value and annotations.items() <= node.annotations.items():
        return None
    labels = {wk.LABEL_PHASE: phase.value}
    return {"metadata": {"resourceVersion": node.resource_version, "labels": labels, "annotations": annotations}}


def request_patch(node: NodeInfo, request: str | None) -> dict[str, Any] | None:
    """Set (or, with None, remove) an operator's lend/reclaim request on the node."""
    if node.annotations.get(wk.ANNOTATION_REQUEST) == request:
        return None
    return {"metadata": {"resourceVersion": node.resource_version, "annotations": {wk.ANNOTATION_REQUEST: request}}}


def pin_patch(node: NodeInfo, pin: Pin | None) -> dict[str, Any] | None:
    """Set (or, with None, remove) an operator's pin label."""
    value = pin.value if pin is not None else None
    if node.labels.get(wk.LABEL_PIN) == value:
        return None
    return {"metadata": {"resourceVersion": node.resource_version, "labels": {wk.LABEL_PIN: value}}}


def warm_patch(node: NodeInfo, record: WarmRecord | None) -> dict[str, Any] | None:
    """Set (or, with None, remove) warm lending's record on the node."""
    if node.warm == record and (record is not None or wk.ANNOTATION_WARM not in node.annotations):
        return None
    return {"metadata": {"resourceVersion": node.resource_version,
                         "annotations": {wk.ANNOTATION_WARM: str(record) if record is not None else None}}}


def awake_patch(pod: PodInfo, awake: bool, now: str) -> dict[str, Any] | None:
    """The readiness-gate condition (pods/status; conditions merge by type). ``now``: RFC 3339."""
    if pod.awake is awake:
        return None
    cond = {"type": wk.CONDITION_AWAKE, "status": "True" if awake else "False", "lastTransitionTime": now,
            "reason": "Awake" if awake else "AsleepLentToSlurm"}
    return {"metadata": {"resourceVersion": pod.resource_version}, "status": {"conditions": [cond]}}


def _taint_dict(key: str, value: str, effect: str) -> dict[str, str]:
    return {"key": key, "effect": effect} | ({"value": value} if value else {})


def fence_patch(node: NodeInfo) -> dict[str, Any] | None:
    """Cordon + our NoSchedule taint; other taints kept (the taints list is replaced whole).

    Records ``cordoned`` only when we are the ones setting unschedulable, so unfence never
    uncordons a node an administrator cordoned.
    """
    if node.fenced and node.unschedulable:
        return None
    patch: dict[str, Any] = {"metadata": {"resourceVersion": node.resource_version}, "spec": {}}
    if not node.unschedulable:
        patch["spec"]["unschedulable"] = True
        patch["metadata"]["annotations"] = {wk.ANNOTATION_CORDONED: "true"}
    if not node.fenced:
        taints = [_taint_dict(t.key, t.value, t.effect) for t in node.taints if t.key != wk.TAINT_KEY]
        taints.append(_taint_dict(wk.TAINT_KEY, "", wk.TAINT_EFFECT))
        patch["spec"]["taints"] = taints
    return patch


def unfence_patch(node: NodeInfo) -> dict[str, Any] | None:
    """Remove only our taint; uncordon only if our annotation says we cordoned it."""
    ours = [t for t in node.taints if t.key == wk.TAINT_KEY]
    has_mark = wk.ANNOTATION_CORDONED in node.annotations
    if not ours and not has_mark:
        return None
    patch: dict[str, Any] = {"metadata": {"resourceVersion": node.resource_version}, "spec": {}}
    if ours:
        kept = [_taint_dict(t.key, t.value, t.effect) for t in node.taints if t.key != wk.TAINT_KEY]
        patch["spec"]["taints"] = kept or None
    if has_mark:
        if node.cordoned_by_bridge and node.unschedulable:
            patch["spec"]["unschedulable"] = None
        patch["metadata"]["annotations"] = {wk.ANNOTATION_CORDONED: None}
    return patch


def deletion_cost_patch(pod: PodInfo, cost: int) -> dict[str, Any] | None:
    if pod.deletion_cost == cost and pod.problem is None:
        return None
    return {"metadata": {"resourceVersion": pod.resource_version, "annotations": {wk.POD_DELETION_COST: str(int(cost))}}}
