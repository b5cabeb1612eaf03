"""Create-time defaulting and the few validations clients rely on (names, a Deployment's
selector matching its template), as the real API's defaulting and validation do."""

from __future__ import annotations

import re
from typing import Any

from gpu_bridge_lab.sandbox.kube import selectors
from gpu_bridge_lab.sandbox.kube.resources import ZERO_STATUS, Resource
from gpu_bridge_lab.sandbox.kube.store import ApiError, invalid

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _default_container(c: dict[str, Any]) -> None:
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    c.setdefault("imagePullPolicy", "IfNotPresent" if ":" in str(c.get("image", "")) and
                 not str(c.get("image", "")).endswith(":latest") else "Always")
    c.setdefault("resources", {})


def default_pod_spec(spec: dict[str, Any]) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    for c in spec.get("containers") or []:
        if isinstance(c, dict):
            _default_container(c)
    for c in spec.get("initContainers") or []:
        if isinstance(c, dict):
            _default_container(c)


def _qos(spec: dict[str, Any]) -> str:
    any_req, all_guaranteed = False, True
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if req or lim:
            any_req = True
        for k in ("cpu", "memory"):
            if k not in lim or (k in req and req[k] != lim[k]):
                all_guaranteed = False
    if not any_req:
        return "BestEffort"
    return "Guaranteed" if all_guaranteed else "Burstable"


def _check_name(r: Resource, name: str) -> None:
    pattern = _DNS1123_LABEL if r.kind in ("Namespace",) else _DNS1123_SUBDOMAIN
    if name and (len(name) > 253 or not pattern.match(name)):
        raise invalid(r, name, "metadata.name", f"Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must "
                      "consist of lower case alphanumeric characters, '-' or '.', and must start and end with an "
                      "alphanumeric character")


def _check_selector(r: Resource, obj: dict[str, Any]) -> None:
    spec = obj.get("spec") or {}
    name = obj["metadata"].get("name", "")
    sel = spec.get("selector")
    if sel is None:
        raise invalid(r, name, "spec.selector", "Required value")
    try:
        reqs = selectors.from_label_selector_object(sel)
    except selectors.SelectorError as exc:
        raise invalid(r, name, "spec.selector", str(exc)) from None
    if not reqs:
        raise invalid(r, name, "spec.selector", "Invalid value: empty selector is invalid for deployment")
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if not selectors.labels_match(reqs, labels):
        raise invalid(r, name, "spec.template.metadata.labels",
                      f"Invalid value: {labels!r}: `selector` does not match template `labels`")


def on_create(r: Resource, obj: dict[str, Any]) -> None:
    """Defaults and validation before the store assigns uid/rv."""
    meta = obj.setdefault("metadata", {})
    if r.kind in ZERO_STATUS and not obj.get("status"):
        obj["status"] = dict(ZERO_STATUS[r.kind])
    _check_name(r, meta.get("name", ""))
    if r.kind == "Pod":
        spec = obj.setdefault("spec", {})
        if not spec.get("containers"):
            raise invalid(r, meta.get("name", meta.get("generateName", "")), "spec.containers", "Required value")
        default_pod_spec(spec)
        obj["status"] = {"phase": "Pending", "qosClass": _qos(spec)}
    elif r.kind in ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet"):
        spec = obj.setdefault("spec", {})
        if r.kind != "DaemonSet":
            spec.setdefault("replicas", 1)
        if r.kind == "Deployment":
            spec.setdefault("strategy", {"type": "RollingUpdate",
                                         "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})
            spec.setdefault("revisionHistoryLimit", 10)
            spec.setdefault("progressDeadlineSeconds", 600)
        tmpl = spec.setdefault("template", {})
        default_pod_spec(tmpl.setdefault("spec", {}))
        _check_selector(r, obj)
    elif r.kind == "Node":
        obj.setdefault("spec", {})
    elif r.kind == "Event" and r.group == "":
        inv = obj.setdefault("involvedObject", {})
        # As the real apiserver: an event about a cluster-scoped object (a Node) lives in
        # "default" (or "kube-system" for new-style events with eventTime), nowhere else.
        ns = meta.get("namespace") or ""
        allowed = ("default", "kube-system") if obj.get("eventTime") else ("", "default")
        if not inv.get("namespace") and ns not in allowed:
            raise invalid(r, meta.get("name", ""), "involvedObject.namespace",
                          'Invalid value: "": does not match event.namespace')
    elif r.kind == "PodDisruptionBudget":
        spec = obj.setdefault("spec", {})
        if "minAvailable" in spec and "maxUnavailable" in spec:
            raise invalid(r, meta.get("name", ""), "spec", "Invalid value: minAvailable and maxUnavailable cannot "
                          "be both set")


def check_type(r: Resource, body: Any) -> dict[str, Any]:
    """A request body must be an object of the resource's kind (kind may be omitted)."""
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequest", "the request body must be a JSON object")
    kind = body.get("kind")
    if kind and kind != r.kind:
        raise ApiError(400, "BadRequest", f"the body is a {kind}, expected {r.kind}")
    return body
